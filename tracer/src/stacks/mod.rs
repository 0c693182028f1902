//! Call stacks: unwinding copied stacks with CFI, and naming frames.

pub mod cfi;
mod debug_files;
pub mod debuginfod;
pub mod jit;
pub mod kernel_tables;
pub mod modules;
mod roots;
pub mod shown_as;
pub mod symbolize;
mod symbolless;
mod symtab;
pub mod trampolines;
pub mod unwind;
pub(crate) mod unwind_table;
