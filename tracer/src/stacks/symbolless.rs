//! Objects whose frames nothing names: their debug files asked of
//! debuginfod servers while frames are named, and the notes that say
//! which objects they are and how to get their debug files.

use std::{
    collections::{BTreeSet, HashSet},
    sync::Arc,
    time::Instant,
};

use super::{debug_files::DebugFile, debuginfod::Got, modules::Modules, symbolize::Names};
use crate::{console, escape, profile::Note};

/// Objects the note names; the rest are counted.
pub const MAX_LISTED: usize = 5;

impl Names {
    /// Modules named while their download ran that has ended since: they
    /// are named again (with their debug file, or as they were).
    pub(super) fn arrived(&mut self, modules: &Modules) -> HashSet<u32> {
        let Some(d) = &self.debuginfod else {
            return HashSet::new();
        };
        let done: HashSet<u32> = self
            .provisional
            .iter()
            .copied()
            .filter(|&m| wanted(modules, m).is_none_or(|id| !matches!(d.get(&id), Got::Pending)))
            .collect();
        self.provisional.retain(|m| !done.contains(m));
        done
    }

    /// Asks for the debug files of `wanted` that have none; for the final
    /// report, waits for them within what is left of its budget.
    pub(super) fn fetch(&mut self, modules: &Modules, to_name: impl Iterator<Item = u32>) {
        let Some(d) = &self.debuginfod else {
            return;
        };
        for m in to_name {
            if wanted(modules, m).is_some_and(|id| matches!(d.get(&id), Got::Pending)) {
                self.provisional.insert(m);
            }
        }
        if let Some((left, interrupted)) = self.wait {
            if d.pending() && !left.is_zero() && !interrupted() {
                console::say(format_args!(
                    "waiting up to {} s for debug files from debuginfod (Ctrl-C: report \
                     without them)",
                    left.as_secs()
                ));
                let start = Instant::now();
                d.wait(start + left, interrupted);
                self.wait = Some((left.saturating_sub(start.elapsed()), interrupted));
            }
        }
    }

    /// The debug file fetched for module `m`, once it came.
    pub(super) fn fetched(&self, modules: &Modules, m: u32) -> Option<Arc<DebugFile>> {
        let id = wanted(modules, m)?;
        match self.debuginfod.as_ref()?.get(&id) {
            Got::Found(file) => Some(file),
            Got::Pending | Got::None => None,
        }
    }

    /// The notes on objects with frames left `[unknown]` that nothing
    /// names, and on the downloads asked for.
    pub fn symbol_notes(&self, modules: &Modules) -> Vec<Note> {
        let mut notes = Vec::new();
        if let Some(d) = &self.debuginfod {
            let s = d.stats();
            if s.asked + s.over_cap > 0 {
                notes.push(Note::DebuginfodFetches {
                    asked: s.asked,
                    found: s.found,
                    not_found: s.not_found,
                    failed: s.failed,
                    unfinished: s.unfinished,
                    over_cap: s.over_cap,
                    example: s.example,
                });
            }
        }
        let unnamed: BTreeSet<u32> = self.unknown_modules().collect();
        let mut without: Vec<String> = unnamed
            .into_iter()
            .filter(|&m| modules.jit_frames().name_of(m).is_none())
            .filter(|&m| self.fetched(modules, m).is_none())
            .filter_map(|m| {
                let d = modules.objects().debug_info(m)?;
                (!d.symbols).then(|| {
                    let id = d.build_id.as_deref().unwrap_or("none");
                    format!("{} (build id {id})", escape::text(modules.path(m)))
                })
            })
            .collect();
        if !without.is_empty() {
            without.sort_unstable();
            let modules = without.len() as u64;
            without.truncate(MAX_LISTED);
            notes.push(Note::ModulesWithoutSymbols {
                modules,
                listed: without,
                debuginfod: self.debuginfod.is_some(),
            });
        }
        notes
    }
}

/// The build id to ask a server for, if module `m` wants a debug file:
/// it has no DWARF of its own and none was found on this machine.
fn wanted(modules: &Modules, m: u32) -> Option<Arc<str>> {
    if modules.jit_frames().name_of(m).is_some() {
        return None;
    }
    let d = modules.objects().debug_info(m)?;
    if d.has_dwarf || d.debug_file.is_some() {
        return None;
    }
    d.build_id.clone()
}
