//! The ring buffer's reader never stalls: a million blocks allocated as
//! fast as one thread can, all kept, traced exactly with the default ring
//! buffer, lose nothing, while the heap model's tables grow behind the
//! reader thread.

use crate::harness::{
    compile_c,
    sites::{assert_no_losses, trace_sites_with},
    Target,
};

const BLOCKS: u64 = 1_000_000;

#[test]
fn a_million_block_build_up_in_exact_mode_loses_nothing_with_the_default_ring_buffer() {
    let bin = compile_c("buildup", "O2", &["-O2"]);
    let mut target = Target::start(&bin, &[&BLOCKS.to_string()]);
    // Frame-pointer stacks keep each event small, so what is measured is
    // the reader, not the copy of a million stacks.
    let (report, _) = trace_sites_with(
        &mut target,
        "buildup",
        true,
        libc::SIGINT,
        &["--ringbuf-mb", "16", "--unwind", "fp"],
    );
    assert_no_losses(&report);
    let totals = &report["totals"];
    assert_eq!(totals["inuse_objects"], BLOCKS, "{totals}");
    assert_eq!(totals["inuse_bytes"], 24 * BLOCKS, "{totals}");
}
