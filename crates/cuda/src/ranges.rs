//! Address ranges and what each belongs to: the program's device memory (to route a copy given
//! only pointers, and to keep servers' allocations apart) and its page-locked host memory (so an
//! async copy into it may complete later). A zero-sized range still covers its first byte.

use std::collections::BTreeMap;

pub struct RangeMap<V> {
    by_start: BTreeMap<u64, (u64, V)>,
}

/// A range found: its start, its size and its value.
pub type Found<V> = (u64, u64, V);

impl<V: Copy> RangeMap<V> {
    pub const fn new() -> Self {
        RangeMap {
            by_start: BTreeMap::new(),
        }
    }

    /// Adds (or replaces) the range starting at `start`.
    pub fn insert(&mut self, start: u64, size: u64, value: V) {
        self.by_start.insert(start, (size, value));
    }

    pub fn remove(&mut self, start: u64) -> Option<(u64, V)> {
        self.by_start.remove(&start)
    }

    /// The range starting exactly at `start`.
    pub fn get(&self, start: u64) -> Option<(u64, V)> {
        self.by_start.get(&start).copied()
    }

    /// The range holding `address`.
    pub fn find(&self, address: u64) -> Option<Found<V>> {
        let (&start, &(size, value)) = self.by_start.range(..=address).next_back()?;
        (address < start.saturating_add(size.max(1))).then_some((start, size, value))
    }

    /// Removes the ranges whose value `pick` picks; their starts.
    pub fn remove_where(&mut self, mut pick: impl FnMut(V) -> bool) -> Vec<u64> {
        let picked: Vec<u64> = self
            .by_start
            .iter()
            .filter(|(_, &(_, value))| pick(value))
            .map(|(&start, _)| start)
            .collect();
        for start in &picked {
            self.by_start.remove(start);
        }
        picked
    }

    /// Whether any range overlaps `[start, start + size)`.
    pub fn overlaps(&self, start: u64, size: u64) -> bool {
        let end = start.saturating_add(size.max(1));
        self.by_start
            .range(..end)
            .next_back()
            .is_some_and(|(&other, &(len, _))| other.saturating_add(len.max(1)) > start)
    }
}

impl<V: Copy> Default for RangeMap<V> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_range_holding_an_address() {
        let mut map = RangeMap::new();
        map.insert(0x1000, 0x100, 'a');
        map.insert(0x2000, 0, 'b');
        assert_eq!(map.find(0x1000), Some((0x1000, 0x100, 'a')));
        assert_eq!(map.find(0x10ff), Some((0x1000, 0x100, 'a')));
        assert_eq!(map.find(0x1100), None);
        assert_eq!(map.find(0x0fff), None);
        // A zero-sized range covers its first byte only.
        assert_eq!(map.find(0x2000), Some((0x2000, 0, 'b')));
        assert_eq!(map.find(0x2001), None);
        assert_eq!(map.remove(0x1000), Some((0x100, 'a')));
        assert_eq!(map.find(0x1010), None);
    }

    #[test]
    fn overlaps_sees_ranges_on_either_side() {
        let mut map = RangeMap::new();
        map.insert(0x1000, 0x1000, ());
        assert!(map.overlaps(0x1800, 0x10), "inside");
        assert!(map.overlaps(0x0800, 0x1000), "covering the start");
        assert!(map.overlaps(0x1fff, 0x10), "covering the end");
        assert!(map.overlaps(0x0000, 0x10000), "around it");
        assert!(!map.overlaps(0x2000, 0x10), "just after");
        assert!(!map.overlaps(0x0f00, 0x100), "just before");
        assert!(!map.overlaps(u64::MAX - 4, 16), "no overflow at the top");
    }
}
