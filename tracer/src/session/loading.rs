//! Loading the BPF programs while SIGINT, SIGTERM and SIGHUP are answered.
//! The kernel verifies a program inside one bpf() call, during which a
//! signal handler does not run, so the load runs on a thread of its own and
//! the main thread waits for it or for a signal: a signal ends the tracer at
//! once, with nothing attached (probes are attached only after the load),
//! and what the loading thread created goes with the process.

use tokio::runtime::Runtime;

use super::{scope::Scope, trace_loop::Signals};
use crate::{
    error::TraceError,
    probes::{
        kernel_features::KernelFeatures,
        loader::{self, EventMaps, Loaded},
        Limits,
    },
    stacks::modules::Modules,
};

/// `loader::load` on a thread, given up on SIGINT, SIGTERM or SIGHUP
/// (`TraceError::InterruptedWhileLoading`).
pub fn load(
    runtime: &Runtime,
    signals: &mut Signals,
    limits: Limits,
    features: KernelFeatures,
    verbose: bool,
) -> anyhow::Result<(Loaded, EventMaps)> {
    let (done, result) = tokio::sync::oneshot::channel();
    if verbose {
        crate::console::say(format_args!(
            "loading the BPF programs (kernel {})",
            crate::escape::text(&features.release)
        ));
    }
    let held = test_delay();
    std::thread::Builder::new()
        .name("bpf-load".into())
        .spawn(move || {
            if let Some(delay) = held {
                std::thread::sleep(delay);
            }
            // The receiver is gone only once a signal ended the wait.
            let _ = done.send(Handover(loader::load(&limits, &features, verbose)));
        })?;
    runtime.block_on(async {
        tokio::select! {
            loaded = result => loaded?.0,
            signal = signals.interrupt() => {
                let name = match signal {
                    libc::SIGTERM => "SIGTERM",
                    libc::SIGHUP => "SIGHUP",
                    _ => "SIGINT",
                };
                Err(TraceError::InterruptedWhileLoading { name, signal }.into())
            }
        }
    })
}

/// MEMTRACE_BPF_TEST_LOAD_DELAY_MS: the integration tests hold the load
/// this long so that a signal surely comes while it runs.
fn test_delay() -> Option<std::time::Duration> {
    let ms = std::env::var("MEMTRACE_BPF_TEST_LOAD_DELAY_MS").ok()?;
    ms.parse().ok().map(std::time::Duration::from_millis)
}

/// The load's result, handed from the loading thread to the main thread.
struct Handover(anyhow::Result<(Loaded, EventMaps)>);

// SAFETY: what is not Send in it are raw pointers to memory the loaded
// maps own (the mmap'ed unwind rows), which move with their owner; the
// loading thread keeps no reference and ends after the handover.
unsafe impl Send for Handover {}

/// The processes' maps and objects, built complete from what the load
/// handed over: the kernel side's code generations and `--unwind tables`'
/// maps taken from `maps`, and `--binary LINK`'s program named as given.
pub fn modules(maps: &mut EventMaps, scope: &Scope) -> Modules {
    let code_gens = maps
        .code_gens
        .take()
        .map(|g| Box::new(g) as Box<dyn crate::stacks::modules::CodeGens>);
    let kernel = maps
        .unwind
        .take()
        .map(|unwind| crate::stacks::kernel_tables::KernelTables::new(Box::new(unwind)));
    let mut shown_as = crate::stacks::shown_as::ShownAs::default();
    if let Some((file, given)) = scope.binary_alias() {
        shown_as.insert(file, given);
    }
    Modules::new(kernel, code_gens, shown_as)
}
