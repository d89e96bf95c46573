//! Queries forwarded to this server's NVML (`ForwardNvml`): a getter of the forwarding table
//! (rgpu_protocol::nvml::forwarded), called with buffers this process owns, of the sizes the
//! table states (and never more than FORWARD_MAX_BYTES together), on the NVML device of the
//! query's CUDA ordinal. The client's bytes only fill those buffers; no pointer it sends is
//! ever used. Only getters are listed: a client never changes a GPU's settings.

use std::collections::HashMap;
use std::sync::Mutex;

use rgpu_protocol::nvml::{
    forwarded, NvmlAnswer, NvmlArg, NvmlQuery, Param, FORWARD_MAX_BYTES, FORWARD_MAX_TEXT,
};

/// `NVML_ERROR_INVALID_ARGUMENT`, `NVML_ERROR_NOT_SUPPORTED`.
pub(super) const INVALID_ARGUMENT: u32 = 2;
pub(super) const NOT_SUPPORTED: u32 = 3;
/// `NVML_ERROR_NOT_FOUND`.
pub(super) const NOT_FOUND: u32 = 6;
/// Bytes past each buffer's stated size: room should an NVML write a little more than the
/// header this table came from declared.
const SLACK: usize = 256;
/// The most C arguments a forwarded function takes.
const MAX_ARGS: usize = 8;

/// A query made ready to call: the C arguments (numbers and pointers into `buffers`) and, for
/// each query argument, the buffer it filled (`None` for values and null pointers).
pub(super) struct Prepared {
    c_args: Vec<u64>,
    buffers: Vec<Option<Buffer>>,
}

/// Memory for one buffer, 8-aligned as NVML's structs need; `len` bytes are the argument's.
struct Buffer {
    words: Vec<u64>,
    len: usize,
}

impl Buffer {
    fn new(bytes: &[u8], len: usize) -> Buffer {
        let mut words = vec![0u64; (len + SLACK).div_ceil(8)];
        let n = bytes.len().min(len);
        // SAFETY: `words` holds at least `len` bytes; `bytes` is another allocation.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), words.as_mut_ptr().cast::<u8>(), n)
        };
        Buffer { words, len }
    }

    fn address(&mut self) -> u64 {
        self.words.as_mut_ptr() as u64
    }

    fn bytes(&self) -> Vec<u8> {
        // SAFETY: `words` holds at least `len` initialized bytes.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast::<u8>(), self.len) }.to_vec()
    }
}

/// Checks `query` against its table entry and builds its arguments; `device` and `peer` are
/// the NVML device handles (as numbers) where the entry names them. Err: the NVML code the
/// client gets without any call.
pub(super) fn prepare(
    query: &NvmlQuery,
    device: Option<u64>,
    peer: Option<u64>,
) -> Result<Prepared, u32> {
    let params = forwarded(&query.function).ok_or(NOT_SUPPORTED)?;
    if query.args.len() != params.iter().map(|p| p.args()).sum::<usize>() {
        return Err(INVALID_ARGUMENT);
    }
    let mut args = query.args.iter();
    let mut next = || args.next().ok_or(INVALID_ARGUMENT);
    let mut c_args = Vec::with_capacity(MAX_ARGS);
    let mut buffers = Vec::with_capacity(query.args.len());
    let mut total = 0usize;
    let mut take = |bytes: &[u8], len: usize, buffers: &mut Vec<Option<Buffer>>| {
        total += len;
        if total > FORWARD_MAX_BYTES {
            return Err(INVALID_ARGUMENT);
        }
        let mut buffer = Buffer::new(bytes, len);
        let address = buffer.address();
        buffers.push(Some(buffer));
        Ok(address)
    };
    for param in params {
        match *param {
            Param::Device => c_args.push(device.ok_or(INVALID_ARGUMENT)?),
            Param::Peer => c_args.push(peer.ok_or(INVALID_ARGUMENT)?),
            Param::U32 | Param::U64 => {
                let NvmlArg::Value(value) = next()? else {
                    return Err(INVALID_ARGUMENT);
                };
                let value = if *param == Param::U32 {
                    u64::from(*value as u32)
                } else {
                    *value
                };
                c_args.push(value);
                buffers.push(None);
            }
            Param::Out(size) => match next()? {
                NvmlArg::Null => {
                    c_args.push(0);
                    buffers.push(None);
                }
                NvmlArg::Bytes(bytes) if bytes.len() == size => {
                    c_args.push(take(bytes, size, &mut buffers)?)
                }
                _ => return Err(INVALID_ARGUMENT),
            },
            Param::Text => match next()? {
                NvmlArg::Null => {
                    c_args.extend([0, 0]);
                    buffers.push(None);
                }
                NvmlArg::Bytes(bytes) if bytes.len() <= FORWARD_MAX_TEXT => {
                    c_args.push(take(bytes, bytes.len(), &mut buffers)?);
                    c_args.push(bytes.len() as u64);
                }
                _ => return Err(INVALID_ARGUMENT),
            },
            Param::Counted(item) => {
                // The count's capacity bounds what the function may write into the array.
                let capacity = match next()? {
                    NvmlArg::Null => {
                        c_args.push(0);
                        buffers.push(None);
                        0
                    }
                    NvmlArg::Bytes(count) if count.len() == 4 => {
                        c_args.push(take(count, 4, &mut buffers)?);
                        u32::from_le_bytes(count[..].try_into().unwrap()) as usize
                    }
                    _ => return Err(INVALID_ARGUMENT),
                };
                match next()? {
                    NvmlArg::Null => {
                        c_args.push(0);
                        buffers.push(None);
                    }
                    NvmlArg::Bytes(array) if Some(array.len()) == capacity.checked_mul(item) => {
                        c_args.push(take(array, array.len(), &mut buffers)?)
                    }
                    _ => return Err(INVALID_ARGUMENT),
                }
            }
            Param::Sized(item) => match next()? {
                NvmlArg::Bytes(array) if array.len() % item == 0 => {
                    c_args.push((array.len() / item) as u64);
                    c_args.push(take(array, array.len(), &mut buffers)?);
                }
                NvmlArg::Null => {
                    c_args.extend([0, 0]);
                    buffers.push(None);
                }
                _ => return Err(INVALID_ARGUMENT),
            },
        }
    }
    if c_args.len() > MAX_ARGS {
        return Err(NOT_SUPPORTED);
    }
    Ok(Prepared { c_args, buffers })
}

/// Calls the prepared query's function in `library` (NVIDIA's NVML, already loaded).
pub(super) fn call(
    library: &libloading::Library,
    function: &str,
    mut prepared: Prepared,
) -> NvmlAnswer {
    let Some(address) = symbol(library, function) else {
        return NvmlAnswer {
            ret: NOT_SUPPORTED,
            bytes: Vec::new(),
        };
    };
    let a = &prepared.c_args;
    let arg = |i: usize| a.get(i).copied().unwrap_or(0);
    // Every NVML parameter is an integer or a pointer, passed in a 64-bit register or stack
    // slot: each function is called with exactly its arity, 32-bit values zero-extended.
    macro_rules! call {
        ($($i:literal)*) => {{
            type Function = unsafe extern "C" fn($(call!(@u64 $i)),*) -> u32;
            std::mem::transmute::<usize, Function>(address)($(arg($i)),*)
        }};
        (@u64 $i:literal) => { u64 };
    }
    // SAFETY: `address` is the table's function in NVIDIA's NVML, whose C parameters are
    // integers and pointers, as many as `c_args` holds (prepare built them from the table's
    // shapes, which tools/gen_nvml_api.py derived from nvml.h); every pointer is into
    // `prepared.buffers`, alive until the call returns and as large as the shape says.
    let ret = unsafe {
        match a.len() {
            0 => call!(),
            1 => call!(0),
            2 => call!(0 1),
            3 => call!(0 1 2),
            4 => call!(0 1 2 3),
            5 => call!(0 1 2 3 4),
            6 => call!(0 1 2 3 4 5),
            7 => call!(0 1 2 3 4 5 6),
            _ => call!(0 1 2 3 4 5 6 7),
        }
    };
    let bytes = prepared
        .buffers
        .iter_mut()
        .map(|buffer| buffer.as_ref().map_or_else(Vec::new, Buffer::bytes))
        .collect();
    NvmlAnswer { ret, bytes }
}

/// The address of `function` in `library` (looked up once; `None` where this NVML lacks it).
fn symbol(library: &libloading::Library, function: &str) -> Option<usize> {
    static FOUND: Mutex<Option<HashMap<String, Option<usize>>>> = Mutex::new(None);
    let mut found = FOUND.lock().unwrap_or_else(|e| e.into_inner());
    let found = found.get_or_insert_with(HashMap::new);
    *found.entry(function.to_owned()).or_insert_with(|| {
        let name = format!("{function}\0");
        // SAFETY: a symbol lookup; the address is only called through `call`'s typed cast.
        let symbol = unsafe { library.get::<*const ()>(name.as_bytes()) };
        symbol.ok().map(|s| *s as usize)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(function: &str, args: Vec<NvmlArg>) -> NvmlQuery {
        NvmlQuery {
            function: function.into(),
            device: 0,
            peer: 0,
            args,
            peer_uuid: None,
        }
    }

    #[test]
    fn a_query_gets_buffers_of_the_tables_sizes() {
        let q = query(
            "nvmlDeviceGetClock",
            vec![
                NvmlArg::Value(1),
                NvmlArg::Value(u64::MAX),
                NvmlArg::Bytes(vec![0; 4]),
            ],
        );
        let prepared = prepare(&q, Some(0x1000), None).unwrap();
        assert_eq!(prepared.c_args.len(), 4);
        assert_eq!(prepared.c_args[0], 0x1000);
        // A 32-bit parameter gets 32 bits, whatever the client sent.
        assert_eq!(prepared.c_args[2], u64::from(u32::MAX));
        assert_eq!(prepared.buffers.iter().flatten().count(), 1);
    }

    #[test]
    fn malformed_queries_call_nothing() {
        let refused = |q: NvmlQuery| prepare(&q, Some(1), Some(2)).err();
        // Not in the table (a setter), or not at all.
        assert_eq!(
            refused(query("nvmlDeviceSetPersistenceMode", vec![])),
            Some(NOT_SUPPORTED)
        );
        assert_eq!(refused(query("dlopen", vec![])), Some(NOT_SUPPORTED));
        // Too few or too many arguments, or of the wrong kind or size.
        assert_eq!(
            refused(query("nvmlDeviceGetClock", vec![])),
            Some(INVALID_ARGUMENT)
        );
        let wrong_size = vec![
            NvmlArg::Value(1),
            NvmlArg::Value(1),
            NvmlArg::Bytes(vec![0; 4096]),
        ];
        assert_eq!(
            refused(query("nvmlDeviceGetClock", wrong_size)),
            Some(INVALID_ARGUMENT)
        );
        let bytes_for_value = vec![NvmlArg::Bytes(vec![]), NvmlArg::Value(1), NvmlArg::Null];
        assert_eq!(
            refused(query("nvmlDeviceGetClock", bytes_for_value)),
            Some(INVALID_ARGUMENT)
        );
        // An array larger than its count says, or than the bound.
        let counted = |count: u32, len: usize| {
            vec![
                NvmlArg::Bytes(count.to_le_bytes().to_vec()),
                NvmlArg::Bytes(vec![0; len]),
            ]
        };
        let q = query("nvmlDeviceGetSupportedMemoryClocks", counted(2, 12));
        assert_eq!(refused(q), Some(INVALID_ARGUMENT));
        let q = query(
            "nvmlDeviceGetSupportedMemoryClocks",
            counted(1 << 20, 4 << 20),
        );
        assert_eq!(refused(q), Some(INVALID_ARGUMENT));
        let q = query("nvmlDeviceGetSupportedMemoryClocks", counted(3, 12));
        assert!(prepare(&q, Some(1), None).is_ok());
        // A text longer than any NVML string.
        let q = query(
            "nvmlDeviceGetName",
            vec![NvmlArg::Bytes(vec![0; FORWARD_MAX_TEXT + 1])],
        );
        assert_eq!(refused(q), Some(INVALID_ARGUMENT));
        // A pair query needs both devices.
        let q = query(
            "nvmlDeviceGetP2PStatus",
            vec![NvmlArg::Value(0), NvmlArg::Bytes(vec![0; 4])],
        );
        assert_eq!(prepare(&q, Some(1), None).err(), Some(INVALID_ARGUMENT));
    }

    #[test]
    fn a_field_query_passes_its_count_and_fields() {
        let fields = vec![7u8; 40 * 3];
        let q = query("nvmlDeviceGetFieldValues", vec![NvmlArg::Bytes(fields)]);
        let mut prepared = prepare(&q, Some(1), None).unwrap();
        assert_eq!(prepared.c_args[1], 3);
        let buffer = prepared.buffers[0].as_mut().unwrap();
        assert_eq!(buffer.bytes(), vec![7u8; 120]);
    }
}
