#![no_std]
// This file exists so that tracer/build.rs can name this crate as a
// build-dependency: cargo then rebuilds the BPF object when it changes.
