#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| memtrace_bpf::fuzzing::saved(data));
