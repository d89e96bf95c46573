//! cudart's private driver tables (`cuGetExportTable`), implemented in the client. cudart,
//! cuBLAS and friends fetch them by UUID and call through raw slots, so each table is a
//! static array (its address is stable, and the integrity check hashes it), slot 0 usually
//! its size in bytes, and every other slot a callable function: slots rgpu does not know
//! answer CUDA_ERROR_NOT_SUPPORTED and say which slot was called, once.

use std::collections::BTreeMap;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::AtomicU32;
use std::sync::Mutex;

use rgpu_cuda_api::sys::{CUcontext, CUdevice, CUfunction, CUmodule, CUresult, CUstream};

use crate::boundary::callback;
use crate::objects::PrimaryContext;
use crate::objects::{self, Context};
use crate::results::{status, write_out};
use crate::servers;

/// One table: words as cudart reads them (a size, then function addresses).
#[repr(C)]
struct Table<const N: usize>([*const (); N]);
// SAFETY: the slots are integers and function addresses, fixed at compile time.
unsafe impl<const N: usize> Sync for Table<N> {}

impl<const N: usize> Table<N> {
    fn base(&'static self) -> *const c_void {
        self as *const Self as *const c_void
    }
}

/// Sets one slot; slots past the table's end are skipped (the stub list is shared).
const fn put(slots: &mut [*const ()], slot: usize, function: *const ()) {
    if slot < slots.len() {
        slots[slot] = function;
    }
}

/// A table of `$n` slots: slot 0 the size in bytes, each other slot a stub of its own (so
/// the log names the slot called), then the given slots set to real functions.
macro_rules! table {
    ($table:ident, $n:literal, { $($slot:literal => $function:expr),* $(,)? }) => {{
        let mut slots = [std::ptr::null::<()>(); $n];
        slots[0] = ($n * std::mem::size_of::<usize>()) as *const ();
        table!(@stubs slots, $table, [
            1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30
            31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57
            58 59 60 61 62 63 64 65 66 67 68 69 70 71 72 73 74 75 76 77 78 79 80 81 82 83 84
            85 86 87 88 89 90 91 92 93 94 95 96 97 98
        ]);
        $( put(&mut slots, $slot, $function as *const ()); )*
        Table(slots)
    }};
    (@stubs $slots:ident, $table:ident, [$($slot:literal)*]) => {
        $( put(&mut $slots, $slot, unsupported::<$table, $slot> as *const ()); )*
    };
}

/// The UUID bytes of a table, from its dashed form (callers pass the bytes in that order).
const fn uuid(text: &str) -> [u8; 16] {
    let text = text.as_bytes();
    let mut bytes = [0u8; 16];
    let (mut i, mut nibbles) = (0, 0);
    while i < text.len() {
        let digit = match text[i] {
            b'-' => None,
            c @ b'0'..=b'9' => Some(c - b'0'),
            c @ b'A'..=b'F' => Some(c - b'A' + 10),
            c @ b'a'..=b'f' => Some(c - b'a' + 10),
            _ => panic!("not a UUID"),
        };
        if let Some(digit) = digit {
            bytes[nibbles / 2] |= digit << (4 * (1 - nibbles % 2));
            nibbles += 1;
        }
        i += 1;
    }
    assert!(nibbles == 32, "not a UUID");
    bytes
}

// Tables by index (for the log), with their UUIDs.
const CUDART: usize = 0;
const CALLBACK_HOOKS: usize = 1;
const TOOLS_TLS: usize = 2;
const CONTEXT_STORAGE: usize = 3;
const GREEN_CONTEXT: usize = 4;
const INTEGRITY: usize = 5;
const TOOLS_CONTEXT: usize = 6;
const UNKNOWN_69A2: usize = 7;
const UNKNOWN_DA91: usize = 8;
const UNKNOWN_F8CF: usize = 9;
const TOOLS_MODULE: usize = 10;

const NAMES: [&str; 11] = [
    "6BD5FB6C (cudart interface)",
    "A094798C (tools runtime callback hooks)",
    "42D85A81 (tools TLS)",
    "C693336E (context-local storage)",
    "263E8860 (green context)",
    "D4082055 (integrity check)",
    "21318C60 (tools context)",
    "69A28E9F (NVML's)",
    "DA9151D3 (NVRTC's JIT cache)",
    "F8CFF951",
    "6E163FBE (tools module)",
];

const CUDART_ID: [u8; 16] = uuid("6BD5FB6C-5BF4-E74A-8987-D93912FD9DF9");
const CALLBACK_HOOKS_ID: [u8; 16] = uuid("A094798C-2E74-2E74-93F2-0800200C0A66");
const TOOLS_TLS_ID: [u8; 16] = uuid("42D85A81-23F6-CB47-8298-F6E78A3AECDC");
const CONTEXT_STORAGE_ID: [u8; 16] = uuid("C693336E-1121-DF11-A8C3-68F355D89593");
const GREEN_CONTEXT_ID: [u8; 16] = uuid("263E8860-7CD2-6143-92F6-BBD5006DFA7E");
const INTEGRITY_ID: [u8; 16] = uuid("D4082055-BDE6-704B-8D34-BA123C66E1F2");
const TOOLS_CONTEXT_ID: [u8; 16] = uuid("21318C60-9714-3248-8CA6-41FF7324C8F2");
const UNKNOWN_69A2_ID: [u8; 16] = uuid("69A28E9F-2449-8B47-B030-C5DA330EA4E9");
const UNKNOWN_DA91_ID: [u8; 16] = uuid("DA9151D3-3AE6-CC41-A5C0-4F26D533E328");
const UNKNOWN_F8CF_ID: [u8; 16] = uuid("F8CFF951-2146-8B4E-B9E2-FB469E7C0DD9");
const TOOLS_MODULE_ID: [u8; 16] = uuid("6E163FBE-B958-444D-835C-E182AFF1991E");

/// The table with this UUID, or `None` (the caller answers CUDA_ERROR_INVALID_VALUE).
pub fn get(id: &[u8; 16]) -> Option<*const c_void> {
    let table = match *id {
        CUDART_ID => CUDART_TABLE.base(),
        CALLBACK_HOOKS_ID => CALLBACK_HOOKS_TABLE.base(),
        TOOLS_TLS_ID => TOOLS_TLS_TABLE.base(),
        CONTEXT_STORAGE_ID => CONTEXT_STORAGE_TABLE.base(),
        GREEN_CONTEXT_ID => GREEN_CONTEXT_TABLE.base(),
        INTEGRITY_ID => INTEGRITY_TABLE.base(),
        TOOLS_CONTEXT_ID => TOOLS_CONTEXT_TABLE.base(),
        UNKNOWN_69A2_ID => UNKNOWN_69A2_TABLE.base(),
        UNKNOWN_DA91_ID => UNKNOWN_DA91_TABLE.base(),
        UNKNOWN_F8CF_ID => UNKNOWN_F8CF_TABLE.base(),
        TOOLS_MODULE_ID => TOOLS_MODULE_TABLE.base(),
        _ => {
            static SEEN: Mutex<Vec<[u8; 16]>> = Mutex::new(Vec::new());
            let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
            if !seen.contains(id) {
                seen.push(*id);
                let hex = hex::encode(id);
                log::debug!("rgpu: cuGetExportTable: no table {hex}");
            }
            return None;
        }
    };
    Some(table)
}

/// A slot rgpu does not implement.
extern "C" fn unsupported<const TABLE: usize, const SLOT: usize>() -> CUresult {
    static SEEN: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    if !seen.contains(&(TABLE, SLOT)) {
        seen.push((TABLE, SLOT));
        // NVML asks its table at every init and copes with refusals: not worth a warning.
        let level = if TABLE == UNKNOWN_69A2 {
            log::Level::Debug
        } else {
            log::Level::Warn
        };
        log::log!(
            level,
            "rgpu: private driver table {} slot {SLOT} is not supported; returning CUDA_ERROR_NOT_SUPPORTED",
            NAMES[TABLE]
        );
    }
    CUresult::CUDA_ERROR_NOT_SUPPORTED
}

/// `ctx`, or the calling thread's current context when it is null.
fn context_or_current(ctx: CUcontext) -> Result<CUcontext, CUresult> {
    let ctx = if ctx.is_null() {
        objects::current_handle()
    } else {
        ctx
    };
    if ctx.is_null() {
        Err(CUresult::CUDA_ERROR_INVALID_CONTEXT)
    } else {
        Ok(ctx)
    }
}

// ---- 6BD5FB6C: cudart interface. Slots 1, 6 and 8 load modules from fat binaries; cudart 12+
// loads through the public API instead, so they stay stubs.

static CUDART_TABLE: Table<13> = table!(CUDART, 13, {
    2 => cudart_device_primary_ctx,
    7 => cudart_fatbin_destroyed,
});

/// A device's primary context handle, neither retained nor made current (cudart retains it
/// through the public API later, and must get the same handle).
unsafe extern "C" fn cudart_device_primary_ctx(pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    callback(
        "cudart_device_primary_ctx",
        CUresult::CUDA_ERROR_UNKNOWN,
        || {
            status(
                servers::device(dev)
                    // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
                    .and_then(|device| unsafe { write_out(pctx, device.primary().handle()) }),
            )
        },
    )
}

/// Nothing to forget: slot 1 never loads a fat binary here.
extern "C" fn cudart_fatbin_destroyed(_fatbin: *const c_void) {}

// ---- A094798C: tools runtime callback hooks. All-zero enable buffers tell cudart that no
// profiler subscribed to any callback, so it never issues one.

static CALLBACK_HOOKS_TABLE: Table<7> = table!(CALLBACK_HOOKS, 7, {
    2 => hooks_enable_buffer,
    3 => stream_id,
    4 => context_id,
    6 => hooks_internal_enable_buffer,
});

// Writable memory (atomics), in case a caller writes to its flags.
static ENABLE_BUFFER: [AtomicU32; 4096] = [const { AtomicU32::new(0) }; 4096];
static INTERNAL_ENABLE_BUFFER: [AtomicU32; 256] = [const { AtomicU32::new(0) }; 256];

unsafe fn write_buffer(
    buffer: &'static [AtomicU32],
    out: *mut *const AtomicU32,
    entries: *mut usize,
) {
    // SAFETY: cudart passes writable out-pointers; null ones are skipped.
    unsafe {
        if !out.is_null() {
            out.write(buffer.as_ptr());
        }
        if !entries.is_null() {
            entries.write(buffer.len());
        }
    }
}

unsafe extern "C" fn hooks_enable_buffer(out: *mut *const AtomicU32, entries: *mut usize) {
    callback("hooks_enable_buffer", (), || {
        // SAFETY: cudart's out-pointers for the buffer and its length, as the table's contract says.
        unsafe { write_buffer(&ENABLE_BUFFER, out, entries) }
    })
}

unsafe extern "C" fn hooks_internal_enable_buffer(out: *mut *const AtomicU32, entries: *mut usize) {
    callback("hooks_internal_enable_buffer", (), || {
        // SAFETY: cudart's out-pointers for the buffer and its length, as the table's contract says.
        unsafe { write_buffer(&INTERNAL_ENABLE_BUFFER, out, entries) }
    })
}

/// A process-unique id of a context (null: the current one), as cuCtxGetId.
unsafe extern "C" fn context_id(ctx: CUcontext, id: *mut u64) -> CUresult {
    callback("context_id", CUresult::CUDA_ERROR_UNKNOWN, || {
        status(context_or_current(ctx).and_then(|ctx| {
            let unique =
                objects::context_unique_id(ctx).ok_or(CUresult::CUDA_ERROR_INVALID_CONTEXT)?;
            // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
            unsafe { write_out(id, unique) }
        }))
    })
}

/// A process-unique id of a stream (or of a tools handle, which here is the stream handle).
unsafe extern "C" fn stream_id(_ctx: CUcontext, stream: CUstream, id: *mut u64) -> CUresult {
    callback("stream_id", CUresult::CUDA_ERROR_UNKNOWN, || {
        status(
            objects::stream_unique_id(stream)
                .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)
                // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
                .and_then(|unique| unsafe { write_out(id, unique) }),
        )
    })
}

// ---- 42D85A81: tools TLS, cuCtxSetCurrent/cuCtxGetCurrent for saving and restoring. Slot 3
// is served as a stub for callers that expect a fourth slot.

static TOOLS_TLS_TABLE: Table<4> = table!(TOOLS_TLS, 4, {
    1 => tls_set_current,
    2 => tls_get_current,
});

unsafe extern "C" fn tls_set_current(ctx: CUcontext) -> CUresult {
    callback("tls_set_current", CUresult::CUDA_ERROR_UNKNOWN, || {
        if !ctx.is_null() && Context::from_handle(ctx).is_none() {
            return CUresult::CUDA_ERROR_INVALID_CONTEXT;
        }
        objects::set_current(ctx);
        CUresult::CUDA_SUCCESS
    })
}

unsafe extern "C" fn tls_get_current(pctx: *mut CUcontext) -> CUresult {
    callback("tls_get_current", CUresult::CUDA_ERROR_UNKNOWN, || {
        // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
        status(unsafe { write_out(pctx, objects::current_handle()) })
    })
}

// ---- C693336E: context-local storage, a (context, key) -> data map with a destructor per
// entry. This table has no size slot; slots past 2 are spare stubs.

type StorageDestructor = unsafe extern "C" fn(CUcontext, *mut c_void, *mut c_void);

struct Stored {
    data: usize,
    destroy: Option<StorageDestructor>,
}

/// By (context address, key address).
static STORAGE: Mutex<BTreeMap<(usize, usize), Stored>> = Mutex::new(BTreeMap::new());

static CONTEXT_STORAGE_TABLE: Table<10> = table!(CONTEXT_STORAGE, 10, {
    0 => storage_register,
    1 => storage_unregister,
    2 => storage_get,
});

fn storage() -> std::sync::MutexGuard<'static, BTreeMap<(usize, usize), Stored>> {
    STORAGE.lock().unwrap_or_else(|e| e.into_inner())
}

unsafe extern "C" fn storage_register(
    ctx: CUcontext,
    key: *mut c_void,
    data: *mut c_void,
    destroy: Option<StorageDestructor>,
) -> CUresult {
    callback("storage_register", CUresult::CUDA_ERROR_UNKNOWN, || {
        status(context_or_current(ctx).map(|ctx| {
            let stored = Stored {
                data: data as usize,
                destroy,
            };
            storage().insert((ctx as usize, key as usize), stored);
        }))
    })
}

unsafe extern "C" fn storage_unregister(ctx: CUcontext, key: *mut c_void) -> CUresult {
    callback("storage_unregister", CUresult::CUDA_ERROR_UNKNOWN, || {
        status(context_or_current(ctx).and_then(|ctx| {
            match storage().remove(&(ctx as usize, key as usize)) {
                Some(_) => Ok(()),
                None => Err(CUresult::CUDA_ERROR_INVALID_HANDLE),
            }
        }))
    })
}

/// On a miss `*data` is left alone and the error tells cudart to make its state and register.
unsafe extern "C" fn storage_get(
    data: *mut *mut c_void,
    ctx: CUcontext,
    key: *mut c_void,
) -> CUresult {
    callback("storage_get", CUresult::CUDA_ERROR_UNKNOWN, || {
        status(context_or_current(ctx).and_then(|ctx| {
            let value = storage()
                .get(&(ctx as usize, key as usize))
                .map(|stored| stored.data)
                .ok_or(CUresult::CUDA_ERROR_INVALID_HANDLE)?;
            // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
            unsafe { write_out(data, value as *mut c_void) }
        }))
    })
}

/// Runs and forgets the storage destructors of a context that was just destroyed (or a
/// primary context that was reset).
pub fn context_destroyed(ctx: CUcontext) {
    let key = ctx as usize;
    let entries: Vec<((usize, usize), Stored)> = {
        let mut storage = storage();
        let keys: Vec<(usize, usize)> = storage
            .range((key, 0)..=(key, usize::MAX))
            .map(|(k, _)| *k)
            .collect();
        keys.into_iter()
            .filter_map(|k| storage.remove(&k).map(|v| (k, v)))
            .collect()
    };
    // Outside the lock: a destructor may call back into this table.
    for ((_, key), stored) in entries {
        if let Some(destroy) = stored.destroy {
            // SAFETY: the destructor and its arguments are what the program registered.
            unsafe { destroy(ctx, key as *mut c_void, stored.data as *mut c_void) };
        }
    }
}

// ---- 263E8860: green contexts. rgpu has none: every context is a legacy one.

static GREEN_CONTEXT_TABLE: Table<15> = table!(GREEN_CONTEXT, 15, {
    2 => green_ctx_get_type,
    3 => green_ctx_support_enabled,
});

/// Type 0 (legacy); the primary-context out-parameter is only for green contexts.
unsafe extern "C" fn green_ctx_get_type(
    _ctx: CUcontext,
    kind: *mut c_int,
    _primary: *mut CUcontext,
) -> CUresult {
    callback("green_ctx_get_type", CUresult::CUDA_ERROR_UNKNOWN, || {
        // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
        status(unsafe { write_out(kind, 0) })
    })
}

extern "C" fn green_ctx_support_enabled() -> c_int {
    0
}

// ---- D4082055: integrity check. cudart asks for a keyed hash of process facts and fails
// every call with error 103 if the answer is wrong, so it is computed here from the same
// values the public API reports.

static INTEGRITY_TABLE: Table<3> = table!(INTEGRITY, 3, {
    1 => integrity_check,
});

/// The HMAC key, and the fixed answers for versions ending in 0 and 1.
const INTEGRITY_KEY: [u8; 16] = [
    0x14, 0x6a, 0xdd, 0xae, 0x53, 0xa9, 0xa7, 0x52, 0xaa, 0x08, 0x41, 0x36, 0x0b, 0xf5, 0x5a, 0x9f,
];
const INTEGRITY_FIXED: [u8; 16] = [
    0x5c, 0x67, 0xcb, 0x03, 0x1c, 0x18, 0x41, 0x33, 0xe8, 0xd1, 0x4c, 0x1f, 0xaa, 0x83, 0xd3, 0x8e,
];

extern "C" {
    fn pthread_self() -> usize;
}

/// What the integrity hash covers besides the devices.
struct IntegrityInput {
    driver_version: u32,
    version: u32,
    pid: u32,
    tid: u32,
    cudart_table: u64,
    integrity_table: u64,
    check_function: u64,
    unix_seconds: u64,
}

/// A device as hashed: UUID, PCI domain, bus and device.
type DeviceFacts = ([u8; 16], i32, i32, i32);

fn integrity_message(input: &IntegrityInput, devices: &[DeviceFacts]) -> Vec<u8> {
    let mut message = Vec::with_capacity(48 + 28 * devices.len());
    for word in [input.driver_version, input.version, input.pid, input.tid] {
        message.extend_from_slice(&word.to_le_bytes());
    }
    for word in [
        input.cudart_table,
        input.integrity_table,
        input.check_function,
        input.unix_seconds,
    ] {
        message.extend_from_slice(&word.to_le_bytes());
    }
    for (uuid, domain, bus, device) in devices {
        message.extend_from_slice(uuid);
        for value in [domain, bus, device] {
            message.extend_from_slice(&value.to_le_bytes());
        }
    }
    message
}

fn integrity_hash(version: u32, unix_seconds: u64) -> [u8; 16] {
    match version % 10 {
        0 => INTEGRITY_FIXED,
        1 => {
            let mut fixed = INTEGRITY_FIXED;
            fixed[7] = 0x18;
            fixed
        }
        _ => {
            let input = IntegrityInput {
                driver_version: servers::driver_version() as u32,
                version,
                pid: std::process::id(),
                // SAFETY: pthread_self has no preconditions; the hash takes its low 32 bits.
                tid: unsafe { pthread_self() } as u32,
                cudart_table: CUDART_TABLE.base() as u64,
                integrity_table: INTEGRITY_TABLE.base() as u64,
                check_function: INTEGRITY_TABLE.0[1] as u64,
                unix_seconds,
            };
            let devices: Vec<DeviceFacts> = match servers::servers() {
                Ok(runtime) => runtime
                    .devices
                    .iter()
                    .map(|device| {
                        let attribute = |a: u32| device.attribute(a).unwrap_or(0);
                        (
                            device.info.uuid,
                            attribute(50),
                            attribute(33),
                            attribute(34),
                        )
                    })
                    .collect(),
                Err(_) => Vec::new(),
            };
            md2::hmac(&INTEGRITY_KEY, &integrity_message(&input, &devices))
        }
    }
}

unsafe extern "C" fn integrity_check(
    version: c_uint,
    unix_seconds: u64,
    result: *mut u8,
) -> CUresult {
    callback("integrity_check", CUresult::CUDA_ERROR_UNKNOWN, || {
        if result.is_null() {
            return CUresult::CUDA_ERROR_INVALID_VALUE;
        }
        let hash = integrity_hash(version, unix_seconds);
        // SAFETY: cudart passes 16 writable bytes (not necessarily aligned).
        unsafe { std::ptr::copy_nonoverlapping(hash.as_ptr(), result, hash.len()) };
        CUresult::CUDA_SUCCESS
    })
}

// ---- 21318C60: tools context (cuBLAS/cuBLASLt). Tools stream handles are the public stream
// handles, with a null stream named by its legacy or per-thread handle.

static TOOLS_CONTEXT_TABLE: Table<93> = table!(TOOLS_CONTEXT, 93, {
    4 => context_id,
    39 => stream_id,
    51 => tools_stream_handle,
});

unsafe extern "C" fn tools_stream_handle(
    _ctx: CUcontext,
    stream: CUstream,
    out: *mut CUstream,
    per_thread: u8,
) -> CUresult {
    callback("tools_stream_handle", CUresult::CUDA_ERROR_UNKNOWN, || {
        let handle = match stream as usize {
            // A non-null handle, which still means the default stream.
            0 if per_thread != 0 => 0x2 as CUstream,
            0 => 0x1 as CUstream,
            _ => stream,
        };
        // SAFETY: an out-pointer from the caller: null (refused by write_out) or writable, as the API requires.
        status(unsafe { write_out(out, handle) })
    })
}

// ---- DA9151D3: NVRTC's handle on the driver's JIT compile cache (seen from libnvrtc, once
// per nvrtcCompileProgram; slot 1 opens a cache entry, 2 closes it, 3 looks up, 4 stores, 6
// frees). Slot 1 answers as the driver does with its cache off (CUDA_CACHE_DISABLE=1):
// CUDA_ERROR_NOT_INITIALIZED, nothing written; NVRTC then compiles without the cache, which is
// the right thing for a cache that would live on the client while the driver is remote.

static UNKNOWN_DA91_TABLE: Table<7> = table!(UNKNOWN_DA91, 7, {
    1 => jit_cache_disabled,
});

extern "C" fn jit_cache_disabled() -> CUresult {
    CUresult::CUDA_ERROR_NOT_INITIALIZED
}

// ---- 69A28E9F: NVML's private interface into libcuda (called from nvmlInit and
// nvmlShutdown; with every slot refused, NVML answers its public calls the same). Slot 19
// must never succeed: the slot NVML calls next returns a pointer it then uses.
// F8CFF951: three words, slots never seen called. Stubs only.

static UNKNOWN_69A2_TABLE: Table<34> = table!(UNKNOWN_69A2, 34, {});
static UNKNOWN_F8CF_TABLE: Table<3> = table!(UNKNOWN_F8CF, 3, {});

// ---- 6E163FBE: the tools' module interface (99 words). cuFFT calls slot 7 after each module
// it loads, to learn the module's kernels; without it every cuFFT plan fails.

static TOOLS_MODULE_TABLE: Table<99> = table!(TOOLS_MODULE, 99, {
    7 => module_functions,
});

/// What slot 7 calls for each function of the module.
type FunctionVisitor =
    unsafe extern "C" fn(opaque: *mut c_void, function: CUfunction, name: *const std::ffi::c_char);

/// Calls `visit(opaque, function, name)` for each function of `module`, in the driver's
/// order, on the calling thread (the function handles are those cuModuleGetFunction gives,
/// the names live as long as the module); returns how many there are.
unsafe extern "C" fn module_functions(
    _ctx: CUcontext,
    module: CUmodule,
    visit: Option<FunctionVisitor>,
    opaque: *mut c_void,
) -> u64 {
    let opaque = opaque as usize;
    // A panic counts as an empty module.
    callback("module_functions", 0, || {
        let Ok(image) = crate::api::module::listed_functions(module.cast()) else {
            return 0;
        };
        let listed = image.listed.get().map(Vec::as_slice).unwrap_or(&[]);
        if let Some(visit) = visit {
            for (handle, name) in listed {
                // SAFETY: the caller's callback and its argument, with a live function handle
                // and a name that outlives the call.
                unsafe { visit(opaque as *mut c_void, *handle as CUfunction, name.as_ptr()) };
            }
        }
        listed.len() as u64
    })
}

/// MD2 (RFC 1319) and HMAC over it with a 16-byte block, as the integrity check uses them.
mod md2 {
    /// The RFC's substitution table, built from the digits of pi.
    const S: [u8; 256] = [
        0x29, 0x2E, 0x43, 0xC9, 0xA2, 0xD8, 0x7C, 0x01, 0x3D, 0x36, 0x54, 0xA1, 0xEC, 0xF0, 0x06,
        0x13, 0x62, 0xA7, 0x05, 0xF3, 0xC0, 0xC7, 0x73, 0x8C, 0x98, 0x93, 0x2B, 0xD9, 0xBC, 0x4C,
        0x82, 0xCA, 0x1E, 0x9B, 0x57, 0x3C, 0xFD, 0xD4, 0xE0, 0x16, 0x67, 0x42, 0x6F, 0x18, 0x8A,
        0x17, 0xE5, 0x12, 0xBE, 0x4E, 0xC4, 0xD6, 0xDA, 0x9E, 0xDE, 0x49, 0xA0, 0xFB, 0xF5, 0x8E,
        0xBB, 0x2F, 0xEE, 0x7A, 0xA9, 0x68, 0x79, 0x91, 0x15, 0xB2, 0x07, 0x3F, 0x94, 0xC2, 0x10,
        0x89, 0x0B, 0x22, 0x5F, 0x21, 0x80, 0x7F, 0x5D, 0x9A, 0x5A, 0x90, 0x32, 0x27, 0x35, 0x3E,
        0xCC, 0xE7, 0xBF, 0xF7, 0x97, 0x03, 0xFF, 0x19, 0x30, 0xB3, 0x48, 0xA5, 0xB5, 0xD1, 0xD7,
        0x5E, 0x92, 0x2A, 0xAC, 0x56, 0xAA, 0xC6, 0x4F, 0xB8, 0x38, 0xD2, 0x96, 0xA4, 0x7D, 0xB6,
        0x76, 0xFC, 0x6B, 0xE2, 0x9C, 0x74, 0x04, 0xF1, 0x45, 0x9D, 0x70, 0x59, 0x64, 0x71, 0x87,
        0x20, 0x86, 0x5B, 0xCF, 0x65, 0xE6, 0x2D, 0xA8, 0x02, 0x1B, 0x60, 0x25, 0xAD, 0xAE, 0xB0,
        0xB9, 0xF6, 0x1C, 0x46, 0x61, 0x69, 0x34, 0x40, 0x7E, 0x0F, 0x55, 0x47, 0xA3, 0x23, 0xDD,
        0x51, 0xAF, 0x3A, 0xC3, 0x5C, 0xF9, 0xCE, 0xBA, 0xC5, 0xEA, 0x26, 0x2C, 0x53, 0x0D, 0x6E,
        0x85, 0x28, 0x84, 0x09, 0xD3, 0xDF, 0xCD, 0xF4, 0x41, 0x81, 0x4D, 0x52, 0x6A, 0xDC, 0x37,
        0xC8, 0x6C, 0xC1, 0xAB, 0xFA, 0x24, 0xE1, 0x7B, 0x08, 0x0C, 0xBD, 0xB1, 0x4A, 0x78, 0x88,
        0x95, 0x8B, 0xE3, 0x63, 0xE8, 0x6D, 0xE9, 0xCB, 0xD5, 0xFE, 0x3B, 0x00, 0x1D, 0x39, 0xF2,
        0xEF, 0xB7, 0x0E, 0x66, 0x58, 0xD0, 0xE4, 0xA6, 0x77, 0x72, 0xF8, 0xEB, 0x75, 0x4B, 0x0A,
        0x31, 0x44, 0x50, 0xB4, 0x8F, 0xED, 0x1F, 0x1A, 0xDB, 0x99, 0x8D, 0x33, 0x9F, 0x11, 0x83,
        0x14,
    ];

    /// Mixes one 16-byte block into the 48-byte state.
    fn compress(state: &mut [u8; 48], block: &[u8]) {
        for j in 0..16 {
            state[16 + j] = block[j];
            state[32 + j] = block[j] ^ state[j];
        }
        let mut t = 0u8;
        for round in 0..18u8 {
            for byte in state.iter_mut() {
                *byte ^= S[t as usize];
                t = *byte;
            }
            t = t.wrapping_add(round);
        }
    }

    pub fn digest(message: &[u8]) -> [u8; 16] {
        let pad = 16 - message.len() % 16;
        let mut data = message.to_vec();
        data.resize(message.len() + pad, pad as u8);
        let mut checksum = [0u8; 16];
        let mut last = 0u8;
        for block in data.as_chunks::<16>().0 {
            for (c, &m) in checksum.iter_mut().zip(block) {
                *c ^= S[(m ^ last) as usize];
                last = *c;
            }
        }
        data.extend_from_slice(&checksum);
        let mut state = [0u8; 48];
        for block in data.as_chunks::<16>().0 {
            compress(&mut state, block);
        }
        state[..16].try_into().unwrap()
    }

    pub fn hmac(key: &[u8; 16], message: &[u8]) -> [u8; 16] {
        let mut inner = key.map(|b| b ^ 0x36).to_vec();
        inner.extend_from_slice(message);
        let mut outer = key.map(|b| b ^ 0x5c).to_vec();
        outer.extend_from_slice(&digest(&inner));
        digest(&outer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(bytes: &[u8]) -> String {
        hex::encode(bytes)
    }

    fn slot(table: *const c_void, index: usize) -> usize {
        // SAFETY: test: `index` is within the table `table` points at.
        unsafe { *(table as *const usize).add(index) }
    }

    #[test]
    fn md2_rfc_1319_vectors() {
        let vectors: [(&str, &str); 7] = [
            ("", "8350e5a3e24c153df2275c9f80692773"),
            ("a", "32ec01ec4a6dac72c0ab96fb34c0b5d1"),
            ("abc", "da853b0d3f88d99b30283a69e6ded6bb"),
            ("message digest", "ab4f496bfb2a530b219ff33031fe06b0"),
            (
                "abcdefghijklmnopqrstuvwxyz",
                "4e8ddff3650292ab5a4108c3aa47940b",
            ),
            (
                "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789",
                "da33def2a42df13975352846c30338cd",
            ),
            (
                "12345678901234567890123456789012345678901234567890123456789012345678901234567890",
                "d5976f79d83d3a0dc9806c3c66f3efd8",
            ),
        ];
        for (message, digest) in vectors {
            assert_eq!(
                hex(&md2::digest(message.as_bytes())),
                digest,
                "MD2({message:?})"
            );
        }
    }

    #[test]
    fn integrity_hash_matches_the_reference_vector() {
        let input = IntegrityInput {
            driver_version: 0x2f30,
            version: 12082,
            pid: 0x2fa423,
            tid: 0xf79c1000,
            cudart_table: 0x7ffff6958240,
            integrity_table: 0x7ffff6958220,
            check_function: 0x7ffff2aaf4a0,
            unix_seconds: 0x682b9cee,
        };
        let mut uuid = [0u8; 16];
        uuid.iter_mut().enumerate().for_each(|(i, b)| *b = i as u8);
        let message = integrity_message(&input, &[(uuid, 0, 2, 0)]);
        assert_eq!(message.len(), 48 + 28);
        let hash = md2::hmac(&INTEGRITY_KEY, &message);
        assert_eq!(hex(&hash), "a3eeacd0586e670a0df482b8d8d0bcf8");
    }

    #[test]
    fn integrity_check_fixed_answers() {
        let mut out = [0u64; 2];
        let table = get(&INTEGRITY_ID).unwrap();
        assert_eq!(slot(table, 1), integrity_check as *const () as usize);
        // SAFETY: test: pointers to live locals (or null where the function refuses it).
        let result = unsafe { integrity_check(13000, 1, out.as_mut_ptr().cast()) };
        assert_eq!(result, CUresult::CUDA_SUCCESS);
        assert_eq!(out, [0x3341181C03CB675C, 0x8ED383AA1F4CD1E8]);
        // SAFETY: test: pointers to live locals (or null where the function refuses it).
        unsafe { integrity_check(13001, 1, out.as_mut_ptr().cast()) };
        assert_eq!(out, [0x1841181C03CB675C, 0x8ED383AA1F4CD1E8]);
        // Hashed answers depend on the call's time.
        let mut a = [0u8; 16];
        let mut b = [0u8; 16];
        // SAFETY: test: pointers to live locals (or null where the function refuses it).
        unsafe { integrity_check(13002, 1, a.as_mut_ptr()) };
        // SAFETY: test: pointers to live locals (or null where the function refuses it).
        unsafe { integrity_check(13002, 2, b.as_mut_ptr()) };
        assert_ne!(a, b);
        // SAFETY: test: pointers to live locals (or null where the function refuses it).
        let result = unsafe { integrity_check(13002, 1, std::ptr::null_mut()) };
        assert_eq!(result, CUresult::CUDA_ERROR_INVALID_VALUE);
    }

    #[test]
    fn uuids_match_their_dashed_bytes() {
        let cudart = [
            0x6b, 0xd5, 0xfb, 0x6c, 0x5b, 0xf4, 0xe7, 0x4a, 0x89, 0x87, 0xd9, 0x39, 0x12, 0xfd,
            0x9d, 0xf9,
        ];
        assert_eq!(CUDART_ID, cudart);
        assert_eq!(get(&cudart), Some(CUDART_TABLE.base()));
        let mut other = cudart;
        other[15] ^= 1;
        assert_eq!(get(&other), None);
        // Stable addresses: the same table every time.
        assert_eq!(get(&TOOLS_TLS_ID), get(&TOOLS_TLS_ID));
    }

    #[test]
    fn sizes_in_slot_0_and_no_null_slots() {
        let sized: [([u8; 16], usize); 9] = [
            (CUDART_ID, 13),
            (CALLBACK_HOOKS_ID, 7),
            (TOOLS_TLS_ID, 4),
            (GREEN_CONTEXT_ID, 15),
            (INTEGRITY_ID, 3),
            (TOOLS_CONTEXT_ID, 93),
            (UNKNOWN_69A2_ID, 34),
            (UNKNOWN_DA91_ID, 7),
            (UNKNOWN_F8CF_ID, 3),
        ];
        for (id, slots) in sized {
            let table = get(&id).unwrap();
            assert_eq!(slot(table, 0), slots * 8, "table {}", hex(&id));
            let functions: Vec<usize> = (1..slots).map(|i| slot(table, i)).collect();
            assert!(functions.iter().all(|&f| f != 0));
        }
        let storage = get(&CONTEXT_STORAGE_ID).unwrap();
        assert_eq!(slot(storage, 0), storage_register as *const () as usize);
        // Each stub is its own function, so the log can name its slot.
        let stubs: Vec<usize> = (1..93)
            .map(|i| slot(TOOLS_CONTEXT_TABLE.base(), i))
            .collect();
        let mut unique = stubs.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), stubs.len());
    }

    #[test]
    fn the_tools_module_table_is_as_large_as_the_drivers() {
        let table = get(&TOOLS_MODULE_ID).expect("a table") as *const u64;
        // SAFETY: test: the table's first word is its size in bytes (0x318 in driver 580).
        assert_eq!(unsafe { table.read() }, 0x318);
        assert_eq!(
            slot(table.cast(), 7),
            module_functions as *const () as usize
        );
    }

    #[test]
    fn stubs_answer_not_supported() {
        let stub: extern "C" fn() -> CUresult =
            // SAFETY: test: slot 5 of that table holds a stub of this signature.
            unsafe { std::mem::transmute(slot(UNKNOWN_69A2_TABLE.base(), 5)) };
        assert_eq!(stub(), CUresult::CUDA_ERROR_NOT_SUPPORTED);
        assert_eq!(green_ctx_support_enabled(), 0);
        let mut kind = 7;
        let result =
            // SAFETY: test: pointers to live locals (or null where the function refuses it).
            unsafe { green_ctx_get_type(std::ptr::null_mut(), &mut kind, std::ptr::null_mut()) };
        assert_eq!((result, kind), (CUresult::CUDA_SUCCESS, 0));
    }

    #[test]
    fn enable_buffers_are_zeroed() {
        let mut buffer = std::ptr::null();
        let mut entries = 0;
        // SAFETY: test: pointers to live locals (or null where the function refuses it).
        unsafe { hooks_enable_buffer(&mut buffer, &mut entries) };
        assert_eq!(entries, 4096);
        // SAFETY: test: the buffer has `entries` flags and lives as long as the process.
        let flags = unsafe { std::slice::from_raw_parts(buffer, entries) };
        assert!(flags
            .iter()
            .all(|f| f.load(std::sync::atomic::Ordering::Relaxed) == 0));
        // SAFETY: test: pointers to live locals (or null where the function refuses it).
        unsafe { hooks_internal_enable_buffer(&mut buffer, &mut entries) };
        assert_eq!(entries, 256);
    }

    static DESTROYED: Mutex<Vec<(usize, usize, usize)>> = Mutex::new(Vec::new());

    unsafe extern "C" fn record_destroy(ctx: CUcontext, key: *mut c_void, data: *mut c_void) {
        DESTROYED
            .lock()
            .unwrap()
            .push((ctx as usize, key as usize, data as usize));
    }

    #[test]
    fn context_storage_round_trip() {
        let ctx = 0x5000 as CUcontext;
        let other = 0x6000 as CUcontext;
        let (key, data) = (0x10 as *mut c_void, 0x99 as *mut c_void);
        let untouched = std::ptr::dangling_mut::<c_void>();
        let mut out = untouched;
        // SAFETY: test: pointers to live locals (or null where the function refuses it).
        let miss = unsafe { storage_get(&mut out, ctx, key) };
        assert_eq!(
            (miss, out),
            (CUresult::CUDA_ERROR_INVALID_HANDLE, untouched)
        );

        // SAFETY: test: pointers to live locals (or null where the function refuses it).
        let ok = unsafe { storage_register(ctx, key, data, Some(record_destroy)) };
        assert_eq!(ok, CUresult::CUDA_SUCCESS);
        assert_eq!(
            // SAFETY: test: pointers to live locals (or null where the function refuses it).
            unsafe { storage_get(&mut out, ctx, key) },
            CUresult::CUDA_SUCCESS
        );
        assert_eq!(out, data);
        assert_eq!(
            // SAFETY: test: pointers to live locals (or null where the function refuses it).
            unsafe { storage_get(&mut out, other, key) },
            CUresult::CUDA_ERROR_INVALID_HANDLE
        );

        assert_eq!(
            // SAFETY: test: pointers to live locals (or null where the function refuses it).
            unsafe { storage_unregister(ctx, key) },
            CUresult::CUDA_SUCCESS
        );
        assert_eq!(
            // SAFETY: test: pointers to live locals (or null where the function refuses it).
            unsafe { storage_get(&mut out, ctx, key) },
            CUresult::CUDA_ERROR_INVALID_HANDLE
        );
        assert_eq!(
            // SAFETY: test: pointers to live locals (or null where the function refuses it).
            unsafe { storage_unregister(ctx, key) },
            CUresult::CUDA_ERROR_INVALID_HANDLE
        );

        // Destroying a context runs its destructors, and only its own.
        // SAFETY: test: pointers to live locals (or null where the function refuses it).
        unsafe { storage_register(ctx, key, data, Some(record_destroy)) };
        // SAFETY: test: pointers to live locals (or null where the function refuses it).
        unsafe { storage_register(other, key, data, Some(record_destroy)) };
        context_destroyed(ctx);
        assert_eq!(*DESTROYED.lock().unwrap(), [(0x5000, 0x10, 0x99)]);
        assert_eq!(
            // SAFETY: test: pointers to live locals (or null where the function refuses it).
            unsafe { storage_get(&mut out, ctx, key) },
            CUresult::CUDA_ERROR_INVALID_HANDLE
        );
        assert_eq!(
            // SAFETY: test: pointers to live locals (or null where the function refuses it).
            unsafe { storage_get(&mut out, other, key) },
            CUresult::CUDA_SUCCESS
        );
        context_destroyed(other);

        // No context given and none current.
        // SAFETY: test: pointers to live locals (or null where the function refuses it).
        let none = unsafe { storage_get(&mut out, std::ptr::null_mut(), key) };
        assert_eq!(none, CUresult::CUDA_ERROR_INVALID_CONTEXT);
    }

    #[test]
    fn tools_stream_handles_are_never_null() {
        let mut handle = std::ptr::null_mut();
        let (null, default) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: test: pointers to live locals (or null where the function refuses it).
        unsafe { tools_stream_handle(null, default, &mut handle, 0) };
        assert_eq!(handle as usize, 1);
        // SAFETY: test: pointers to live locals (or null where the function refuses it).
        unsafe { tools_stream_handle(null, default, &mut handle, 1) };
        assert_eq!(handle as usize, 2);
        // SAFETY: test: pointers to live locals (or null where the function refuses it).
        unsafe { tools_stream_handle(null, 0x7000 as CUstream, &mut handle, 0) };
        assert_eq!(handle as usize, 0x7000);
    }
}
