//! The process lists. A server reports the processes of the asking session (its worker
//! process on the server); the program's CUDA session is rgpu's libcuda's, asked through it
//! when it is loaded here. They are this program's, so they are shown with this process's
//! pid, which is what `torch.cuda.list_gpu_processes()` and monitoring tools can make sense
//! of (the worker's pid means nothing on this machine). Graphics and MPS lists are empty.

use std::ffi::c_uint;

use super::{known, non_null, status};
use crate::devices;
use crate::types::*;

/// Writes the list NVML's way: `*count` is the room in `infos`; too little room answers
/// INSUFFICIENT_SIZE with the count needed; otherwise the entries and their count.
///
/// # Safety
/// `count` must be null or valid for reading and writing; `infos` null or valid for writing
/// `*count` entries.
unsafe fn write_list<T>(
    count: *mut c_uint,
    infos: *mut T,
    entries: Vec<T>,
) -> Result<(), nvmlReturn_t> {
    non_null(count)?;
    let needed = entries.len() as c_uint;
    // SAFETY: readable and writable, by the caller's contract.
    let room = unsafe { *count };
    // SAFETY: as above.
    unsafe { *count = needed };
    if room < needed {
        return Err(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    if needed > 0 {
        non_null(infos)?;
    }
    for (i, entry) in entries.into_iter().enumerate() {
        // SAFETY: `infos` holds `room` >= `needed` entries.
        unsafe { infos.add(i).write(entry) };
    }
    Ok(())
}

/// `rgpu_cuda_session_processes` of rgpu's libcuda (crates/cuda/src/lib.rs).
type SessionProcesses = unsafe extern "C" fn(i32, *mut u32, *mut u64) -> i32;

/// What this program's CUDA session holds on device `index`, asked through rgpu's libcuda when
/// it is loaded in this process and initialized: (processes, bytes used).
fn cuda_session(index: u32) -> Option<(u32, u64)> {
    let name = c"rgpu_cuda_session_processes";
    // SAFETY: looks the symbol up among the libraries loaded globally, else in libcuda.so.1 if
    // it is loaded already (cudart loads it privately; RTLD_NOLOAD never loads it).
    let symbol = unsafe {
        let global = libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr());
        if global.is_null() {
            let cuda = libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
            if cuda.is_null() {
                return None;
            }
            let found = libc::dlsym(cuda, name.as_ptr());
            libc::dlclose(cuda);
            found
        } else {
            global
        }
    };
    if symbol.is_null() {
        return None;
    }
    // SAFETY: rgpu's libcuda exports it with this signature.
    let ask: SessionProcesses = unsafe { std::mem::transmute(symbol) };
    let (mut count, mut used) = (0u32, 0u64);
    // SAFETY: local out-values.
    let answered = unsafe { ask(i32::try_from(index).ok()?, &mut count, &mut used) };
    (answered == 0).then_some((count, used))
}

/// This program's processes on `device`, as (pid here, bytes used). The program's CUDA work
/// runs in the session of rgpu's libcuda, not in this library's own session, so that
/// session's processes are the ones shown (as one process: this one).
fn compute_processes(device: nvmlDevice_t) -> Result<Vec<(u32, u64)>, nvmlReturn_t> {
    let device = devices::device(device)?;
    let pid = std::process::id();
    if let Some((count, used)) = cuda_session(device.index) {
        return Ok(if count > 0 {
            vec![(pid, used)]
        } else {
            Vec::new()
        });
    }
    let processes = known(device.status()?.processes)?;
    Ok(processes
        .into_iter()
        .map(|p| (pid, p.used_memory.unwrap_or(NVML_VALUE_NOT_AVAILABLE)))
        .collect())
}

fn v3(entries: Vec<(u32, u64)>) -> Vec<nvmlProcessInfo_t> {
    entries
        .into_iter()
        .map(|(pid, used)| nvmlProcessInfo_t {
            pid,
            usedGpuMemory: used,
            gpuInstanceId: NO_INSTANCE,
            computeInstanceId: NO_INSTANCE,
        })
        .collect()
}

fn v1(entries: Vec<(u32, u64)>) -> Vec<nvmlProcessInfo_v1_t> {
    entries
        .into_iter()
        .map(|(pid, used)| nvmlProcessInfo_v1_t {
            pid,
            usedGpuMemory: used,
        })
        .collect()
}

pub unsafe fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: nvmlDevice_t,
    infoCount: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    // SAFETY: the caller's contract.
    status(compute_processes(device).and_then(|e| unsafe { write_list(infoCount, infos, v3(e)) }))
}

pub unsafe fn nvmlDeviceGetComputeRunningProcesses_v2(
    device: nvmlDevice_t,
    infoCount: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    // SAFETY: the same contract (v2 has v3's layout).
    unsafe { nvmlDeviceGetComputeRunningProcesses_v3(device, infoCount, infos) }
}

pub unsafe fn nvmlDeviceGetComputeRunningProcesses(
    device: nvmlDevice_t,
    infoCount: *mut c_uint,
    infos: *mut nvmlProcessInfo_v1_t,
) -> nvmlReturn_t {
    // SAFETY: the caller's contract.
    status(compute_processes(device).and_then(|e| unsafe { write_list(infoCount, infos, v1(e)) }))
}

/// No graphics (or MPS) processes: the servers run compute sessions only.
fn no_processes(device: nvmlDevice_t) -> Result<Vec<(u32, u64)>, nvmlReturn_t> {
    devices::device(device)?;
    Ok(Vec::new())
}

pub unsafe fn nvmlDeviceGetGraphicsRunningProcesses_v3(
    device: nvmlDevice_t,
    infoCount: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    // SAFETY: the caller's contract.
    status(no_processes(device).and_then(|e| unsafe { write_list(infoCount, infos, v3(e)) }))
}

pub unsafe fn nvmlDeviceGetGraphicsRunningProcesses_v2(
    device: nvmlDevice_t,
    infoCount: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    // SAFETY: the same contract.
    unsafe { nvmlDeviceGetGraphicsRunningProcesses_v3(device, infoCount, infos) }
}

pub unsafe fn nvmlDeviceGetGraphicsRunningProcesses(
    device: nvmlDevice_t,
    infoCount: *mut c_uint,
    infos: *mut nvmlProcessInfo_v1_t,
) -> nvmlReturn_t {
    // SAFETY: the caller's contract.
    status(no_processes(device).and_then(|e| unsafe { write_list(infoCount, infos, v1(e)) }))
}

pub unsafe fn nvmlDeviceGetMPSComputeRunningProcesses_v3(
    device: nvmlDevice_t,
    infoCount: *mut c_uint,
    infos: *mut nvmlProcessInfo_t,
) -> nvmlReturn_t {
    // SAFETY: the caller's contract.
    status(no_processes(device).and_then(|e| unsafe { write_list(infoCount, infos, v3(e)) }))
}
