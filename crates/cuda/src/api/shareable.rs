//! Shareable handles of physical allocations and memory pools as POSIX file descriptors
//! (`cuMemExportToShareableHandle`, `cuMemPoolExportToShareableHandle`, their imports, and
//! `cuMemPoolExportPointer`/`ImportPointer`): NVIDIA's VMM and pool IPC samples and programs
//! like them pass the descriptor to another process over a Unix socket.
//!
//! The driver's descriptor stays with the exporting server (crates/server/src/cuda/shareable.rs);
//! the program gets a descriptor of rgpu's own: a sealed memfd holding a [`Record`] that names
//! the exporting server, the share socket and the ticket. It travels like any descriptor
//! (SCM_RIGHTS, inheritance), and the importing process's server fetches the driver's
//! descriptor with the ticket, which works where the two servers are one machine's (usually
//! they are one server). Only POSIX descriptors: the Win32 kinds have no meaning on Linux, and
//! fabric handles need NVIDIA's IMEX service across the servers' machines.

use std::ffi::{c_int, c_uint, c_ulonglong, c_void};
use std::sync::Arc;

use rgpu_client::CudaClient;
use rgpu_cuda_api::sys::*;
use rgpu_protocol::cuda::{MemProp, Pool, Shareable};

use super::ipc::server_key;
use super::memory::{context_of, overlaps_known_range, record_device_range};
use super::pools::pool_of;
use super::{status, write_out, Outcome};
use crate::objects::{current_context, Context, MemPool, PrimaryContext};

/// The first bytes of an rgpu shareable descriptor's contents (and their layout's version).
const MAGIC: [u8; 8] = *b"rgpuSHR1";
/// Bytes of a [`Record`].
const RECORD_LEN: usize = 72;
/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`.
const POSIX_FD: u32 = 1;
/// `CU_MEM_HANDLE_TYPE_FABRIC`.
const FABRIC: u32 = 8;
/// `CU_MEM_LOCATION_TYPE_DEVICE`.
const LOCATION_DEVICE: u32 = 1;

/// What a shared object is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Allocation = 1,
    Pool = 2,
}

/// What an rgpu shareable descriptor holds.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Record {
    /// The exporting server (see `server_key`).
    server: u64,
    kind: Kind,
    /// A pool's device, as its server numbers it (0 for an allocation, which its importer
    /// asks the driver about).
    device: u32,
    share: Shareable,
}

impl Record {
    fn encode(&self) -> [u8; RECORD_LEN] {
        let mut bytes = [0u8; RECORD_LEN];
        bytes[..8].copy_from_slice(&MAGIC);
        bytes[8..16].copy_from_slice(&self.server.to_le_bytes());
        bytes[16..20].copy_from_slice(&(self.kind as u32).to_le_bytes());
        bytes[20..24].copy_from_slice(&self.device.to_le_bytes());
        bytes[24..40].copy_from_slice(&self.share.socket);
        bytes[40..72].copy_from_slice(&self.share.ticket);
        bytes
    }

    /// `None`: not a record rgpu wrote.
    fn decode(bytes: &[u8; RECORD_LEN]) -> Option<Record> {
        if bytes[..8] != MAGIC {
            return None;
        }
        let word = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
        let kind = match word(16) {
            1 => Kind::Allocation,
            2 => Kind::Pool,
            _ => return None,
        };
        Some(Record {
            server: u64::from_le_bytes(bytes[8..16].try_into().unwrap()),
            kind,
            device: word(20),
            share: Shareable {
                socket: bytes[24..40].try_into().unwrap(),
                ticket: bytes[40..72].try_into().unwrap(),
            },
        })
    }

    /// A new descriptor holding the record: a sealed memfd, so that whoever receives it reads
    /// what the exporter wrote. Not close-on-exec, as a program may hand it to a child.
    fn into_descriptor(self) -> Result<c_int, CUresult> {
        let failed = |what: &str| {
            log::warn!(
                "rgpu: a shareable descriptor: {what}: {}",
                std::io::Error::last_os_error()
            );
            CUresult::CUDA_ERROR_OUT_OF_MEMORY
        };
        // SAFETY: a NUL-terminated name and flags.
        let fd = unsafe { libc::memfd_create(c"rgpu-shareable".as_ptr(), libc::MFD_ALLOW_SEALING) };
        if fd < 0 {
            return Err(failed("memfd_create"));
        }
        let bytes = self.encode();
        // SAFETY: a descriptor just made and a local buffer of the length given.
        let written = unsafe { libc::pwrite(fd, bytes.as_ptr().cast(), bytes.len(), 0) };
        let seals =
            libc::F_SEAL_WRITE | libc::F_SEAL_GROW | libc::F_SEAL_SHRINK | libc::F_SEAL_SEAL;
        // SAFETY: a plain system call on that descriptor.
        let sealed = written == RECORD_LEN as isize
            && unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, seals) } == 0;
        if !sealed {
            let error = failed("writing it");
            // SAFETY: ours, closed once.
            unsafe { libc::close(fd) };
            return Err(error);
        }
        Ok(fd)
    }

    /// The record a descriptor holds, if it is an rgpu shareable descriptor of `kind`.
    fn from_descriptor(fd: c_int, kind: Kind) -> Result<Record, CUresult> {
        let mut bytes = [0u8; RECORD_LEN];
        // SAFETY: a local buffer of the length given; a descriptor that is not one (or not
        // readable at an offset: a socket, a pipe) fails the read.
        let read = unsafe { libc::pread(fd, bytes.as_mut_ptr().cast(), RECORD_LEN, 0) };
        if read != RECORD_LEN as isize {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        Record::decode(&bytes)
            .filter(|record| record.kind == kind)
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)
    }
}

/// Whether `handle_type` is one rgpu shares: POSIX descriptors; fabric handles are refused as
/// not supported, the other kinds (Win32) as invalid here.
fn check_type(handle_type: c_uint) -> Result<(), CUresult> {
    match handle_type {
        POSIX_FD => Ok(()),
        FABRIC => Err(crate::unsupported::not_supported(
            "fabric shareable handles (CU_MEM_HANDLE_TYPE_FABRIC)",
        )),
        _ => Err(CUresult::CUDA_ERROR_INVALID_VALUE),
    }
}

/// The program's devices on the server a record names (those whose server's address hashes
/// to its key).
fn devices_of(
    server: u64,
) -> Result<impl Iterator<Item = &'static crate::servers::Device>, CUresult> {
    let devices = &crate::servers::servers()?.devices;
    Ok(devices
        .iter()
        .filter(move |device| server_key(&device.link.endpoint().to_string()) == server))
}

/// The context to import into on the server a record names: the current one where it is on
/// that server, else the primary context of the server's first device of the program.
fn importing_context(server: u64) -> Result<Arc<Context>, CUresult> {
    if let Ok(ctx) = current_context() {
        if server_key(&ctx.conn.endpoint().to_string()) == server {
            return Ok(ctx);
        }
    }
    let device = devices_of(server)?.next().ok_or_else(|| {
        log::warn!("rgpu: a shareable handle of a server this program does not use");
        CUresult::CUDA_ERROR_INVALID_VALUE
    })?;
    device.primary().ensure_created()?;
    Ok(device.primary())
}

/// `CUmemAllocationProp` from its wire form, its device the program's.
fn given_prop(wire: &MemProp, ctx: &Context) -> CUmemAllocationProp {
    let mut program = wire.clone();
    if wire.location_type == LOCATION_DEVICE {
        if let Some(ordinal) = u32::try_from(wire.location_id)
            .ok()
            .and_then(|remote| crate::servers::program_ordinal(&ctx.conn, remote))
        {
            program.location_id = ordinal;
        }
    }
    rgpu_cuda_api::wire::allocation_prop(&program)
}

pub unsafe fn cuMemExportToShareableHandle(
    shareableHandle: *mut c_void,
    handle: CUmemGenericAllocationHandle,
    handleType: CUmemAllocationHandleType,
    flags: c_ulonglong,
) -> CUresult {
    status((|| {
        check_type(handleType.0)?;
        if shareableHandle.is_null() || flags != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let ctx = super::vmm::handle_context(handle)?;
        let share = ctx
            .conn
            .cuda()
            .share_allocation(ctx.remote, handle)
            .outcome()?;
        let record = Record {
            server: server_key(&ctx.conn.endpoint().to_string()),
            kind: Kind::Allocation,
            device: 0,
            share,
        };
        let fd = record.into_descriptor()?;
        // SAFETY: the caller's out-pointer, checked non-null: an `int` for a POSIX descriptor.
        unsafe { write_out(shareableHandle.cast::<c_int>(), fd) }
    })())
}

pub unsafe fn cuMemImportFromShareableHandle(
    handle: *mut CUmemGenericAllocationHandle,
    osHandle: *mut c_void,
    shHandleType: CUmemAllocationHandleType,
) -> CUresult {
    status((|| {
        check_type(shHandleType.0)?;
        if handle.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // A POSIX descriptor is passed as the pointer's value.
        let fd =
            c_int::try_from(osHandle as usize).map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let record = Record::from_descriptor(fd, Kind::Allocation)?;
        let ctx = importing_context(record.server)?;
        let id = super::vmm::next_handle();
        let wire = ctx
            .conn
            .cuda()
            .import_allocation(ctx.remote, id, record.share)
            .outcome()?;
        super::vmm::remember_handle(id, &ctx, given_prop(&wire, &ctx));
        // SAFETY: the caller's out-pointer, checked non-null.
        unsafe { write_out(handle, id) }
    })())
}

pub unsafe fn cuMemPoolExportToShareableHandle(
    handle_out: *mut c_void,
    pool: CUmemoryPool,
    handleType: CUmemAllocationHandleType,
    flags: c_ulonglong,
) -> CUresult {
    status((|| {
        check_type(handleType.0)?;
        let object = pool_of(pool)?;
        if handle_out.is_null() || flags != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let share = object.conn.cuda().share_pool(object.pool).outcome()?;
        let record = Record {
            server: server_key(&object.conn.endpoint().to_string()),
            kind: Kind::Pool,
            device: crate::servers::device(object.device)?.remote_ordinal,
            share,
        };
        let fd = record.into_descriptor()?;
        // SAFETY: the caller's out-pointer, checked non-null: an `int` for a POSIX descriptor.
        unsafe { write_out(handle_out.cast::<c_int>(), fd) }
    })())
}

pub unsafe fn cuMemPoolImportFromShareableHandle(
    pool_out: *mut CUmemoryPool,
    handle: *mut c_void,
    handleType: CUmemAllocationHandleType,
    flags: c_ulonglong,
) -> CUresult {
    status((|| {
        check_type(handleType.0)?;
        if pool_out.is_null() || flags != 0 {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let fd =
            c_int::try_from(handle as usize).map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let record = Record::from_descriptor(fd, Kind::Pool)?;
        // The pool's device as this program numbers it: a device of the exporting server.
        let device = devices_of(record.server)?
            .find(|device| device.remote_ordinal == record.device)
            .ok_or_else(|| {
                log::warn!("rgpu: a shareable pool handle of a device this program does not use");
                CUresult::CUDA_ERROR_INVALID_VALUE
            })?;
        let ctx = device.primary();
        ctx.ensure_created()?;
        let id = ctx.conn.new_id();
        ctx.conn
            .cuda()
            .import_pool(ctx.remote, id, record.share)
            .outcome()?;
        let object = MemPool {
            handle: crate::handles::new_handle(),
            conn: ctx.conn.clone(),
            pool: Pool::Created(id),
            device: device.ordinal,
        };
        // SAFETY: the caller's out-pointer, checked non-null.
        unsafe { write_out(pool_out, object.into_handle()) }
    })())
}

pub unsafe fn cuMemPoolExportPointer(
    shareData_out: *mut CUmemPoolPtrExportData,
    ptr: CUdeviceptr,
) -> CUresult {
    status((|| {
        if shareData_out.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        let ctx = context_of(ptr)?;
        let bytes = ctx
            .conn
            .cuda()
            .pool_export_pointer(ctx.remote, ptr)
            .outcome()?;
        let reserved: [u8; 64] = bytes
            .as_slice()
            .try_into()
            .map_err(|_| CUresult::CUDA_ERROR_INVALID_VALUE)?;
        let data = CUmemPoolPtrExportData { reserved };
        // SAFETY: the caller's out-pointer, checked non-null.
        unsafe { write_out(shareData_out, data) }
    })())
}

pub unsafe fn cuMemPoolImportPointer(
    ptr_out: *mut CUdeviceptr,
    pool: CUmemoryPool,
    shareData: *mut CUmemPoolPtrExportData,
) -> CUresult {
    status((|| {
        let object = pool_of(pool)?;
        if ptr_out.is_null() || shareData.is_null() {
            return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: non-null, the caller's export data as the API requires.
        let data: Vec<u8> = unsafe { (*shareData).reserved.to_vec() };
        let ctx = crate::servers::device(object.device)?.primary();
        ctx.ensure_created()?;
        let server = ctx.conn.cuda();
        let mapped = server
            .pool_import_pointer(ctx.remote, object.pool, data)
            .outcome()?;
        // Another server's memory of this program may hold the address already (each server's
        // driver has its own address space): then the mapping cannot be told from it.
        if overlaps_known_range(mapped.ptr, mapped.size) {
            log::warn!(
                "rgpu: an imported pool allocation at an address another server's memory holds"
            );
            let _ = server.mem_free(ctx.remote, mapped.ptr).outcome();
            return Err(CUresult::CUDA_ERROR_OUT_OF_MEMORY);
        }
        record_device_range(mapped.ptr, mapped.size, &ctx);
        // SAFETY: the caller's out-pointer, checked non-null.
        unsafe { write_out(ptr_out, mapped.ptr) }
    })())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_descriptor_holds_its_record_sealed_and_others_are_not_ours() {
        let record = Record {
            server: server_key("gpu1:7450"),
            kind: Kind::Pool,
            device: 3,
            share: Shareable {
                socket: [0x5a; 16],
                ticket: [0xa5; 32],
            },
        };
        let fd = record.into_descriptor().unwrap();
        assert_eq!(Record::from_descriptor(fd, Kind::Pool), Ok(record));
        // Of another kind, it is not taken.
        assert_eq!(
            Record::from_descriptor(fd, Kind::Allocation),
            Err(CUresult::CUDA_ERROR_INVALID_VALUE)
        );
        // Sealed: nobody rewrites it.
        // SAFETY: a descriptor this test owns and a local buffer.
        let rewritten = unsafe { libc::pwrite(fd, [0u8; 8].as_ptr().cast(), 8, 0) };
        assert_eq!(rewritten, -1);
        // SAFETY: this test's descriptor, closed once.
        unsafe { libc::close(fd) };
        // Other descriptors (a pipe) are not rgpu's.
        let mut ends = [0; 2];
        // SAFETY: a local array of two descriptors.
        assert_eq!(unsafe { libc::pipe(ends.as_mut_ptr()) }, 0);
        assert_eq!(
            Record::from_descriptor(ends[0], Kind::Allocation),
            Err(CUresult::CUDA_ERROR_INVALID_VALUE)
        );
        for end in ends {
            // SAFETY: the test's own pipe, each end closed once.
            unsafe { libc::close(end) };
        }
    }
}
