//! A session's OpenCL state: its objects, its staging pool, the completion thread that answers
//! reads and waits, its user events and the error deferred from a request without a reply.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use rgpu_cl_api::{error_name, sys};
use rgpu_protocol::opencl::Id;

use crate::limits::Usage;
use crate::opencl::completion::Completion;
use crate::opencl::handles::Handles;
use crate::opencl::inventory::{Inventory, ServedDevice};
use crate::opencl::native::{Cl, ClResult, Event, Waker};
use crate::opencl::staging::{StagingPool, CHUNK_SIZE, POOL_BUFFERS};
use crate::writer::Writer;

/// The status given to user events a client left unset when its session ends, so that
/// commands waiting on them terminate instead of holding the device forever.
const ABANDONED: i32 = sys::CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST;

pub(crate) struct ClSession {
    pub(crate) inventory: Arc<Inventory>,
    pub(crate) handles: Handles,
    /// `None` only while closing.
    completion: Option<Completion>,
    pub(crate) waker: Waker,
    pub(crate) pool: StagingPool,
    /// The first error of a fire-and-forget request since the last synchronizing reply.
    pub(crate) deferred: Option<i32>,
    /// Every user event the session made, even those the client released, so that cleanup can
    /// end the ones it never set.
    pub(crate) user_events: Vec<Event>,
    /// User events not yet given a status: while there are any, device work may wait on the
    /// client, so the completion thread must not block on it.
    pub(crate) pending_user_events: Arc<AtomicUsize>,
    /// Commands' events the client holds whose final status it has not been told.
    pub(crate) unreported: Unreported,
    /// In a session moved here from another server: (the client's id, the served device's
    /// id) for each device, the client keeping the ids the other server gave (`AliasDevices`).
    /// Empty: the client uses this server's ids.
    pub(crate) device_aliases: Vec<(Id, Id)>,
}

/// Events of commands whose final status the client has not been told. A `Finish` or
/// `WaitForEvents` reply is preceded by the final statuses of those that ended (an
/// `EventsFinal` frame), so that the client answers later queries of them itself.
#[derive(Clone, Default)]
pub(crate) struct Unreported(Arc<std::sync::Mutex<std::collections::VecDeque<(Id, Event)>>>);

impl Unreported {
    /// The most events kept; beyond it the oldest are dropped (their queries then ask).
    const MOST: usize = 1 << 16;

    pub(crate) fn add(&self, id: Id, event: &Event) {
        let mut events = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if events.len() >= Self::MOST {
            events.pop_front();
        }
        events.push_back((id, event.clone()));
    }

    /// The frame that tells the client the final statuses reached since the last one (`None`:
    /// none reached); those events are forgotten.
    pub(crate) fn take_final(&self) -> Option<rgpu_protocol::ServerMsg> {
        let mut events = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let (mut ids, mut statuses) = (Vec::new(), Vec::new());
        events.retain(|(id, event)| match event.status() {
            Ok(status) if status > sys::CL_COMPLETE => true,
            // Final (complete or failed), or unreadable: tell what is known, keep nothing.
            Ok(status) => {
                ids.push(*id);
                statuses.push(status);
                false
            }
            Err(_) => false,
        });
        (!ids.is_empty()).then_some(rgpu_protocol::ServerMsg::EventsFinal {
            events: ids,
            statuses,
        })
    }
}

impl ClSession {
    pub(crate) fn new(
        id: u64,
        inventory: Arc<Inventory>,
        writer: &Arc<Writer>,
        usage: Arc<Usage>,
    ) -> ClSession {
        let pending_user_events = Arc::new(AtomicUsize::new(0));
        let pool = StagingPool::for_session(
            CHUNK_SIZE,
            POOL_BUFFERS,
            pending_user_events.clone(),
            usage.clone(),
        );
        let unreported = Unreported::default();
        let completion = Completion::start(
            id,
            writer.clone(),
            pending_user_events.clone(),
            unreported.clone(),
        );
        ClSession {
            inventory,
            handles: Handles::new(usage),
            waker: completion.waker(),
            completion: Some(completion),
            pool,
            deferred: None,
            user_events: Vec::new(),
            pending_user_events,
            device_aliases: Vec::new(),
            unreported,
        }
    }

    /// Keeps `native` as the client's event `id` of a command it queued; its final status
    /// reaches the client with the next `Finish` or `WaitForEvents` that follows it. (Reads'
    /// events are kept plainly: the client completes those itself.)
    pub(crate) fn keep_command_event(&mut self, id: Id, native: Event) -> ClResult<()> {
        self.unreported.add(id, &native);
        self.handles.events.insert(id, native)
    }

    /// The machine's OpenCL, if it has one.
    pub(crate) fn library(&self) -> ClResult<&Cl> {
        self.inventory
            .cl
            .as_ref()
            .ok_or(sys::CL_DEVICE_NOT_AVAILABLE)
    }

    pub(crate) fn completion(&self) -> &Completion {
        self.completion
            .as_ref()
            .expect("the completion thread lives until the session closes")
    }

    /// The deferred error, if any, which is then reported and cleared.
    pub(crate) fn take_deferred(&mut self) -> Option<i32> {
        self.deferred.take()
    }

    /// Binds `event_id` (if the client asked for an event) to a user event that has already
    /// failed with `status`, so that commands waiting on it fail as OpenCL specifies.
    pub(crate) fn fail_event(&mut self, event_id: Id, queue: Option<Id>, status: i32) {
        if event_id == 0 || self.handles.events.check_free(event_id).is_err() {
            return;
        }
        let from_queue = queue
            .and_then(|q| self.handles.queues.get(q).ok())
            .map(|q| q.queue.failed_event(status));
        let event = match from_queue {
            Some(Ok(event)) => Some(event),
            _ => self.handles.contexts.values().next().and_then(|context| {
                let event = context.create_user_event().ok()?;
                event.set_user_status(status.min(-1)).ok()?;
                Some(event)
            }),
        };
        if let Some(event) = event {
            let _ = self.handles.events.insert(event_id, event);
        }
    }

    /// Whether device work may be waiting for something only a later client request brings
    /// (a user event's status). Only then must waits leave the request thread free.
    pub(crate) fn device_may_wait_for_client(&self) -> bool {
        self.pending_user_events.load(Ordering::SeqCst) != 0
    }

    /// At the session's end: ends the user events the client never set, waits for every
    /// queue's work and stops the completion thread (which sends what it still has).
    pub(crate) fn finish_work(&mut self, session: u64) {
        for event in &self.user_events {
            if event.status().is_ok_and(|s| s > sys::CL_COMPLETE) {
                let _ = event.set_user_status(ABANDONED);
            }
        }
        for entry in self.handles.queues.values() {
            if let Err(e) = entry.queue.finish() {
                log::debug!("session {session}: clFinish at close: {}", error_name(e));
            }
        }
        if let Some(completion) = self.completion.take() {
            completion.shutdown();
        }
    }

    /// Releases every object the session holds.
    pub(crate) fn release_all(&mut self) {
        self.handles.release_all();
        self.user_events.clear();
    }
}

impl ClSession {
    /// The served device the client's device id names (through the session's aliases, if
    /// it has any).
    pub(crate) fn device(&self, id: Id) -> Option<&ServedDevice> {
        let served = match self.device_aliases.is_empty() {
            true => id,
            false => self
                .device_aliases
                .iter()
                .find(|(alias, _)| *alias == id)
                .map(|(_, served)| *served)?,
        };
        self.inventory.device(served)
    }

    /// The client's id for the served device `served` (0 for none).
    pub(crate) fn client_device_id(&self, served: Id) -> Id {
        match self.device_aliases.is_empty() {
            true => served,
            false => self
                .device_aliases
                .iter()
                .find(|(_, s)| *s == served)
                .map_or(0, |(alias, _)| *alias),
        }
    }
}
