//! Call stacks: unwinding copied stacks with CFI, and naming frames.

pub mod cfi;
pub mod modules;
pub mod symbolize;
mod symtab;
pub mod unwind;
#[cfg_attr(
    not(test),
    expect(
        dead_code,
        reason = "groundwork for in-kernel unwinding (#21): built and tested, not used at run time yet"
    )
)]
pub(crate) mod unwind_table;
