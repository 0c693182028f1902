//! Loading the BPF programs while SIGINT, SIGTERM and SIGHUP are answered.
//! The kernel verifies a program inside one bpf() call, during which a
//! signal handler does not run, so the load runs on a thread of its own and
//! the main thread waits for it or for a signal: a signal ends the tracer at
//! once, with nothing attached (probes are attached only after the load),
//! and what the loading thread created goes with the process.

use tokio::runtime::Runtime;

use super::{scope::Scope, trace_loop::Signals};
use crate::{
    console,
    error::TraceError,
    escape,
    probes::{
        hooks::Hooks,
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

/// --verbose: the mode in one line and each program's verified
/// instructions (a mode the verifier refused was said on its own, and the
/// report's header and notes say what was used in any case).
pub fn say_mode(loaded: &Loaded, sessions: bool) {
    console::say(format_args!(
        "{}",
        escape::text(&loaded.mode_line(sessions))
    ));
    for (program, n) in loaded.verified_instructions() {
        console::say(format_args!(
            "program {program} verified in {n} instructions"
        ));
    }
}

/// With `--unwind tables`, the tables of a command about to start and of
/// the hooked objects, built before the command runs: its first
/// allocations are walked in the kernel, not handed back.
pub fn prepare_tables(modules: &mut Modules, scope: &Scope, hooks: &Hooks) {
    if modules.kernel().tables().is_none() {
        return;
    }
    let hooked = hooks.hooked_objects();
    for path in scope
        .command_path()
        .into_iter()
        .map(Into::into)
        .chain(hooked.map(|h| h.host_path.clone()))
    {
        modules.prepare_table(&path);
    }
}

/// --verbose: how code generations are kept, and why uprobe sessions are
/// not used when they were wanted.
pub fn say_code_gen_and_sessions(loaded: &Loaded) {
    let said = match &loaded.code_gen {
        Ok((true, _)) => "code generations kept by an fexit program on mmap".to_string(),
        Ok((false, why)) => format!(
            "code generations kept by a tracepoint on every system call's exit \
             (fexit refused: {})",
            why.as_deref().unwrap_or("")
        ),
        Err(why) => {
            format!("code generations unavailable, frames named from the maps as read: {why}")
        }
    };
    console::say(format_args!("{}", escape::text(&said)));
    if let Some(why) = &loaded.session_error {
        console::say(format_args!(
            "uprobe sessions unavailable, using uprobes + uretprobes: {}",
            escape::text(why)
        ));
    }
}
