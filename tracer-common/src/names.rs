//! The names by which user space finds the BPF side's maps, read-only
//! globals and programs in the object. The BPF side defines them as Rust
//! items of these names (its macros take identifiers, not constants);
//! tracer/build.rs checks, when it builds the object, that each name here
//! is in it as the right kind of symbol, so that a rename on one side
//! fails the build instead of the load.

/// Maps user space opens, sizes or fills.
pub mod map {
    pub const EVENTS: &str = "EVENTS";
    pub const LIVE: &str = "LIVE";
    pub const STACKS: &str = "STACKS";
    pub const TRACED: &str = "TRACED";
    pub const INFLIGHT: &str = "INFLIGHT";
    pub const SEEN: &str = "SEEN";
    pub const COUNTERS: &str = "COUNTERS";
    pub const CONTROL: &str = "CONTROL";
    pub const PROGS: &str = "PROGS";
    pub const STATE: &str = "STATE";
    pub const CGROUP: &str = "CGROUP";
    pub const COUNTDOWN: &str = "COUNTDOWN";
    pub const UNWIND_ROWS: &str = "UNWIND_ROWS";
    pub const UNWIND_MAPPINGS: &str = "UNWIND_MAPPINGS";
    /// u32 tgid → `CodeMaps`, bumped by the kernel side at each file the
    /// process maps executable (tracer-ebpf's code_gen.rs).
    pub const MAPS_GEN: &str = "MAPS_GEN";
    /// u32 tgid → u32, the generation user space read the process's maps
    /// at. A stack carries the generation it was taken under.
    pub const MAPS_READ: &str = "MAPS_READ";
    /// `TraceSettings` of programs loaded ahead of their trace.
    pub const SETTINGS: &str = "SETTINGS";

    /// Every name above.
    pub const ALL: [&str; 17] = [
        EVENTS,
        LIVE,
        STACKS,
        TRACED,
        INFLIGHT,
        SEEN,
        COUNTERS,
        CONTROL,
        PROGS,
        STATE,
        CGROUP,
        COUNTDOWN,
        UNWIND_ROWS,
        UNWIND_MAPPINGS,
        MAPS_GEN,
        MAPS_READ,
        SETTINGS,
    ];
}

/// Read-only globals user space sets at load time.
pub mod global {
    pub const UNWIND_MODE: &str = "UNWIND_MODE";
    pub const STACK_BYTES: &str = "STACK_BYTES";
    pub const SAMPLE_RATE: &str = "SAMPLE_RATE";
    pub const FILTER: &str = "FILTER";
    pub const COMM: &str = "COMM";
    pub const CGROUP_LEVEL: &str = "CGROUP_LEVEL";
    pub const EXP_TABLE: &str = "EXP_TABLE";
    pub const FOLLOW_FORKS: &str = "FOLLOW_FORKS";
    pub const TASK_TGID_OFFSET: &str = "TASK_TGID_OFFSET";
    pub const TASK_START_OFFSET: &str = "TASK_START_OFFSET";
    pub const EXIT_GROUP_DEAD: &str = "EXIT_GROUP_DEAD";
    pub const INFLIGHT_BY_TID: &str = "INFLIGHT_BY_TID";
    pub const ATTACH_COOKIES: &str = "ATTACH_COOKIES";
    pub const ATOMIC_SLOTS: &str = "ATOMIC_SLOTS";
    /// 1: the trace's settings are read from the SETTINGS map, not from
    /// SAMPLE_RATE, FILTER, COMM, CGROUP_LEVEL and FOLLOW_FORKS.
    pub const SETTINGS_IN_MAP: &str = "SETTINGS_IN_MAP";
    /// 1 when the verifier offers bpf_get_current_ancestor_cgroup_id to
    /// uprobe programs; 0 keeps the call out of what it verifies.
    pub const CGROUP_HELPER: &str = "CGROUP_HELPER";

    /// Every name above.
    pub const ALL: [&str; 16] = [
        UNWIND_MODE,
        STACK_BYTES,
        SAMPLE_RATE,
        FILTER,
        COMM,
        CGROUP_LEVEL,
        EXP_TABLE,
        FOLLOW_FORKS,
        TASK_TGID_OFFSET,
        TASK_START_OFFSET,
        EXIT_GROUP_DEAD,
        INFLIGHT_BY_TID,
        ATTACH_COOKIES,
        ATOMIC_SLOTS,
        SETTINGS_IN_MAP,
        CGROUP_HELPER,
    ];
}

/// Programs user space attaches.
pub mod program {
    use crate::Role;

    /// The entry program of each `Role`, indexed by it.
    pub const ENTRY: [&str; Role::ALL.len()] = [
        "malloc_enter",
        "calloc_enter",
        "realloc_enter",
        "reallocarray_enter",
        "free_enter",
        "posix_memalign_enter",
        "aligned_alloc_enter",
        "memalign_enter",
        "valloc_enter",
        "pvalloc_enter",
        "xallocx_enter",
    ];
    /// glibc's free: also reads the size of a block the trace never saw
    /// allocated from its chunk header.
    pub const FREE_GLIBC_ENTER: &str = "free_glibc_enter";
    /// The return program every allocating function shares.
    pub const ALLOC_RETURN: &str = "alloc_return";
    /// Entry and return programs that do nothing (probe placement).
    pub const NOOP_ENTER: &str = "noop_enter";
    pub const NOOP_RETURN: &str = "noop_return";
    /// `--binary`: on the program's entry point.
    pub const BINARY_ENTRY: &str = "binary_entry";
    /// The process's code generation: fexit of `vm_mmap_pgoff`, or the
    /// `sys_exit` tracepoint where fexit is missing.
    pub const MAPS_CHANGE: &str = "maps_change";
    pub const MAPS_CHANGE_SYSCALL: &str = "maps_change_syscall";
    /// Raw tracepoint programs.
    pub const PROCESS_EXEC: &str = "process_exec";
    pub const PROCESS_FORK: &str = "process_fork";
    pub const PROCESS_EXIT: &str = "process_exit";
    pub const SIGNAL_DELIVER: &str = "signal_deliver";
    pub const OOM_MARK_VICTIM: &str = "oom_mark_victim";

    /// Every name above.
    pub const ALL: [&str; 23] = [
        ENTRY[0],
        ENTRY[1],
        ENTRY[2],
        ENTRY[3],
        ENTRY[4],
        ENTRY[5],
        ENTRY[6],
        ENTRY[7],
        ENTRY[8],
        ENTRY[9],
        ENTRY[10],
        FREE_GLIBC_ENTER,
        ALLOC_RETURN,
        NOOP_ENTER,
        NOOP_RETURN,
        BINARY_ENTRY,
        MAPS_CHANGE,
        MAPS_CHANGE_SYSCALL,
        PROCESS_EXEC,
        PROCESS_FORK,
        PROCESS_EXIT,
        SIGNAL_DELIVER,
        OOM_MARK_VICTIM,
    ];
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_name_is_listed_twice() {
        let names = map::ALL.iter().chain(&global::ALL).chain(&program::ALL);
        for (i, a) in names.clone().enumerate() {
            assert_eq!(names.clone().filter(|b| *b == a).count(), 1, "{a} ({i})");
        }
    }

    #[test]
    fn the_entry_programs_follow_the_roles() {
        for r in crate::Role::ALL {
            let name = program::ENTRY[r as usize];
            assert!(name.ends_with("_enter"), "{name}");
        }
        assert_eq!(program::ENTRY[crate::Role::Free as usize], "free_enter");
        assert_eq!(
            program::ENTRY[crate::Role::Xallocx as usize],
            "xallocx_enter"
        );
    }
}
