//! JIT compilation and linking on the server: the options a program passes (`CUjit_option`)
//! travel as numbers; the logs the server's compiler and linker write come back and are copied
//! into the program's log buffers, with the sizes and wall time written back as the driver
//! does. `cuLink*` links on the server and hands the program the cubin, which the server also
//! keeps, so that loading it next travels as its hash.

use std::ffi::{c_char, c_uint, c_void, CStr};
use std::sync::Mutex;

use rgpu_client::CudaClient;
use rgpu_cuda_api::sys::*;
use rgpu_protocol::cuda::{JitLogs, JitOption, Linked};

use super::{from_remote, status, write_out};
use crate::objects::{current_context, Link};
use crate::results::client_error;

const WALL_TIME: u32 = 2;
const INFO_LOG_BUFFER: u32 = 3;
const INFO_LOG_BUFFER_SIZE_BYTES: u32 = 4;
const ERROR_LOG_BUFFER: u32 = 5;
const ERROR_LOG_BUFFER_SIZE_BYTES: u32 = 6;
const NUM_OPTIONS: u32 = 35;
/// `CU_JIT_INPUT_PTX`: text, which the driver reads up to its NUL.
const INPUT_PTX: u32 = 1;

/// A log buffer of the program's: its address, size and the option slot its size is in.
#[derive(Clone, Copy, Default)]
struct LogBuffer {
    address: usize,
    size: usize,
    size_slot: Option<usize>,
}

/// A program's JIT options: the numeric ones for the server, and where its logs go.
#[derive(Default)]
pub struct JitRequest {
    pub wire: Vec<JitOption>,
    info: LogBuffer,
    error: LogBuffer,
    wall_slot: Option<usize>,
    /// The program's option values (written back: log sizes and wall time).
    values: usize,
}

impl JitRequest {
    /// Reads `count` options.
    ///
    /// # Safety
    /// `options` and `values` are null (with `count` 0) or hold `count` entries each, as the
    /// API requires; the log buffers they name stay valid while the request is in use.
    pub unsafe fn parse(
        count: c_uint,
        options: *const u32,
        values: *mut *mut c_void,
    ) -> Result<JitRequest, CUresult> {
        let mut request = JitRequest {
            values: values as usize,
            ..JitRequest::default()
        };
        if count == 0 {
            return Ok(request);
        }
        if options.is_null() || values.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        for i in 0..count as usize {
            // SAFETY: the caller's guarantee.
            let (option, value) = unsafe { (*options.add(i), *values.add(i) as usize) };
            match option {
                WALL_TIME => request.wall_slot = Some(i),
                INFO_LOG_BUFFER => request.info.address = value,
                INFO_LOG_BUFFER_SIZE_BYTES => {
                    request.info.size = value as u32 as usize;
                    request.info.size_slot = Some(i);
                }
                ERROR_LOG_BUFFER => request.error.address = value,
                ERROR_LOG_BUFFER_SIZE_BYTES => {
                    request.error.size = value as u32 as usize;
                    request.error.size_slot = Some(i);
                }
                o if o >= NUM_OPTIONS => return Err(CUresult::CUDA_ERROR_INVALID_VALUE),
                o => request.wire.push(JitOption {
                    option: o,
                    value: value as u64,
                }),
            }
        }
        Ok(request)
    }

    /// Hands the logs and wall time to the program, as the driver would.
    pub fn deliver(&self, logs: &JitLogs) {
        let values = self.values as *mut *mut c_void;
        for (buffer, text) in [(self.info, &logs.info), (self.error, &logs.error)] {
            if buffer.address == 0 || buffer.size == 0 {
                continue;
            }
            let n = text.len().min(buffer.size - 1);
            // SAFETY: the program's log buffer of `size` bytes (the parse contract).
            unsafe {
                let dst = buffer.address as *mut u8;
                std::ptr::copy_nonoverlapping(text.as_ptr(), dst, n);
                dst.add(n).write(0);
            }
            if let Some(slot) = buffer.size_slot {
                // SAFETY: the program's option values (the parse contract).
                unsafe { values.add(slot).write(n as *mut c_void) };
            }
        }
        if let Some(slot) = self.wall_slot {
            let bits = logs.wall_time_ms.to_bits() as usize;
            // SAFETY: as above; the driver writes the float's bits into the value slot.
            unsafe { values.add(slot).write(bits as *mut c_void) };
        }
    }
}

/// Reads a file the program names (modules and link inputs load from files).
///
/// # Safety
/// `path` is null or a NUL-terminated string.
pub unsafe fn read_file(path: *const c_char) -> Result<Vec<u8>, CUresult> {
    if path.is_null() {
        return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller's guarantee.
    let path = unsafe { CStr::from_ptr(path) }
        .to_string_lossy()
        .into_owned();
    let mut bytes = std::fs::read(&path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => CUresult::CUDA_ERROR_FILE_NOT_FOUND,
        _ => CUresult::CUDA_ERROR_INVALID_VALUE,
    })?;
    // PTX is text the driver reads up to its NUL; binaries carry their size.
    let binary = bytes.starts_with(b"\x7fELF") || bytes.starts_with(&[0xb1, 0x43, 0x62, 0x46]);
    if !binary && bytes.last() != Some(&0) {
        bytes.push(0);
    }
    Ok(bytes)
}

pub unsafe fn cuLinkCreate_v2(
    count: c_uint,
    options: *mut u32,
    values: *mut *mut c_void,
    state: *mut CUlinkState,
) -> CUresult {
    status(current_context().and_then(|ctx| {
        if state.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the program's option arrays, valid (with its log buffers) until it destroys
        // the link, as the API requires.
        let jit = unsafe { JitRequest::parse(count, options, values)? };
        let link = Link {
            handle: crate::handles::new_handle(),
            conn: ctx.conn.clone(),
            remote: ctx.conn.new_id(),
            jit,
            cubin: Mutex::new(None),
        };
        ctx.conn
            .cuda()
            .link_create(link.remote, ctx.remote, link.jit.wire.clone())
            .map_err(client_error)?;
        // SAFETY: checked non-null above.
        unsafe { write_out(state, link.into_handle()) }
    }))
}

pub unsafe fn cuLinkCreate(
    count: c_uint,
    options: *mut u32,
    values: *mut *mut c_void,
    state: *mut CUlinkState,
) -> CUresult {
    // SAFETY: the caller's arguments, passed on as they came.
    unsafe { cuLinkCreate_v2(count, options, values, state) }
}

/// Adds one input to a link; its logs go to the program's buffers.
#[allow(clippy::too_many_arguments)]
unsafe fn add_input(
    state: CUlinkState,
    input: u32,
    mut data: Vec<u8>,
    name: String,
    count: c_uint,
    options: *mut u32,
    values: *mut *mut c_void,
) -> Result<(), CUresult> {
    let link = Link::from_handle(state).ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
    // SAFETY: the program's option arrays, valid for the call.
    let jit = unsafe { JitRequest::parse(count, options, values)? };
    if input == INPUT_PTX && data.last() != Some(&0) {
        data.push(0);
    }
    let linked: Linked = link
        .conn
        .cuda()
        .link_add_data(link.remote, input, name, jit.wire.clone(), &data)
        .map_err(client_error)?;
    link.jit.deliver(&linked.logs);
    jit.deliver(&linked.logs);
    from_remote(linked.status)
}

pub unsafe fn cuLinkAddData_v2(
    state: CUlinkState,
    input: u32,
    data: *mut c_void,
    size: usize,
    name: *const c_char,
    count: c_uint,
    options: *mut u32,
    values: *mut *mut c_void,
) -> CUresult {
    status((|| {
        if data.is_null() || size == 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the program's input of `size` bytes, as the API requires.
        let bytes = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), size) }.to_vec();
        let name = if name.is_null() {
            String::new()
        } else {
            // SAFETY: a NUL-terminated name, as the API requires.
            unsafe { CStr::from_ptr(name) }
                .to_string_lossy()
                .into_owned()
        };
        // SAFETY: the caller's arguments, passed on.
        unsafe { add_input(state, input, bytes, name, count, options, values) }
    })())
}

pub unsafe fn cuLinkAddData(
    state: CUlinkState,
    input: u32,
    data: *mut c_void,
    size: usize,
    name: *const c_char,
    count: c_uint,
    options: *mut u32,
    values: *mut *mut c_void,
) -> CUresult {
    // SAFETY: the caller's arguments, passed on as they came.
    unsafe { cuLinkAddData_v2(state, input, data, size, name, count, options, values) }
}

pub unsafe fn cuLinkAddFile_v2(
    state: CUlinkState,
    input: u32,
    path: *const c_char,
    count: c_uint,
    options: *mut u32,
    values: *mut *mut c_void,
) -> CUresult {
    status((|| {
        // SAFETY: a NUL-terminated path, as the API requires.
        let bytes = unsafe { read_file(path)? };
        // SAFETY: as above (read_file refused a null path).
        let name = unsafe { CStr::from_ptr(path) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: the caller's arguments, passed on.
        unsafe { add_input(state, input, bytes, name, count, options, values) }
    })())
}

pub unsafe fn cuLinkAddFile(
    state: CUlinkState,
    input: u32,
    path: *const c_char,
    count: c_uint,
    options: *mut u32,
    values: *mut *mut c_void,
) -> CUresult {
    // SAFETY: the caller's arguments, passed on as they came.
    unsafe { cuLinkAddFile_v2(state, input, path, count, options, values) }
}

pub unsafe fn cuLinkComplete(
    state: CUlinkState,
    cubin: *mut *mut c_void,
    size: *mut usize,
) -> CUresult {
    status((|| {
        let link = Link::from_handle(state).ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        if cubin.is_null() || size.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let linked = link
            .conn
            .cuda()
            .link_complete(link.remote)
            .map_err(client_error)?;
        link.jit.deliver(&linked.logs);
        from_remote(linked.status)?;
        let mut kept = link.cubin.lock().unwrap();
        let image = kept.insert(linked.cubin.into_boxed_slice());
        // SAFETY: checked non-null above; the cubin stays in the link until it is destroyed.
        unsafe {
            cubin.write(image.as_mut_ptr().cast());
            size.write(image.len());
        }
        Ok(())
    })())
}

pub unsafe fn cuLinkDestroy(state: CUlinkState) -> CUresult {
    status((|| {
        let link = Link::destroy(state).ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
        link.conn
            .cuda()
            .link_destroy(link.remote)
            .map_err(client_error)
    })())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_load_as_the_driver_reads_them() {
        let dir = std::env::temp_dir().join(format!("rgpu-jit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ptx = dir.join("k.ptx");
        std::fs::write(&ptx, ".version 7.0\n.target sm_80\n").unwrap();
        let cubin = dir.join("k.cubin");
        std::fs::write(&cubin, b"\x7fELF\x02\x01rest").unwrap();
        let path = |p: &std::path::Path| std::ffi::CString::new(p.to_str().unwrap()).unwrap();
        // SAFETY: test: NUL-terminated paths.
        unsafe {
            let text = read_file(path(&ptx).as_ptr()).unwrap();
            assert_eq!(text.last(), Some(&0), "PTX text gets its NUL");
            let binary = read_file(path(&cubin).as_ptr()).unwrap();
            assert_eq!(binary, b"\x7fELF\x02\x01rest", "a cubin stays as it is");
            let missing = read_file(path(&dir.join("none.ptx")).as_ptr());
            assert_eq!(missing, Err(CUresult::CUDA_ERROR_FILE_NOT_FOUND));
            assert_eq!(
                read_file(std::ptr::null()),
                Err(CUresult::CUDA_ERROR_INVALID_VALUE)
            );
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn jit_options_travel_as_numbers_and_logs_come_back_to_the_programs_buffers() {
        let mut info = [0xffu8; 8];
        let mut error = [0xffu8; 64];
        let mut options = [
            2u32, // wall time
            3,    // info log buffer
            4,    // its size
            5,    // error log buffer
            6,    // its size
            7,    // optimization level
            12,   // verbose
        ];
        let mut values: [*mut c_void; 7] = [
            std::ptr::null_mut(),
            info.as_mut_ptr().cast(),
            info.len() as *mut c_void,
            error.as_mut_ptr().cast(),
            error.len() as *mut c_void,
            std::ptr::without_provenance_mut(3),
            std::ptr::without_provenance_mut(1),
        ];
        // SAFETY: test: 7 options and values; the log buffers outlive the request.
        let request =
            unsafe { JitRequest::parse(7, options.as_mut_ptr(), values.as_mut_ptr()) }.unwrap();
        assert_eq!(
            request.wire,
            [
                JitOption {
                    option: 7,
                    value: 3
                },
                JitOption {
                    option: 12,
                    value: 1
                }
            ]
        );
        request.deliver(&JitLogs {
            info: "a longer info log than fits".into(),
            error: "bad".into(),
            wall_time_ms: 1.25,
        });
        // Truncated to the buffer, NUL-terminated, and the sizes written back.
        assert_eq!(&info, b"a longe\0");
        assert_eq!(&error[..4], b"bad\0");
        assert_eq!(values[2] as usize, 7);
        assert_eq!(values[4] as usize, 3);
        assert_eq!(f32::from_bits(values[0] as usize as u32), 1.25);
        // An option past the driver's list is refused.
        options[5] = 99;
        // SAFETY: as above.
        let refused = unsafe { JitRequest::parse(7, options.as_mut_ptr(), values.as_mut_ptr()) };
        assert!(matches!(refused, Err(CUresult::CUDA_ERROR_INVALID_VALUE)));
    }
}
