//! `--unwind tables`: every process's maps as read here, described to the
//! kernel's walker (`kernel_tables.rs`) whenever they change, and the
//! largest file whose table did not fit, named by its path.

use std::{path::Path, time::Instant};

use super::super::{
    kernel_tables::{KernelTables, TablesInUse},
    trampolines::JitCode,
};
use super::{objects::ObjectTable, process_maps::ProcessMaps};

/// The kernel tables, when the walker runs from them.
#[derive(Default)]
pub struct KernelSync {
    tables: Option<KernelTables>,
    /// The path and rows of the largest file whose table did not fit
    /// (named when the tables first report it, while a process maps it).
    /// One entry.
    largest_unfit: Option<(String, u32)>,
}

impl KernelSync {
    /// None: no kernel tables (the other unwind modes, the tests).
    pub fn new(tables: Option<KernelTables>) -> KernelSync {
        KernelSync {
            tables,
            largest_unfit: None,
        }
    }

    pub fn tables(&self) -> Option<&KernelTables> {
        self.tables.as_ref()
    }

    /// Builds the table of `path` before any process maps it (a started
    /// command's program and libraries).
    pub fn prepare(&mut self, path: &Path) {
        if let Some(tables) = &mut self.tables {
            tables.prepare(path);
        }
    }

    /// Tells the kernel's walker about `pid`'s maps and JIT code.
    pub fn describe(&mut self, pid: u32, maps: &ProcessMaps, jit: &JitCode, objects: &ObjectTable) {
        let Some(tables) = &mut self.tables else {
            return;
        };
        let open = |o: u32| objects.open_file(o);
        tables.sync(pid, maps.maps(), maps.objects(), jit, open);
        if let Some(((dev, ino), rows)) = tables.largest_unfit() {
            if self.largest_unfit.as_ref().is_none_or(|(_, r)| *r != rows) {
                let name = objects
                    .path_of_file(dev, ino)
                    .map_or_else(|| format!("device {dev} inode {ino}"), str::to_string);
                self.largest_unfit = Some((name, rows));
            }
        }
    }

    /// `pid` exec'ed or exited: nothing of it is described any more.
    pub fn drop_process(&mut self, pid: u32) {
        if let Some(tables) = &mut self.tables {
            tables.drop_process(pid);
        }
    }

    /// About every second: kept tables unused for their TTL go; returns
    /// the processes using a file whose table waited for rows that can be
    /// had now (described again, that loads it).
    pub fn tick(&mut self, now: Instant) -> Vec<u32> {
        let Some(tables) = &mut self.tables else {
            return Vec::new();
        };
        tables.expire_unused(now);
        tables.waiting(now)
    }

    /// The path (as the first process that mapped it saw it: hostile,
    /// escape it) and rows of the largest file whose table did not fit.
    pub fn largest_unfit_table(&self) -> Option<(&str, u32)> {
        self.largest_unfit
            .as_ref()
            .map(|(name, rows)| (name.as_str(), *rows))
    }

    /// The rows and trie entries in use now.
    pub fn in_use(&self) -> Option<TablesInUse> {
        Some(self.tables.as_ref()?.in_use())
    }
}

#[cfg(test)]
mod tests;
