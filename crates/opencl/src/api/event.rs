//! Events: the client knows an event's status when it completes the event itself (reads, user
//! events); otherwise it asks the server, or asks to be told (clSetEventCallback).

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Condvar, LazyLock, Mutex};
use std::time::{Duration, Instant};

use opencl_sys::*;
use rgpu_client::Connection;
use rgpu_client::OpenClClient;
use rgpu_protocol::opencl::{Id, InfoQuery};

use crate::api::context::context_from;
use crate::handle::{self, Ref};
use crate::objects::{Completion, Context, Event, EventCallback, EventState, Queue, UserCallback};
use crate::runtime::{runtime, runtime_if_ready};
use crate::util::{bytes_of, client_error, creation, guard, write_info, Outcome};

/// How long a wait for the server may take before the call fails (`RGPU_TIMEOUT`, seconds).
pub static WAIT_TIMEOUT: LazyLock<Duration> = LazyLock::new(rgpu_client::reply_timeout_from_env);

pub fn event_from(event: cl_event) -> Result<Ref<Event>, cl_int> {
    handle::lookup::<Event>(event)
}

/// A new event object for a command (or a user event when `queue` is None).
pub fn new_event(
    conn: &Arc<Connection>,
    context: &Ref<Context>,
    queue: Option<&Ref<Queue>>,
    command_type: cl_command_type,
    completion: Completion,
) -> Ref<Event> {
    handle::create(Event {
        conn: Arc::clone(conn),
        id: conn.new_id(),
        context: context.clone(),
        queue: queue.cloned(),
        command_type,
        completion,
        state: Mutex::new(EventState {
            status: if queue.is_some() {
                CL_QUEUED
            } else {
                CL_SUBMITTED
            },
            callbacks: Vec::new(),
            notify_requested: false,
            profiling: HashMap::new(),
        }),
        changed: Condvar::new(),
    })
}

/// Records a status the client learned. Statuses only move forward (QUEUED 3 → COMPLETE 0, or
/// an error < 0); callbacks registered for a status now reached run on the callback thread.
pub fn set_status(event: &Ref<Event>, status: cl_int) {
    {
        let mut state = event.state.lock().unwrap();
        if state.status <= CL_COMPLETE || status >= state.status {
            return;
        }
        state.status = status;
    }
    event.changed.notify_all();
    if status <= CL_COMPLETE {
        if let Some(rt) = runtime_if_ready() {
            rt.unwatch_event(event);
        }
    }
    fire_reached(event);
}

/// Waits until the client itself completes the event (reads, user events).
fn wait_local(event: &Event) -> Result<cl_int, cl_int> {
    let deadline = Instant::now() + *WAIT_TIMEOUT;
    let mut state = event.state.lock().unwrap();
    while state.status > CL_COMPLETE {
        let now = Instant::now();
        if now >= deadline {
            log::error!("rgpu: timed out waiting for an event");
            return Err(CL_OUT_OF_RESOURCES);
        }
        state = event.changed.wait_timeout(state, deadline - now).unwrap().0;
    }
    Ok(state.status)
}

/// Waits for events; Ok(false) if any ended in an error.
pub fn wait_for(events: &[Ref<Event>]) -> Result<bool, cl_int> {
    let mut all_ok = true;
    // Events only the server can complete, grouped by connection.
    let mut remote: Vec<(Arc<Connection>, Vec<Ref<Event>>)> = Vec::new();
    for event in events {
        if event.is_final() {
            all_ok &= event.known_status() == CL_COMPLETE;
        } else if event.completion == Completion::Local {
            all_ok &= wait_local(event)? == CL_COMPLETE;
        } else {
            match remote.iter_mut().find(|(c, _)| Arc::ptr_eq(c, &event.conn)) {
                Some((_, list)) => list.push(event.clone()),
                None => remote.push((Arc::clone(&event.conn), vec![event.clone()])),
            }
        }
    }
    for (conn, list) in remote {
        let ids: Vec<Id> = list.iter().map(|e| e.id).collect();
        match conn.opencl().wait_for_events(ids).outcome() {
            Ok(()) => list.iter().for_each(|e| set_status(e, CL_COMPLETE)),
            Err(CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST) => all_ok = false,
            Err(code) => return Err(code),
        }
    }
    Ok(all_ok)
}

pub unsafe extern "C" fn clWaitForEvents(
    num_events: cl_uint,
    event_list: *const cl_event,
) -> cl_int {
    guard(CL_OUT_OF_HOST_MEMORY, || {
        if num_events == 0 || event_list.is_null() {
            return CL_INVALID_VALUE;
        }
        // SAFETY: the application's array of `num_events` events.
        let raw = unsafe { crate::util::slice(event_list, num_events as usize) };
        let events: Result<Vec<Ref<Event>>, cl_int> = raw.iter().map(|&e| event_from(e)).collect();
        let events = match events {
            Ok(events) => events,
            Err(code) => return code,
        };
        if events
            .iter()
            .any(|e| !Arc::ptr_eq(&e.context, &events[0].context))
        {
            return CL_INVALID_CONTEXT;
        }
        match wait_for(&events) {
            Ok(true) => CL_SUCCESS,
            Ok(false) => CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST,
            Err(code) => code,
        }
    })
}

/// The event's execution status, asking the server only while it is not final. (Each query
/// of a running command asks: answering from a status learned earlier would let a program see
/// a command running while the command it waits for still looks unfinished, as the CTS's
/// `test_events waitlists` caught.)
pub(crate) fn current_status(event: &Ref<Event>) -> Result<cl_int, cl_int> {
    let known = event.known_status();
    if known <= CL_COMPLETE || event.completion == Completion::Local {
        return Ok(known);
    }
    let value = crate::api::program::server_info(
        &event.conn,
        InfoQuery::Event(event.id),
        CL_EVENT_COMMAND_EXECUTION_STATUS,
    )?;
    let status = value
        .get(..4)
        .map(|b| i32::from_le_bytes(b.try_into().unwrap()))
        .ok_or(CL_OUT_OF_RESOURCES)?;
    set_status(event, status);
    Ok(status.min(event.known_status()))
}

/// Has the server notify `event`'s completion (whose `notify_requested` the caller set).
/// Completion is what native implementations report reliably; it implies the other statuses.
fn watch_completion(event: &Ref<Event>) -> Result<(), cl_int> {
    let Some(rt) = runtime() else {
        return Err(CL_INVALID_EVENT);
    };
    rt.watch_event(event);
    event
        .conn
        .opencl()
        .notify_event(event.id, CL_COMPLETE)
        .and_then(|()| event.conn.flush())
        .map_err(client_error)
}

pub unsafe extern "C" fn clGetEventInfo(
    event: cl_event,
    param_name: cl_event_info,
    param_value_size: usize,
    param_value: *mut c_void,
    param_value_size_ret: *mut usize,
) -> cl_int {
    guard(CL_OUT_OF_HOST_MEMORY, || {
        let event = match event_from(event) {
            Ok(e) => e,
            Err(code) => return code,
        };
        let value = match param_name {
            CL_EVENT_COMMAND_QUEUE => bytes_of(
                &event
                    .queue
                    .as_ref()
                    .map_or(std::ptr::null_mut(), handle::raw),
            ),
            CL_EVENT_CONTEXT => bytes_of(&handle::raw(&event.context)),
            CL_EVENT_COMMAND_TYPE => bytes_of(&event.command_type),
            CL_EVENT_REFERENCE_COUNT => bytes_of(&handle::app_refs(&event)),
            CL_EVENT_COMMAND_EXECUTION_STATUS => match current_status(&event) {
                Ok(status) => bytes_of(&status),
                Err(code) => return code,
            },
            _ => return CL_INVALID_VALUE,
        };
        // SAFETY: the application's out-pointers for this query.
        unsafe { write_info(&value, param_value_size, param_value, param_value_size_ret) }
    })
}

pub unsafe extern "C" fn clCreateUserEvent(
    context: cl_context,
    errcode_ret: *mut cl_int,
) -> cl_event {
    guard(std::ptr::null_mut(), || {
        let result = (|| {
            let context = context_from(context)?;
            let event = new_event(
                &context.conn,
                &context,
                None,
                CL_COMMAND_USER,
                Completion::Local,
            );
            context
                .conn
                .opencl()
                .create_user_event(event.id, context.id)
                .map_err(client_error)?;
            Ok(handle::raw(&event))
        })();
        // SAFETY: the application's errcode pointer.
        unsafe { creation(result, errcode_ret) }
    })
}

pub unsafe extern "C" fn clSetUserEventStatus(event: cl_event, execution_status: cl_int) -> cl_int {
    guard(CL_OUT_OF_HOST_MEMORY, || {
        let event = match event_from(event) {
            Ok(e) if e.command_type == CL_COMMAND_USER => e,
            Ok(_) => return CL_INVALID_EVENT,
            Err(code) => return code,
        };
        if execution_status > CL_COMPLETE {
            return CL_INVALID_VALUE;
        }
        if event.is_final() {
            return CL_INVALID_OPERATION;
        }
        // Sent at once: commands on the server may be waiting for it.
        let sent = event
            .conn
            .opencl()
            .set_user_event_status(event.id, execution_status)
            .and_then(|()| event.conn.flush());
        if let Err(e) = sent {
            return client_error(e);
        }
        set_status(&event, execution_status);
        CL_SUCCESS
    })
}

pub unsafe extern "C" fn clSetEventCallback(
    event: cl_event,
    command_exec_callback_type: cl_int,
    pfn_notify: Option<EventCallback>,
    user_data: *mut c_void,
) -> cl_int {
    guard(CL_OUT_OF_HOST_MEMORY, || {
        let event = match event_from(event) {
            Ok(e) => e,
            Err(code) => return code,
        };
        let Some(func) = pfn_notify else {
            return CL_INVALID_VALUE;
        };
        if !matches!(
            command_exec_callback_type,
            CL_SUBMITTED | CL_RUNNING | CL_COMPLETE
        ) {
            return CL_INVALID_VALUE;
        }
        let callback = UserCallback {
            func,
            user_data: user_data as usize,
        };
        let ask_server = {
            let mut state = event.state.lock().unwrap();
            state.callbacks.push((command_exec_callback_type, callback));
            let ask = event.completion == Completion::Remote
                && !state.notify_requested
                && state.status > command_exec_callback_type;
            if ask {
                state.notify_requested = true;
            }
            ask
        };
        // Already reached: it runs now.
        let known = event.known_status();
        if known <= command_exec_callback_type {
            fire_reached(&event);
        }
        if ask_server {
            if let Err(code) = watch_completion(&event) {
                return code;
            }
        }
        CL_SUCCESS
    })
}

/// Runs the callbacks whose status the event already reached.
fn fire_reached(event: &Ref<Event>) {
    let due: Vec<(cl_int, UserCallback<EventCallback>)> = {
        let mut state = event.state.lock().unwrap();
        let reached = state.status;
        let (due, keep) = state.callbacks.drain(..).partition(|(t, _)| reached <= *t);
        state.callbacks = keep;
        due
    };
    let Some(rt) = runtime_if_ready() else { return };
    if due.is_empty() {
        return;
    }
    let status = event.known_status();
    let raw = handle::raw(event) as usize;
    let keep_alive = event.clone();
    rt.run_callback(Box::new(move || {
        for (trigger, cb) in due {
            // A callback sees the status it asked for, or the error that ended the command.
            let reported = if status < 0 { status } else { trigger };
            // SAFETY: the application registered this callback with this user data.
            unsafe { (cb.func)(raw as cl_event, reported, cb.user_data as *mut c_void) };
        }
        drop(keep_alive);
    }));
}

pub unsafe extern "C" fn clRetainEvent(event: cl_event) -> cl_int {
    handle::retain::<Event>(event)
}

pub unsafe extern "C" fn clReleaseEvent(event: cl_event) -> cl_int {
    handle::release::<Event>(event)
}

pub unsafe extern "C" fn clGetEventProfilingInfo(
    event: cl_event,
    param_name: cl_profiling_info,
    param_value_size: usize,
    param_value: *mut c_void,
    param_value_size_ret: *mut usize,
) -> cl_int {
    guard(CL_OUT_OF_HOST_MEMORY, || {
        let event = match event_from(event) {
            Ok(e) => e,
            Err(code) => return code,
        };
        let profiling = event
            .queue
            .as_ref()
            .is_some_and(|q| q.properties & CL_QUEUE_PROFILING_ENABLE != 0);
        if !profiling {
            return CL_PROFILING_INFO_NOT_AVAILABLE;
        }
        if let Some(value) = event.state.lock().unwrap().profiling.get(&param_name) {
            // SAFETY: the application's out-pointers for this query.
            return unsafe {
                write_info(value, param_value_size, param_value, param_value_size_ret)
            };
        }
        let ask = || {
            crate::api::program::server_info(
                &event.conn,
                InfoQuery::EventProfiling(event.id),
                param_name,
            )
        };
        let value = match ask() {
            Ok(value) => value,
            // The event is complete (here, or as the server sees it) while the server's
            // implementation has not filled in its times yet (PoCL, under load, a moment after
            // a read's data went out or its status turned complete; seen in CI). Profiling
            // info is due once the event is complete: wait for it on the server, ask again.
            Err(CL_PROFILING_INFO_NOT_AVAILABLE) if current_status(&event) == Ok(CL_COMPLETE) => {
                let waited = event
                    .conn
                    .opencl()
                    .wait_for_events(vec![event.id])
                    .outcome();
                match waited.and_then(|()| ask()) {
                    Ok(value) => value,
                    Err(code) => return code,
                }
            }
            Err(code) => return code,
        };
        if event.is_final() {
            event
                .state
                .lock()
                .unwrap()
                .profiling
                .insert(param_name, value.clone());
        }
        // SAFETY: the application's out-pointers for this query.
        unsafe { write_info(&value, param_value_size, param_value, param_value_size_ret) }
    })
}
