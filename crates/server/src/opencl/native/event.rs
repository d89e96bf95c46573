//! Events, and the host memory of commands in flight.

use super::*;

type EventCallback = Box<dyn FnOnce(i32) + Send>;

/// Called by the OpenCL implementation for a callback registered in [`Event::on_status`].
unsafe extern "C" fn event_trampoline(_event: cl_event, status: cl_int, user_data: *mut c_void) {
    // SAFETY: `user_data` is the Box<EventCallback> leaked by on_status, and the
    // implementation calls each registered callback exactly once, so it is reclaimed once.
    let callback = unsafe { Box::from_raw(user_data.cast::<EventCallback>()) };
    // A panic must not unwind into the C caller.
    let _ = std::panic::catch_unwind(AssertUnwindSafe(move || callback(status)));
}

impl Event {
    info_query! {
        info => clGetEventInfo
    }

    info_query! {
        profiling_info => clGetEventProfilingInfo
    }

    /// CL_EVENT_COMMAND_EXECUTION_STATUS (CL_COMPLETE = 0, negative when it failed).
    pub fn status(&self) -> ClResult<i32> {
        let bytes = self.info(sys::CL_EVENT_COMMAND_EXECUTION_STATUS)?;
        Ok(rgpu_cl_api::params::decode_unsigned(&bytes) as u32 as i32)
    }

    pub fn set_user_status(&self, status: i32) -> ClResult<()> {
        // SAFETY: live event (the implementation rejects a non-user event).
        check(unsafe { cl_call!(self.lib, clSetUserEventStatus(self.raw, status)) })
    }

    /// Flushes the queue the event's command was enqueued on, so that a callback or wait on
    /// it can make progress (no-op for user events).
    pub fn flush_queue(&self) {
        let Ok(bytes) = self.info(sys::CL_EVENT_COMMAND_QUEUE) else {
            return;
        };
        let raw_queue = decode_usize(&bytes) as cl_command_queue;
        if !raw_queue.is_null() {
            // SAFETY: an event holds a reference to its queue, so the handle is live.
            unsafe { cl_call!(self.lib, clFlush(raw_queue)) };
        }
    }

    /// Waits until the event completed or failed. Where cores are plentiful it polls the
    /// status for a short while first: implementations often sleep in clWaitForEvents and
    /// wake tens of microseconds after the device finished, which a small synchronous call
    /// would pay in full. On a machine with few cores polling would take a core from the
    /// implementation's own threads (a CPU device runs on them), so it just waits.
    pub fn wait_fast(&self) {
        static SPIN: std::sync::OnceLock<std::time::Duration> = std::sync::OnceLock::new();
        let spin = *SPIN.get_or_init(|| {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            std::time::Duration::from_micros(if cores >= 8 { 100 } else { 0 })
        });
        let start = std::time::Instant::now();
        while start.elapsed() < spin {
            match self.status() {
                Ok(status) if status > sys::CL_COMPLETE => std::hint::spin_loop(),
                _ => return,
            }
        }
        let _ = Event::wait_all(&[self]);
    }

    /// Blocks until every event is complete; CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST if
    /// one failed.
    pub fn wait_all(events: &[&Event]) -> ClResult<()> {
        let Some(first) = events.first() else {
            return Err(sys::CL_INVALID_VALUE);
        };
        let (n, list) = raw_events(events);
        // SAFETY: an array of `n` live events.
        check(unsafe { cl_call!(first.lib, clWaitForEvents(n, list.as_ptr())) })
    }

    /// Runs `callback` with the event's status once it reaches `callback_type` (CL_COMPLETE,
    /// CL_RUNNING or CL_SUBMITTED) or fails. The callback runs on an implementation thread.
    pub fn on_status(&self, callback_type: i32, callback: EventCallback) -> ClResult<()> {
        let user_data = Box::into_raw(Box::new(callback));
        // SAFETY: live event; the trampoline reclaims `user_data` when called.
        let status = unsafe {
            cl_call!(
                self.lib,
                clSetEventCallback(
                    self.raw,
                    callback_type,
                    Some(event_trampoline),
                    user_data.cast()
                )
            )
        };
        if status != sys::CL_SUCCESS {
            // SAFETY: registration failed, so the implementation never saw `user_data`.
            drop(unsafe { Box::from_raw(user_data) });
            return Err(status);
        }
        Ok(())
    }
}

struct TransferState<B> {
    /// The command's final status once its completion callback ran.
    status: Option<i32>,
    buf: Option<B>,
    /// Drop the buffer (back to its pool) as soon as the command completes.
    recycle_on_complete: bool,
}

/// A non-blocking transfer between staging memory and the device. Owns the staging buffer
/// until the command completes: dropping an InFlight early hands the buffer to the completion
/// callback instead of freeing memory the device may still use.
pub struct InFlight<B: HostBuffer> {
    event: Event,
    state: Arc<Mutex<TransferState<B>>>,
}

fn lock<B>(state: &Mutex<TransferState<B>>) -> std::sync::MutexGuard<'_, TransferState<B>> {
    state.lock().unwrap_or_else(|e| e.into_inner())
}

impl<B: HostBuffer> InFlight<B> {
    pub(super) fn start(event: Event, buf: B, waker: Option<Waker>) -> ClResult<InFlight<B>> {
        let state = Arc::new(Mutex::new(TransferState {
            status: None,
            buf: Some(buf),
            recycle_on_complete: false,
        }));
        let shared = state.clone();
        let wake = waker.clone();
        let registered = event.on_status(
            sys::CL_COMPLETE,
            Box::new(move |status| {
                let mut s = lock(&shared);
                s.status = Some(status);
                if s.recycle_on_complete {
                    s.buf = None;
                }
                drop(s);
                if let Some(wake) = wake {
                    wake();
                }
            }),
        );
        if registered.is_err() {
            // No callback: wait here so the buffer is never released early.
            let status = match Event::wait_all(&[&event]) {
                Ok(()) => event.status().unwrap_or(sys::CL_COMPLETE),
                Err(e) => e,
            };
            lock(&state).status = Some(status);
            if let Some(wake) = waker {
                wake();
            }
        }
        Ok(InFlight { event, state })
    }

    pub fn event(&self) -> &Event {
        &self.event
    }

    /// Once the command has completed: its status and the staging buffer (with the data, for
    /// a read). `None` while it is still running.
    pub fn take_if_complete(&self) -> Option<(i32, Option<B>)> {
        let mut s = lock(&self.state);
        // The callback may come well after the command completed; the event's status tells
        // sooner. Once complete, the device no longer uses the buffer.
        let status = match s.status {
            Some(status) => status,
            None => self
                .event
                .status()
                .ok()
                .filter(|&st| st <= sys::CL_COMPLETE)?,
        };
        // The callback's status may say CL_COMPLETE for a failed command on some
        // implementations; the event's recorded status tells.
        let status = status.min(self.event.status().unwrap_or(status));
        Some((status, s.buf.take()))
    }
}

impl<B: HostBuffer> Drop for InFlight<B> {
    fn drop(&mut self) {
        let mut s = lock(&self.state);
        if s.status.is_some() {
            s.buf = None;
        } else {
            s.recycle_on_complete = true;
        }
    }
}
