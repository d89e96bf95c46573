//! How a host↔device copy is cut into pieces of at most one staging buffer each.
//!
//! On the wire a copy's rows travel packed; on the device they lie `pitch` apart. A piece is a
//! run of whole rows of one slice that fits a staging buffer (one 1D or 2D driver copy), or, for
//! rows wider than a buffer, a buffer-sized part of one row. Pieces follow the packed order, so
//! the bytes of a piece are the next bytes on the wire.

use rgpu_protocol::cuda::{Extent, Pitch};

/// `rows` rows of `width` bytes: packed in the staging buffer, `pitch` apart on the device,
/// starting `device_offset` bytes after the copy's first device byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    pub device_offset: u64,
    pub width: usize,
    pub rows: usize,
    pub pitch: usize,
}

impl Piece {
    /// The piece's packed size.
    pub fn bytes(&self) -> usize {
        self.width * self.rows
    }
}

/// The pieces of a copy of `extent` laid out on the device by `pitch`, each at most `chunk`
/// bytes. The caller has checked `extent.fits(pitch)`.
pub fn pieces(extent: Extent, pitch: Pitch, chunk: usize) -> Pieces {
    Pieces {
        width: extent.width,
        height: extent.height,
        depth: extent.depth,
        row_pitch: pitch.row,
        slice_pitch: pitch.row.wrapping_mul(pitch.slice_rows),
        chunk: chunk as u64,
        z: 0,
        y: 0,
        x: 0,
    }
}

pub struct Pieces {
    width: u64,
    height: u64,
    depth: u64,
    row_pitch: u64,
    slice_pitch: u64,
    chunk: u64,
    /// The next byte to place: slice, row, byte within the row.
    z: u64,
    y: u64,
    x: u64,
}

impl Iterator for Pieces {
    type Item = Piece;

    fn next(&mut self) -> Option<Piece> {
        if self.width == 0 || self.height == 0 || self.z >= self.depth {
            return None;
        }
        let row_start = self.z * self.slice_pitch + self.y * self.row_pitch;
        let piece = if self.width <= self.chunk {
            // Whole rows, as many as fit, within this slice.
            let rows = (self.chunk / self.width).min(self.height - self.y);
            self.y += rows;
            Piece {
                device_offset: row_start,
                width: self.width as usize,
                rows: rows as usize,
                pitch: self.row_pitch as usize,
            }
        } else {
            // A part of one wide row.
            let width = (self.width - self.x).min(self.chunk);
            let piece = Piece {
                device_offset: row_start + self.x,
                width: width as usize,
                rows: 1,
                pitch: self.row_pitch as usize,
            };
            self.x += width;
            if self.x == self.width {
                self.x = 0;
                self.y += 1;
            }
            piece
        };
        if self.y == self.height {
            self.y = 0;
            self.z += 1;
        }
        Some(piece)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(extent: Extent, pitch: Pitch, chunk: usize) -> Vec<Piece> {
        pieces(extent, pitch, chunk).collect()
    }

    #[test]
    fn a_linear_copy_is_cut_into_chunks() {
        let extent = Extent::linear(10);
        let cut = all(extent, extent.packed(), 4);
        let offsets: Vec<(u64, usize)> = cut.iter().map(|p| (p.device_offset, p.width)).collect();
        assert_eq!(offsets, [(0, 4), (4, 4), (8, 2)]);
        assert!(cut.iter().all(|p| p.rows == 1));
        assert!(all(Extent::linear(0), Extent::linear(0).packed(), 4).is_empty());
    }

    #[test]
    fn rows_are_grouped_within_a_slice() {
        // 2 slices of 5 rows of 3 bytes; rows 8 apart, slices 6 rows apart; 7-byte chunks.
        let extent = Extent {
            width: 3,
            height: 5,
            depth: 2,
        };
        let pitch = Pitch {
            row: 8,
            slice_rows: 6,
        };
        let cut = all(extent, pitch, 7);
        let shape: Vec<(u64, usize)> = cut.iter().map(|p| (p.device_offset, p.rows)).collect();
        assert_eq!(shape, [(0, 2), (16, 2), (32, 1), (48, 2), (64, 2), (80, 1)]);
        assert!(cut.iter().all(|p| p.width == 3 && p.pitch == 8));
        // Every packed byte is placed once, in order.
        let total: usize = cut.iter().map(Piece::bytes).sum();
        assert_eq!(total as u64, extent.bytes().unwrap());
    }

    #[test]
    fn wide_rows_are_cut_within_the_row() {
        let extent = Extent {
            width: 10,
            height: 2,
            depth: 1,
        };
        let pitch = Pitch {
            row: 16,
            slice_rows: 2,
        };
        let cut = all(extent, pitch, 4);
        let shape: Vec<(u64, usize)> = cut.iter().map(|p| (p.device_offset, p.width)).collect();
        assert_eq!(shape, [(0, 4), (4, 4), (8, 2), (16, 4), (20, 4), (24, 2)]);
    }
}
