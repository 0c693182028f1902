//! First-fit allocation of row extents in UNWIND_ROWS; freed extents are
//! merged with their free neighbours.

/// Free extents `(start, len)`, sorted by start, never adjacent.
pub(super) struct Extents {
    free: Vec<(u32, u32)>,
}

impl Extents {
    pub(super) fn new(capacity: u32) -> Extents {
        let free = if capacity > 0 {
            vec![(0, capacity)]
        } else {
            Vec::new()
        };
        Extents { free }
    }

    /// The start of `len` free rows, or None when no free extent is large
    /// enough (an empty table takes no rows and gets start 0).
    pub(super) fn alloc(&mut self, len: u32) -> Option<u32> {
        if len == 0 {
            return Some(0);
        }
        let i = self.free.iter().position(|&(_, n)| n >= len)?;
        let (start, n) = self.free[i];
        if n == len {
            self.free.remove(i);
        } else {
            self.free[i] = (start + len, n - len);
        }
        Some(start)
    }

    pub(super) fn release(&mut self, start: u32, len: u32) {
        if len == 0 {
            return;
        }
        let i = self.free.partition_point(|&(s, _)| s < start);
        self.free.insert(i, (start, len));
        // Merge with the next, then with the previous.
        if i + 1 < self.free.len() && start + len == self.free[i + 1].0 {
            self.free[i].1 += self.free[i + 1].1;
            self.free.remove(i + 1);
        }
        if i > 0 && self.free[i - 1].0 + self.free[i - 1].1 == start {
            self.free[i - 1].1 += self.free[i].1;
            self.free.remove(i);
        }
    }

    /// The free extents `(start, len)`, by start.
    pub(super) fn spans(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.free.iter().copied()
    }

    /// The largest free extent (for tests and --verbose).
    #[cfg(test)]
    pub(super) fn largest(&self) -> u32 {
        self.free.iter().map(|&(_, n)| n).max().unwrap_or(0)
    }
}
