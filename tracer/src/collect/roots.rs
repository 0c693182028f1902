//! Where a stack may end without being cut short: the functions that start
//! a program, a constructor run by the dynamic loader, or a thread. An
//! unwinder stops there for want of a caller (glibc's `_start` and
//! `clone3` mark their return address undefined, `_dl_start_user` has no
//! CFI), and a walk that ends there is complete.

use std::sync::Arc;

use crate::profile::Frame;

/// Outermost functions of complete stacks.
const ROOTS: &[&str] = &[
    // The program: `_start` → `__libc_start_main` → `__libc_start_call_main`
    // → `main`; constructors from `__libc_start_main` (`call_init`).
    "_start",
    "__libc_start_main",
    "__libc_start_main_impl",
    "__libc_start_call_main",
    "main",
    // Constructors of libraries run by ld.so: `_dl_start_user` → `_dl_init`
    // → `call_init`.
    "_dl_start_user",
    "_dl_init",
    "call_init",
    // Threads: `clone3`/`clone` → `start_thread`.
    "clone",
    "clone3",
    "__clone",
    "__clone3",
    "__clone_internal",
    "start_thread",
];

/// Whether a stack the unwinder marked `truncated` in fact reached a root:
/// its outermost frame is one of ROOTS.
pub fn cut_short(frames: &[Arc<Frame>], truncated: bool) -> bool {
    truncated
        && !frames
            .last()
            .is_some_and(|f| !f.inlined && ROOTS.contains(&f.function.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stack(names: &[&str]) -> Vec<Arc<Frame>> {
        names
            .iter()
            .map(|n| {
                Arc::new(Frame {
                    function: (*n).into(),
                    ..Frame::default()
                })
            })
            .collect()
    }

    #[test]
    fn a_walk_that_stops_at_a_root_is_complete() {
        for root in [
            "main",
            "__libc_start_call_main",
            "_dl_start_user",
            "start_thread",
        ] {
            assert!(!cut_short(&stack(&["leaf", "ctor", root]), true), "{root}");
        }
    }

    #[test]
    fn a_walk_that_stops_elsewhere_is_cut_short() {
        assert!(cut_short(&stack(&["leaf", "deep"]), true));
        assert!(cut_short(&[], true));
        assert!(!cut_short(&stack(&["leaf", "deep"]), false));
    }
}
