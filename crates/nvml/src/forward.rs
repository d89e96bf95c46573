//! The NVML getters answered by the device's server's own NVML: every function of the
//! forwarding table (crates/protocol/data/nvml-forwarded.txt) that `api/` does not implement
//! by hand. The generated export passes its C arguments here as numbers; the table's shapes
//! say which are values, which point to buffers (whose bytes travel both ways) and which are
//! the devices. One round trip per call.
//!
//! A pair query over devices of two servers of one machine (their inventories name the same
//! host) goes to the first device's server, naming the peer by UUID: its NVML sees every GPU
//! of the machine. Over devices of two machines it is answered here: no peer-to-peer path,
//! and the furthest topology level.

use rgpu_protocol::nvml::{
    forwarded, NvmlArg, NvmlQuery, Param, FORWARD_MAX_BYTES, FORWARD_MAX_TEXT,
};

use crate::devices::{self, Device};
use crate::types::*;

/// `NVML_P2P_STATUS_NOT_SUPPORTED` and `NVML_TOPOLOGY_SYSTEM`.
const P2P_STATUS_NOT_SUPPORTED: u32 = 5;
const TOPOLOGY_SYSTEM: u32 = 50;

/// Calls `function` (of the forwarding table) with the caller's C arguments `raw`.
///
/// # Safety
/// `raw` holds the caller's arguments of `function`, in order, each pointer null or valid as
/// nvml.h's contract for `function` has it.
pub unsafe fn forward(function: &'static str, raw: &[u64]) -> nvmlReturn_t {
    // SAFETY: the caller's contract.
    match unsafe { try_forward(function, raw) } {
        Ok(()) => NVML_SUCCESS,
        Err(error) => error,
    }
}

/// Where an argument's bytes go back after the call: `len` bytes at `to`.
struct WriteBack {
    to: *mut u8,
    len: usize,
}

/// # Safety
/// As [`forward`].
unsafe fn try_forward(function: &'static str, raw: &[u64]) -> Result<(), nvmlReturn_t> {
    let params = forwarded(function).ok_or(NVML_ERROR_NOT_SUPPORTED)?;
    let list = devices::devices()?;
    let mut raw = raw.iter().copied();
    let mut next = || raw.next().ok_or(NVML_ERROR_INVALID_ARGUMENT);
    let (mut device, mut peer) = (None::<&Device>, None::<&Device>);
    let mut args = Vec::new();
    let mut back: Vec<Option<WriteBack>> = Vec::new();
    for param in params {
        match *param {
            Param::Device => device = Some(list.by_handle(next()? as nvmlDevice_t)?),
            Param::Peer => peer = Some(list.by_handle(next()? as nvmlDevice_t)?),
            Param::U32 | Param::U64 => {
                args.push(NvmlArg::Value(next()?));
                back.push(None);
            }
            Param::Out(size) => {
                let to = next()? as *mut u8;
                // SAFETY: `to` points to the parameter's type, `size` bytes (nvml.h's
                // contract; the table's size is that type's).
                args.push(unsafe { bytes_at(to, size) });
                back.push(Some(WriteBack { to, len: size }));
            }
            Param::Text => {
                let (to, length) = (next()? as *mut u8, next()? as u32 as usize);
                let len = length.min(FORWARD_MAX_TEXT);
                args.push(match to.is_null() {
                    true => NvmlArg::Null,
                    false => NvmlArg::Bytes(vec![0; len]),
                });
                back.push(Some(WriteBack { to, len }));
            }
            Param::Counted(item) => {
                let (count, array) = (next()? as *mut u32, next()? as *mut u8);
                // The capacity the caller gives, bounded by what one query may carry.
                let capacity = match count.is_null() {
                    true => 0,
                    // SAFETY: a non-null count pointer is readable (nvml.h's contract).
                    false => (unsafe { count.read_unaligned() }) as usize,
                }
                .min(FORWARD_MAX_BYTES / item);
                args.push(match count.is_null() {
                    true => NvmlArg::Null,
                    false => NvmlArg::Bytes((capacity as u32).to_le_bytes().to_vec()),
                });
                back.push(Some(WriteBack {
                    to: count.cast(),
                    len: 4,
                }));
                let present = !count.is_null() && !array.is_null();
                args.push(match present {
                    true => NvmlArg::Bytes(vec![0; capacity * item]),
                    false => NvmlArg::Null,
                });
                back.push(Some(WriteBack {
                    to: array,
                    len: capacity * item,
                }));
            }
            Param::Sized(item) => {
                let (count, array) = (next()? as u32 as usize, next()? as *mut u8);
                let len = count.checked_mul(item).ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
                if len > FORWARD_MAX_BYTES {
                    return Err(NVML_ERROR_INVALID_ARGUMENT);
                }
                // SAFETY: `array` holds `count` items (nvml.h's contract).
                args.push(unsafe { bytes_at(array, len) });
                back.push(Some(WriteBack { to: array, len }));
            }
        }
    }
    // GPUs of servers on two machines share nothing; of two servers on one machine, the
    // first's server asks its NVML, which sees both (and answers as between machines when
    // it cannot: a container that holds only its own GPU).
    let other_server = match (device, peer) {
        (Some(device), Some(peer)) if !device.same_server(peer) => {
            if !device.same_host(peer) {
                // SAFETY: the caller's contract (a pair query's last argument is its answer).
                return unsafe { between_servers(function, &back) };
            }
            true
        }
        _ => false,
    };
    // A system query asks the first device's server, whose versions the library reports.
    let target = device
        .or(list.list.first())
        .ok_or(NVML_ERROR_NOT_SUPPORTED)?;
    let query = NvmlQuery {
        function: function.into(),
        device: 0,
        peer: 0,
        args,
        peer_uuid: None,
    };
    let answer = target.forward(query, peer)?;
    if other_server && answer.ret != NVML_SUCCESS {
        // SAFETY: as above.
        return unsafe { between_servers(function, &back) };
    }
    for (back, bytes) in back.iter().zip(&answer.bytes) {
        if let Some(WriteBack { to, len }) = *back {
            if !to.is_null() && !bytes.is_empty() {
                // SAFETY: `to` holds `len` bytes (nvml.h's contract, as read above); the
                // answer's bytes are ours.
                unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), to, bytes.len().min(len)) };
            }
        }
    }
    match answer.ret {
        NVML_SUCCESS => Ok(()),
        error => Err(error),
    }
}

/// The bytes at `at` (`len` of them), or `Null`.
///
/// # Safety
/// `at` must be null or readable for `len` bytes.
unsafe fn bytes_at(at: *const u8, len: usize) -> NvmlArg {
    if at.is_null() {
        return NvmlArg::Null;
    }
    // SAFETY: the caller's contract.
    NvmlArg::Bytes(unsafe { std::slice::from_raw_parts(at, len) }.to_vec())
}

/// A pair query over devices of two servers.
///
/// # Safety
/// Each write-back's pointer is null or writable for its length.
unsafe fn between_servers(function: &str, back: &[Option<WriteBack>]) -> Result<(), nvmlReturn_t> {
    let value = match function {
        "nvmlDeviceGetP2PStatus" => P2P_STATUS_NOT_SUPPORTED,
        "nvmlDeviceGetTopologyCommonAncestor" => TOPOLOGY_SYSTEM,
        "nvmlDeviceOnSameBoard" => 0,
        _ => return Err(NVML_ERROR_NOT_SUPPORTED),
    };
    match back.last() {
        Some(Some(WriteBack { to, len: 4 })) if !to.is_null() => {
            // SAFETY: the caller's contract: a 4-byte answer.
            unsafe { to.cast::<u32>().write_unaligned(value) };
            Ok(())
        }
        _ => Err(NVML_ERROR_INVALID_ARGUMENT),
    }
}
