//! The traced programs as files and processes: /proc inspection, starting
//! a command, the allocator symbol tables, ELF reading and the dynamic
//! loader's search order.

pub mod allocators;
pub mod cgroup;
pub mod elf;
pub mod entry_points;
pub mod entry_stop;
pub mod identity;
pub mod launch;
pub mod ld_so_conf;
pub mod liveness;
pub mod memory;
pub mod process;
pub mod search;
