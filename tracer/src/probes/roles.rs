//! What the probes do for each allocator role: one row per `Role`, so that
//! the program, the arguments it reads and whether the role's C function
//! must exist are decided in one place instead of in `attach`.

use iced_x86::Register::{self, RDI, RDX, RSI};
use tracer_common::{names::program, Role};

use crate::tracee::entry_points::AllocatorKind;

/// How one role is probed.
pub struct RoleProbe {
    pub role: Role,
    /// The entry program in tracer-ebpf.
    pub program: &'static str,
    /// The argument registers the entry program reads (System V ABI order
    /// rdi, rsi, rdx): instructions skipped by probe placement must not
    /// write them.
    pub args: &'static [Register],
    /// The C name that the object malloc resolves to must define: without
    /// it calls of this role would go uncounted (malloc and free).
    pub required: Option<&'static str>,
    /// Whether a return probe reads the result (all but free, which
    /// returns nothing).
    pub returns: bool,
}

/// One row per role, in `Role` discriminant order (a test checks it).
pub const ROLES: [RoleProbe; 11] = [
    row(Role::Malloc, &[RDI], Some("malloc")),
    row(Role::Calloc, &[RDI, RSI], None),
    row(Role::Realloc, &[RDI, RSI], None),
    row(Role::ReallocArray, &[RDI, RSI, RDX], None),
    RoleProbe {
        returns: false,
        ..row(Role::Free, &[RDI], Some("free"))
    },
    row(Role::PosixMemalign, &[RDI, RDX], None),
    row(Role::AlignedAlloc, &[RSI], None),
    row(Role::Memalign, &[RSI], None),
    row(Role::Valloc, &[RDI], None),
    row(Role::Pvalloc, &[RDI], None),
    row(Role::Xallocx, &[RDI, RSI, RDX], None),
];

/// The row of `role`, probed by its entry program in tracer-ebpf.
const fn row(role: Role, args: &'static [Register], required: Option<&'static str>) -> RoleProbe {
    RoleProbe {
        role,
        program: program::ENTRY[role as usize],
        args,
        required,
        returns: true,
    }
}

/// free's entry program for an object of allocator `kind`: glibc's also
/// reads the size of a block the trace never saw allocated from its chunk
/// header.
pub fn free_program(kind: AllocatorKind) -> &'static str {
    match kind {
        AllocatorKind::Glibc => FREE_GLIBC_PROGRAM,
        _ => of(Role::Free).program,
    }
}

/// glibc's free program in tracer-ebpf.
pub const FREE_GLIBC_PROGRAM: &str = program::FREE_GLIBC_ENTER;

/// The row of `role`.
pub fn of(role: Role) -> &'static RoleProbe {
    &ROLES[role as usize]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_row_per_role_in_discriminant_order() {
        assert_eq!(ROLES.len(), Role::ALL.len());
        for role in Role::ALL {
            assert_eq!(of(role).role, role);
        }
    }

    #[test]
    fn only_malloc_and_free_are_required_and_free_has_no_return() {
        let required: Vec<&str> = ROLES.iter().filter_map(|r| r.required).collect();
        assert_eq!(required, ["malloc", "free"]);
        let no_return: Vec<Role> = ROLES
            .iter()
            .filter(|r| !r.returns)
            .map(|r| r.role)
            .collect();
        assert_eq!(no_return, [Role::Free]);
    }
}
