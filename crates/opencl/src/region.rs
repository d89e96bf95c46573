//! Copying a 3-D region between pitched host memory and a tightly packed buffer (the wire
//! format of rectangle and image transfers).

/// A region of host memory: `row_bytes` per row, `rows` rows per slice, `slices` slices, laid
/// out with the given pitches, starting at `base`.
#[derive(Clone, Copy, Debug)]
pub struct HostRegion {
    pub base: *mut u8,
    pub row_bytes: usize,
    pub rows: usize,
    pub slices: usize,
    pub row_pitch: usize,
    pub slice_pitch: usize,
}

// SAFETY: a description of memory that the OpenCL contract keeps valid while a command using
// it is pending; the reader thread writes into it only then.
unsafe impl Send for HostRegion {}

impl HostRegion {
    /// Pitches of 0 mean "tightly packed", as in the OpenCL API.
    pub fn new(
        base: *mut u8,
        row_bytes: usize,
        rows: usize,
        slices: usize,
        row_pitch: usize,
        slice_pitch: usize,
    ) -> HostRegion {
        let row_pitch = if row_pitch == 0 { row_bytes } else { row_pitch };
        let slice_pitch = if slice_pitch == 0 {
            row_pitch * rows
        } else {
            slice_pitch
        };
        HostRegion {
            base,
            row_bytes,
            rows,
            slices,
            row_pitch,
            slice_pitch,
        }
    }

    pub fn packed_len(&self) -> usize {
        self.row_bytes * self.rows * self.slices
    }

    /// Whether the host memory is already tightly packed (no copy needed).
    pub fn is_packed(&self) -> bool {
        self.row_pitch == self.row_bytes
            && (self.slices <= 1 || self.slice_pitch == self.row_bytes * self.rows)
    }

    /// Gathers the region into a packed vector.
    ///
    /// # Safety
    /// The region describes readable memory.
    pub unsafe fn pack(&self) -> Vec<u8> {
        if self.is_packed() {
            // SAFETY: a tightly packed region is one contiguous run.
            return unsafe { std::slice::from_raw_parts(self.base, self.packed_len()) }.to_vec();
        }
        let mut out = Vec::with_capacity(self.packed_len());
        for z in 0..self.slices {
            for y in 0..self.rows {
                // SAFETY: inside the described region.
                let row = unsafe {
                    std::slice::from_raw_parts(
                        self.base.add(z * self.slice_pitch + y * self.row_pitch),
                        self.row_bytes,
                    )
                };
                out.extend_from_slice(row);
            }
        }
        out
    }

    /// Scatters packed data into the region.
    ///
    /// # Safety
    /// The region describes writable memory and `packed` holds at least `packed_len` bytes.
    pub unsafe fn unpack(&self, packed: &[u8]) {
        let mut rows = packed.chunks_exact(self.row_bytes.max(1));
        for z in 0..self.slices {
            for y in 0..self.rows {
                let Some(src) = rows.next() else { return };
                // SAFETY: inside the described region.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        src.as_ptr(),
                        self.base.add(z * self.slice_pitch + y * self.row_pitch),
                        self.row_bytes,
                    )
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::HostRegion;

    #[test]
    fn pack_and_unpack_pitched_regions() {
        // 3 slices of 2 rows of 4 bytes, in host memory with row pitch 6 and slice pitch 16.
        let mut host = vec![0u8; 48];
        for z in 0..3 {
            for y in 0..2 {
                for x in 0..4 {
                    host[z * 16 + y * 6 + x] = (z * 8 + y * 4 + x) as u8;
                }
            }
        }
        let region = HostRegion::new(host.as_mut_ptr(), 4, 2, 3, 6, 16);
        assert!(!region.is_packed());
        // SAFETY: the region lies inside `host`.
        let packed = unsafe { region.pack() };
        assert_eq!(packed, (0..24).collect::<Vec<u8>>());

        let mut back = vec![0u8; 48];
        // SAFETY: the region lies inside `back`.
        unsafe { HostRegion::new(back.as_mut_ptr(), 4, 2, 3, 6, 16).unpack(&packed) };
        assert_eq!(
            back, host,
            "everything outside the region is padding (0 in both)"
        );

        let tight = HostRegion::new(back.as_mut_ptr(), 4, 2, 3, 0, 0);
        assert!(tight.is_packed());
        assert_eq!(tight.packed_len(), 24);
    }
}
