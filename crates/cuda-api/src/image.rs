//! The extent of a module image handed to `cuModuleLoadData`, `cuLibraryLoadData` or
//! `cuModuleLoadFatBinary`. The driver API passes only a pointer, so the length has to be read
//! from the image itself before its bytes can be sent to a server.

use std::ffi::{c_void, CStr};

/// `__fatBinC_Wrapper_t`: `{u32 magic, u32 version, const void* data, ...}`.
const WRAPPER_MAGIC: u32 = 0x4662_43b1;
/// Fat binary header: `{u32 magic, u16 version, u16 header_size, u64 files_size}`.
const FATBIN_MAGIC: u32 = 0xba55_ed50;
const FATBIN_HEADER_LEN: usize = 16;
const ELF_MAGIC: [u8; 4] = *b"\x7fELF";
const ELF_HEADER_LEN: usize = 64;
const ELF_SECTION_HEADER_LEN: usize = 64;
const ELF_PROGRAM_HEADER_LEN: usize = 56;
/// `SHT_NOBITS` sections (.bss-like) take no room in the file.
const SHT_NOBITS: u32 = 8;
/// Larger claimed sizes mean a corrupt header, not an image.
const MAX_IMAGE_LEN: u64 = 1 << 36;

/// What a prefix of an image says about its length.
#[derive(Debug, PartialEq, Eq)]
enum Measure {
    /// The whole image is this many bytes.
    Len(usize),
    /// Measuring needs at least this many bytes (all inside the image).
    Need(usize),
    /// Not an image this module understands, or a corrupt one.
    Invalid,
}

fn u16_at(bytes: &[u8], offset: usize) -> u16 {
    u16::from_le_bytes(bytes[offset..offset + 2].try_into().unwrap())
}

fn u32_at(bytes: &[u8], offset: usize) -> u32 {
    u32::from_le_bytes(bytes[offset..offset + 4].try_into().unwrap())
}

fn u64_at(bytes: &[u8], offset: usize) -> u64 {
    u64::from_le_bytes(bytes[offset..offset + 8].try_into().unwrap())
}

fn checked_len(len: Option<u64>) -> Measure {
    match len {
        Some(len) if len <= MAX_IMAGE_LEN => Measure::Len(len as usize),
        _ => Measure::Invalid,
    }
}

fn measure_fatbin(bytes: &[u8]) -> Measure {
    if bytes.len() < FATBIN_HEADER_LEN {
        return Measure::Need(FATBIN_HEADER_LEN);
    }
    let header_size = u64::from(u16_at(bytes, 6));
    checked_len(header_size.checked_add(u64_at(bytes, 8)))
}

/// A 64-bit little-endian ELF (cubins are): the furthest of its header tables and the data of
/// its sections and segments.
fn measure_elf(bytes: &[u8]) -> Measure {
    if bytes.len() < ELF_HEADER_LEN {
        return Measure::Need(ELF_HEADER_LEN);
    }
    // EI_CLASS 2 = 64-bit, EI_DATA 1 = little-endian.
    if bytes[4] != 2 || bytes[5] != 1 {
        return Measure::Invalid;
    }
    let phoff = u64_at(bytes, 0x20);
    let shoff = u64_at(bytes, 0x28);
    let phentsize = u64::from(u16_at(bytes, 0x36));
    let phnum = u64::from(u16_at(bytes, 0x38));
    let shentsize = u64::from(u16_at(bytes, 0x3a));
    let mut shnum = u64::from(u16_at(bytes, 0x3c));
    if (phnum > 0 && phentsize < ELF_PROGRAM_HEADER_LEN as u64)
        || (shoff != 0 && shentsize < ELF_SECTION_HEADER_LEN as u64)
    {
        return Measure::Invalid;
    }
    // Extended numbering: with 0 in e_shnum, section 0's sh_size holds the count.
    if shnum == 0 && shoff != 0 {
        let Some(end) = shoff.checked_add(ELF_SECTION_HEADER_LEN as u64) else {
            return Measure::Invalid;
        };
        if end > MAX_IMAGE_LEN {
            return Measure::Invalid;
        }
        if (bytes.len() as u64) < end {
            return Measure::Need(end as usize);
        }
        shnum = u64_at(bytes, shoff as usize + 0x20);
    }
    let table_end = |offset: u64, count: u64, size: u64| {
        count.checked_mul(size).and_then(|n| offset.checked_add(n))
    };
    let (Some(ph_end), Some(sh_end)) = (
        table_end(phoff, phnum, phentsize),
        table_end(shoff, shnum, shentsize),
    ) else {
        return Measure::Invalid;
    };
    let tables_end = ph_end.max(sh_end).max(ELF_HEADER_LEN as u64);
    if tables_end > MAX_IMAGE_LEN {
        return Measure::Invalid;
    }
    if (bytes.len() as u64) < tables_end {
        return Measure::Need(tables_end as usize);
    }
    let mut end = Some(tables_end);
    for i in 0..shnum {
        let header = (shoff + i * shentsize) as usize;
        if u32_at(bytes, header + 4) == SHT_NOBITS {
            continue;
        }
        let data_end = u64_at(bytes, header + 0x18).checked_add(u64_at(bytes, header + 0x20));
        end = end.zip(data_end).map(|(a, b)| a.max(b));
    }
    for i in 0..phnum {
        let header = (phoff + i * phentsize) as usize;
        let data_end = u64_at(bytes, header + 8).checked_add(u64_at(bytes, header + 0x20));
        end = end.zip(data_end).map(|(a, b)| a.max(b));
    }
    checked_len(end)
}

fn measure(bytes: &[u8]) -> Measure {
    match bytes.get(..4) {
        Some(magic) if magic == ELF_MAGIC => measure_elf(bytes),
        Some(magic) if u32_at(magic, 0) == FATBIN_MAGIC => measure_fatbin(bytes),
        Some(magic) if u32_at(magic, 0) == WRAPPER_MAGIC => Measure::Invalid,
        _ => match bytes.iter().position(|&b| b == 0) {
            Some(nul) => Measure::Len(nul + 1),
            None => Measure::Invalid,
        },
    }
}

/// The length of the image that starts `bytes` (which may hold more, or only a prefix): a fat
/// binary, a 64-bit ELF or NUL-terminated text (PTX, the NUL counted). `None` when the prefix
/// is too short to tell, for a fatbin wrapper (it points elsewhere) and for corrupt headers.
pub fn image_len_of(bytes: &[u8]) -> Option<usize> {
    match measure(bytes) {
        Measure::Len(len) => Some(len),
        Measure::Need(_) | Measure::Invalid => None,
    }
}

/// The bytes of the image at `image`: a fatbin wrapper is followed to its data.
///
/// # Safety
/// `image` is null or points to a module image as the driver API accepts it (a fatbin
/// wrapper, a fat binary, an ELF cubin or NUL-terminated PTX), readable for its whole length
/// and unchanged for `'a`.
pub unsafe fn image_bytes<'a>(image: *const c_void) -> Option<&'a [u8]> {
    // SAFETY: as this function's contract.
    unsafe { image_bytes_at(image as *const u8, true) }
}

unsafe fn image_bytes_at<'a>(image: *const u8, follow_wrapper: bool) -> Option<&'a [u8]> {
    if image.is_null() {
        return None;
    }
    // Read the magic a byte at a time, stopping at a NUL: a short PTX string may end (and its
    // memory with it) before four bytes. Every binary magic is four non-zero bytes.
    let mut magic = [0u8; 4];
    for (i, byte) in magic.iter_mut().enumerate() {
        // SAFETY: the bytes before this one were non-zero, so the image goes on.
        *byte = unsafe { image.add(i).read() };
        if *byte == 0 {
            break;
        }
    }
    let magic_word = u32::from_le_bytes(magic);
    if magic_word == WRAPPER_MAGIC {
        if !follow_wrapper {
            return None;
        }
        // SAFETY: a wrapper holds its data pointer at offset 8 (not necessarily aligned).
        let data = unsafe { (image.add(8) as *const *const u8).read_unaligned() };
        // SAFETY: the wrapper's data is itself an image; wrappers do not nest.
        return unsafe { image_bytes_at(data, false) };
    }
    if magic != ELF_MAGIC && magic_word != FATBIN_MAGIC {
        // SAFETY: anything else is NUL-terminated text.
        return Some(unsafe { CStr::from_ptr(image.cast()) }.to_bytes_with_nul());
    }
    // Each round reads only a prefix the previous one showed to be inside the image.
    let mut known = FATBIN_HEADER_LEN.max(if magic == ELF_MAGIC {
        ELF_HEADER_LEN
    } else {
        0
    });
    for _ in 0..4 {
        // SAFETY: `known` bytes are inside the image (its header, then its header tables).
        let prefix = unsafe { std::slice::from_raw_parts(image, known) };
        match measure(prefix) {
            // SAFETY: the image's headers say it is `len` bytes long.
            Measure::Len(len) => return Some(unsafe { std::slice::from_raw_parts(image, len) }),
            Measure::Need(need) if need > known => known = need,
            Measure::Need(_) | Measure::Invalid => return None,
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fatbin(files: &[u8]) -> Vec<u8> {
        let mut image = Vec::new();
        image.extend_from_slice(&FATBIN_MAGIC.to_le_bytes());
        image.extend_from_slice(&1u16.to_le_bytes());
        image.extend_from_slice(&16u16.to_le_bytes());
        image.extend_from_slice(&(files.len() as u64).to_le_bytes());
        image.extend_from_slice(files);
        image
    }

    fn put(image: &mut [u8], offset: usize, value: &[u8]) {
        image[offset..offset + value.len()].copy_from_slice(value);
    }

    /// An ELF with the header at 0, section data up to `data_end`, and `sections` section
    /// headers at `shoff`; section 1 covers [64, data_end), section 2 is NOBITS and huge.
    fn elf(shoff: usize, data_end: usize) -> Vec<u8> {
        let sections = 3;
        let mut image = vec![0u8; (shoff + sections * 64).max(data_end)];
        put(&mut image, 0, b"\x7fELF\x02\x01\x01");
        put(&mut image, 0x28, &(shoff as u64).to_le_bytes());
        put(&mut image, 0x3a, &64u16.to_le_bytes());
        put(&mut image, 0x3c, &(sections as u16).to_le_bytes());
        let s1 = shoff + 64;
        put(&mut image, s1 + 4, &1u32.to_le_bytes());
        put(&mut image, s1 + 0x18, &64u64.to_le_bytes());
        put(
            &mut image,
            s1 + 0x20,
            &((data_end - 64) as u64).to_le_bytes(),
        );
        let s2 = shoff + 128;
        put(&mut image, s2 + 4, &SHT_NOBITS.to_le_bytes());
        put(&mut image, s2 + 0x18, &64u64.to_le_bytes());
        put(&mut image, s2 + 0x20, &(1u64 << 30).to_le_bytes());
        image
    }

    #[test]
    fn fatbin_length_is_header_plus_files() {
        let image = fatbin(&[7; 40]);
        let mut padded = image.clone();
        padded.extend_from_slice(&[0xee; 32]);
        assert_eq!(image_len_of(&padded), Some(56));
        assert_eq!(image_len_of(&image[..10]), None);
        // SAFETY: test: a pointer to a live local image (or null, which is refused).
        let bytes = unsafe { image_bytes(padded.as_ptr().cast()) }.unwrap();
        assert_eq!(bytes, &image[..]);
    }

    #[test]
    fn elf_length_covers_tables_and_section_data() {
        // Section headers at the end (the usual layout).
        let image = elf(512, 512);
        assert_eq!(image.len(), 512 + 3 * 64);
        let mut padded = image.clone();
        padded.extend_from_slice(&[0xee; 100]);
        assert_eq!(image_len_of(&padded), Some(image.len()));
        assert_eq!(
            // SAFETY: test: a pointer to a live local image (or null, which is refused).
            unsafe { image_bytes(padded.as_ptr().cast()) },
            Some(&image[..])
        );
        // Section data after the section headers.
        let image = elf(128, 1000);
        assert_eq!(image_len_of(&image), Some(1000));
        assert_eq!(
            // SAFETY: test: a pointer to a live local image (or null, which is refused).
            unsafe { image_bytes(image.as_ptr().cast()) }.map(<[u8]>::len),
            Some(1000)
        );
        // A prefix too short to reach the section headers.
        assert_eq!(image_len_of(&image[..100]), None);
    }

    #[test]
    fn elf_program_headers_count() {
        let mut image = elf(128, 400);
        image.resize(2000, 0);
        put(&mut image, 0x20, &1000u64.to_le_bytes());
        put(&mut image, 0x36, &56u16.to_le_bytes());
        put(&mut image, 0x38, &2u16.to_le_bytes());
        // Segment 1's file data runs to 1500.
        put(&mut image, 1000 + 56 + 8, &1200u64.to_le_bytes());
        put(&mut image, 1000 + 56 + 0x20, &300u64.to_le_bytes());
        assert_eq!(image_len_of(&image), Some(1500));
    }

    #[test]
    fn corrupt_or_32_bit_elf_is_refused() {
        let mut image = elf(128, 400);
        image[4] = 1;
        assert_eq!(image_len_of(&image), None);
        let mut image = elf(128, 400);
        put(&mut image, 0x28, &u64::MAX.to_le_bytes());
        assert_eq!(image_len_of(&image), None);
    }

    #[test]
    fn ptx_includes_its_nul() {
        let ptx = b".version 8.0\n.target sm_80\n\0garbage";
        assert_eq!(image_len_of(ptx), Some(28));
        // SAFETY: test: a pointer to a live local image (or null, which is refused).
        let bytes = unsafe { image_bytes(ptx.as_ptr().cast()) }.unwrap();
        assert_eq!(bytes, &ptx[..28]);
        assert_eq!(
            // SAFETY: test: a pointer to a live local image (or null, which is refused).
            unsafe { image_bytes(c"".as_ptr().cast()) },
            Some(&b"\0"[..])
        );
        assert_eq!(
            // SAFETY: test: a pointer to a live local image (or null, which is refused).
            unsafe { image_bytes(c"ab".as_ptr().cast()) },
            Some(&b"ab\0"[..])
        );
        assert_eq!(image_len_of(b"no nul"), None);
    }

    #[test]
    fn wrapper_is_followed_to_its_fatbin() {
        let image = fatbin(&[3; 24]);
        #[repr(C)]
        struct Wrapper {
            magic: u32,
            version: u32,
            data: *const u8,
            filename: *const u8,
        }
        let wrapper = Wrapper {
            magic: WRAPPER_MAGIC,
            version: 1,
            data: image.as_ptr(),
            filename: std::ptr::null(),
        };
        // SAFETY: test: a pointer to a live local image (or null, which is refused).
        let bytes = unsafe { image_bytes((&wrapper as *const Wrapper).cast()) }.unwrap();
        assert_eq!(bytes, &image[..]);
        let raw =
            // SAFETY: test: `wrapper` is a live local of 24 bytes.
            unsafe { std::slice::from_raw_parts((&wrapper as *const Wrapper).cast::<u8>(), 24) };
        assert_eq!(image_len_of(raw), None);
        // SAFETY: test: a pointer to a live local image (or null, which is refused).
        assert_eq!(unsafe { image_bytes(std::ptr::null()) }, None);
    }
}
