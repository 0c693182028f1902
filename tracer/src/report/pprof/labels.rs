//! The labels of a pprof sample: `pid`, `comm`, `command`, `bytes` and,
//! where known, `cgroup`, `container_id` and `trend`; the strings of each
//! process are looked up once.

use super::{proto, Builder, IdentityIds};
use crate::report::{basename, pprof_meta::saturating_i64, StackReport};

impl Builder<'_> {
    /// `pid`, `comm`, `command` and, as Go writes it, `bytes`: the average
    /// size of the blocks allocated at this stack.
    pub(super) fn labels(&mut self, stack: &StackReport, labels: &mut Vec<proto::Label>) {
        let (comm, command) = match &stack.exited_group {
            // Folded exited processes (pid 0): the program, and how many.
            Some(program) => {
                let label = self.p.stack_label(stack);
                (self.strings.id(basename(program)), self.strings.id(&label))
            }
            None => self.process_strings(stack.pid, stack.start_time),
        };
        labels.extend([
            self.num_label("pid", i64::from(stack.pid)),
            self.str_label("comm", comm),
            self.str_label("command", command),
        ]);
        // Where it runs: `-tagfocus cgroup=/system.slice/x.service`.
        if stack.exited_group.is_none() {
            let (cgroup, container) = self.identity_strings(stack.pid, stack.start_time);
            if let Some(cgroup) = cgroup {
                labels.push(self.str_label("cgroup", cgroup));
            }
            if let Some(container) = container {
                labels.push(self.str_label("container_id", container));
            }
        }
        let c = &stack.counts;
        if let Some(size) = c.alloc_bytes.checked_div(c.alloc_objects) {
            labels.push(self.num_label("bytes", saturating_i64(size)));
        }
        // The history's class (--interval, --serve): `-tagfocus trend=growing`.
        if let Some(trend) = stack.trend {
            let name = self.strings.id(trend.name());
            labels.push(self.str_label("trend", name));
        }
    }

    fn num_label(&mut self, key: &str, num: i64) -> proto::Label {
        proto::Label {
            key: self.strings.id(key),
            num,
            ..Default::default()
        }
    }

    fn str_label(&mut self, key: &str, str: i64) -> proto::Label {
        proto::Label {
            key: self.strings.id(key),
            str,
            ..Default::default()
        }
    }

    /// The string ids of a process's program name and command line ("" when
    /// unknown), as `Profile::process_label` finds the process.
    fn process_strings(&mut self, pid: u32, start_time: Option<u64>) -> (i64, i64) {
        if let Some(&ids) = self.process_labels.get(&(pid, start_time)) {
            return ids;
        }
        let process = self
            .p
            .processes
            .iter()
            .find(|proc| proc.pid == pid && proc.start_time == start_time)
            .or_else(|| self.p.processes.iter().find(|proc| proc.pid == pid));
        let (program, command) = process.map_or(("", ""), |proc| {
            let program = match proc.program.as_str() {
                "" => proc.command.split_whitespace().next().unwrap_or(""),
                program => program,
            };
            (basename(program), proc.command.as_str())
        });
        let ids = (self.strings.id(program), self.strings.id(command));
        self.process_labels.insert((pid, start_time), ids);
        ids
    }

    /// The string ids of a process's cgroup and container id, when known.
    fn identity_strings(&mut self, pid: u32, start_time: Option<u64>) -> IdentityIds {
        if let Some(&ids) = self.identity_labels.get(&(pid, start_time)) {
            return ids;
        }
        let identity = self.p.identity_of(pid, start_time);
        let cgroup = identity.and_then(|i| i.cgroup.as_deref());
        let container = identity.and_then(|i| i.container_id.as_deref());
        let ids = (
            cgroup.map(|c| self.strings.id(c)),
            container.map(|c| self.strings.id(c)),
        );
        self.identity_labels.insert((pid, start_time), ids);
        ids
    }
}
