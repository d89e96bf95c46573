//! A session moving here from another server (docs/migration.md): the client replays its
//! objects under the ids it already uses, and keeps naming devices by the other server's ids.

use rgpu_cl_api::sys;
use rgpu_protocol::opencl::{serve, Answer, Id};

use crate::session::Session;

impl serve::Migration for Session {
    fn alias_devices(&mut self, aliases: Vec<(Id, Id)>) -> Answer<()> {
        // Only as the session's first word on devices: objects made before would be on
        // devices named the other way.
        if !self.cl.device_aliases.is_empty() || self.cl.handles.contexts.iter().next().is_some() {
            return Err(sys::CL_INVALID_OPERATION);
        }
        let served = |id| self.cl.inventory.device(id).is_some();
        let mut seen = Vec::with_capacity(aliases.len());
        for &(alias, device) in &aliases {
            if alias == 0 || !served(device) || seen.contains(&alias) {
                return Err(sys::CL_INVALID_DEVICE);
            }
            seen.push(alias);
        }
        self.cl.device_aliases = aliases;
        Ok(())
    }
}
