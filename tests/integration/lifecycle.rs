//! The report is complete whatever ends the trace: SIGTERM, SIGHUP, the
//! target exiting, or the duration; and what then becomes of a `-- CMD` command.

use std::{os::unix::process::ExitStatusExt, path::PathBuf};

use crate::harness::{
    compile_c,
    process::{proc_state, ready_pid, send, stack_from, state_file, wait_for_line},
    read_json,
    sites::{assert_sites_exact, trace_sites_to_json, FP_FLAGS},
    JsonTracer, Target, Tracer,
};

#[test]
fn sigterm_during_the_trace_still_writes_the_whole_report() {
    let bin = compile_c("sites", "fp-sigterm", FP_FLAGS);
    let mut target = Target::start(&bin, &[]);
    let report = trace_sites_to_json(&mut target, "sigterm", true, libc::SIGTERM);
    assert_eq!(report["end_reason"], "terminated (SIGTERM)");
    assert_sites_exact(&report);
}

/// SIGHUP (the terminal or SSH session the tracer ran in closed) ends the
/// trace as SIGTERM does, with the whole report.
#[test]
fn sighup_during_the_trace_still_writes_the_whole_report() {
    let bin = compile_c("sites", "fp-sighup", FP_FLAGS);
    let mut target = Target::start(&bin, &[]);
    let report = trace_sites_to_json(&mut target, "sighup", true, libc::SIGHUP);
    assert_eq!(report["end_reason"], "hung up (SIGHUP)");
    assert_sites_exact(&report);
}

#[test]
fn a_target_that_exits_mid_trace_still_gets_its_report_with_names() {
    let bin = compile_c("sites", "fp-exit", FP_FLAGS);
    let mut target = Target::start(&bin, &["exit"]);
    let pid = target.pid();
    let tracer = JsonTracer::start("exit", &["--pid", &pid.to_string(), "--duration", "120"]);
    target.run_sites();
    assert!(target.wait_exit().success());
    // The tracer notices the exit by itself, long before the duration.
    let (report, _) = tracer.finish();
    assert_eq!(report["end_reason"], "target exited");
    assert_eq!(report["processes"][0]["pid"], pid);
    assert_eq!(report["processes"][0]["exited"], true);
    // What it never freed is what it leaked; frames were named after exit.
    assert_sites_exact(&report);
}

#[test]
fn duration_ends_the_trace_with_a_text_report() {
    let bin = compile_c("sites", "fp-duration", FP_FLAGS);
    let mut target = Target::start(&bin, &[]);
    let tracer = Tracer::start(&["--pid", &target.pid().to_string(), "--duration", "3"]);
    target.run_sites();
    let out = tracer.finish();
    assert!(out.status.success(), "tracer failed: {}", out.stderr);
    assert!(out.stdout.contains("duration elapsed"), "{}", out.stdout);
    assert!(out.stdout.contains("site_malloc"), "{}", out.stdout);
}

/// Attaching and detaching while the target allocates must not confuse
/// entries with returns: a block freed right away is never reported live,
/// and the realloc'd buffer is exactly one live block.
#[test]
fn a_target_busy_during_attach_and_detach_is_counted_right() {
    let bin = compile_c("steady", "fp", FP_FLAGS);
    let target = Target::start(&bin, &[]);
    for round in 0..2 {
        let tracer = JsonTracer::start(
            "steady",
            &["--pid", &target.pid().to_string(), "--duration", "1"],
        );
        let (report, _) = tracer.finish();
        let sites = crate::harness::sites::per_site(&report);
        let request = sites.get("request").copied().unwrap_or_default();
        let grow = sites.get("grow").copied().unwrap_or_default();
        assert!(
            request[3] > 100 && grow[3] > 100,
            "round {round}: too few calls seen: {sites:?}"
        );
        // The report is the heap at the stop instant, which may fall
        // between one request's malloc(256)/calloc(8, 64) and their frees:
        // at most those two blocks. Stale pairings (the bug this test
        // guards against) left many blocks live, or bytes on wrong stacks.
        let in_flight = [[0, 0], [256, 1], [512, 1], [768, 2]];
        assert!(
            in_flight.contains(&[request[0], request[1]]),
            "round {round}: request keeps nothing beyond one call in flight: {sites:?}"
        );
        // One buffer, or none in the instant between free(buf) and the
        // realloc(NULL) that starts over (once every 256 calls).
        assert!(
            grow[1] <= 1,
            "round {round}: one grow buffer is live: {sites:?}"
        );
        assert_eq!(
            grow[0] % 4096,
            0,
            "round {round}: grow buffer size: {sites:?}"
        );
        let losses = &report["losses"];
        assert_eq!(losses["stale_inflight"], 0, "{losses}");
        assert!(
            !report["notes"].to_string().contains("reused an address"),
            "round {round}: {}",
            report["notes"]
        );
    }
}

/// Ctrl-C while the probes are still being attached (before "tracing")
/// ends the trace with a report, not by killing the tracer.
#[test]
fn ctrl_c_during_attach_still_writes_a_report() {
    let bin = compile_c("sites", "fp-early-int", FP_FLAGS);
    let target = Target::start(&bin, &[]);
    let pid = target.pid().to_string();
    let mut tracer = JsonTracer::spawn("early-sigint", &["--verbose", "--pid", &pid]);
    // --verbose lists each hook once it is attached, before tracing starts.
    tracer.stderr.wait_for(": attached", "first hook attached");
    let (report, _) = tracer.stop();
    assert_eq!(report["end_reason"], "interrupted (SIGINT)");
    assert_eq!(report["processes"][0]["pid"], target.pid());
}

/// SIGINT, SIGTERM and SIGHUP while the BPF programs are being loaded (the kernel
/// verifying them, which no signal handler interrupts) end the tracer at
/// once: status 128 + the signal, a last line that says so, nothing
/// attached. The test holds the load for two minutes so that the signal
/// surely comes during it; the harness gives up waiting after one.
#[test]
fn a_signal_while_loading_ends_the_tracer_at_once() {
    let bin = compile_c("sites", "fp-load-signal", FP_FLAGS);
    for (sig, name) in [
        (libc::SIGINT, "SIGINT"),
        (libc::SIGTERM, "SIGTERM"),
        (libc::SIGHUP, "SIGHUP"),
    ] {
        let target = Target::start(&bin, &[]);
        let pid = target.pid().to_string();
        let mut tracer = Tracer::spawn_env(
            &["--verbose", "--pid", &pid],
            &[("MEMTRACE_BPF_TEST_LOAD_DELAY_MS", "120000")],
        );
        tracer
            .stderr
            .wait_for("loading the BPF programs", "loading started");
        tracer.signal(sig);
        let out = tracer.finish();
        assert_eq!(out.status.code(), Some(128 + sig), "{}", out.stderr);
        let last = out.stderr.lines().last().unwrap_or_default();
        assert!(
            last.contains(&format!(
                "stopped by {name} while loading the BPF programs: nothing was attached"
            )),
            "{}",
            out.stderr
        );
        assert!(!out.stderr.contains("tracing pid"), "{}", out.stderr);
    }
}

/// Starts `lifecycle STATE MODE` under the tracer (JSON report to
/// TAG.json), with `extra` tracer flags; returns the tracer, the pid of
/// the command once it is ready, and its state file.
fn start_lifecycle(tag: &str, mode: &str, extra: &[&str]) -> (JsonTracer, libc::pid_t, PathBuf) {
    let bin = compile_c("lifecycle", "fp", FP_FLAGS);
    let state = state_file(tag);
    let mut args = extra.to_vec();
    args.extend_from_slice(&[
        "--",
        bin.to_str().expect("utf-8 path"),
        state.to_str().expect("utf-8 path"),
        mode,
    ]);
    let tracer = JsonTracer::spawn(tag, &args);
    let pid = ready_pid(&state);
    (tracer, pid, state)
}

/// What the command allocated while shutting down is in the report.
fn assert_shutdown_recorded(report: &serde_json::Value) {
    let stack = stack_from(report, "on_shutdown")
        .unwrap_or_else(|| panic!("no stack from on_shutdown: {}", report["stacks"]));
    assert_eq!(stack["inuse_bytes"], 3333, "{stack}");
}

fn note_containing(report: &serde_json::Value, needle: &str) -> String {
    let notes = report["notes"].as_array().expect("notes");
    notes
        .iter()
        .filter_map(|n| n.as_str())
        .find(|n| n.contains(needle))
        .unwrap_or_else(|| panic!("no note containing {needle:?}: {notes:?}"))
        .to_string()
}

/// --duration ends the trace before the command: the command gets SIGTERM,
/// is traced while it shuts down, and is gone when the tracer exits.
#[test]
fn duration_end_sends_sigterm_to_the_command_and_records_its_shutdown() {
    let (tracer, pid, state) = start_lifecycle("end-duration", "shutdown", &["-d", "3"]);
    let (report, _) = tracer.finish();
    wait_for_line(&state, &format!("got signal {}", libc::SIGTERM));
    assert_eq!(proc_state(pid), None, "the command outlived the tracer");
    assert_eq!(report["end_reason"], "duration elapsed");
    assert_eq!(
        report["processes"][0]["exit_status"],
        "exited with status 0"
    );
    note_containing(&report, "it was sent SIGTERM and exited");
    assert_shutdown_recorded(&report);
}

/// SIGINT to the tracer (Ctrl-C) reaches the command as SIGINT.
#[test]
fn sigint_to_the_tracer_is_passed_on_to_the_command() {
    let (tracer, pid, state) = start_lifecycle("end-sigint", "shutdown", &[]);
    let (report, _) = tracer.stop();
    wait_for_line(&state, &format!("got signal {}", libc::SIGINT));
    assert_eq!(proc_state(pid), None, "the command outlived the tracer");
    assert_eq!(report["end_reason"], "interrupted (SIGINT)");
    note_containing(&report, "it was sent SIGINT and exited");
    assert_shutdown_recorded(&report);
}

/// SIGHUP to the tracer reaches the command as SIGHUP, which is traced
/// while it shuts down, as for SIGTERM.
#[test]
fn sighup_to_the_tracer_is_passed_on_to_the_command() {
    let (tracer, pid, state) = start_lifecycle("end-sighup", "shutdown", &[]);
    let (report, _) = tracer.stop_with(libc::SIGHUP);
    wait_for_line(&state, &format!("got signal {}", libc::SIGHUP));
    assert_eq!(proc_state(pid), None, "the command outlived the tracer");
    assert_eq!(report["end_reason"], "hung up (SIGHUP)");
    note_containing(&report, "it was sent SIGHUP and exited");
    assert_shutdown_recorded(&report);
}

/// A command that ignores SIGTERM is killed after the grace time; with
/// --exit-status the tracer exits as a shell reports a SIGKILL.
#[test]
fn a_command_that_ignores_sigterm_is_killed_after_the_grace_time() {
    let (tracer, pid, _state) = start_lifecycle("end-stubborn", "stubborn", &["--exit-status"]);
    tracer.signal(libc::SIGTERM);
    let (out, path) = tracer.finish_unchecked();
    assert_eq!(
        out.status.code(),
        Some(128 + libc::SIGKILL),
        "{}",
        out.stderr
    );
    assert_eq!(proc_state(pid), None, "the command outlived the tracer");
    let report = read_json(&path);
    assert_eq!(report["end_reason"], "terminated (SIGTERM)");
    assert_eq!(report["processes"][0]["exit_status"], "killed by signal 9");
    note_containing(
        &report,
        "was killed (SIGKILL) when it had not exited within",
    );
}

/// --keep-running: the command outlives the trace, running and no longer
/// held by ptrace.
#[test]
fn keep_running_leaves_the_command_running_untraced() {
    let (tracer, pid, state) = start_lifecycle("end-keep", "shutdown", &["--keep-running"]);
    let (report, out) = tracer.stop_with(libc::SIGTERM);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("the command is gone ({e}): {}", out.stderr));
    assert!(
        status.contains("\nTracerPid:\t0\n"),
        "still traced: {status}"
    );
    assert!(
        matches!(proc_state(pid), Some('S' | 'R')),
        "not running: {:?}",
        proc_state(pid)
    );
    assert_eq!(report["end_reason"], "terminated (SIGTERM)");
    note_containing(
        &report,
        "was left running, no longer traced (--keep-running)",
    );
    // It was not told to stop: it still waits for a signal, and acts on it.
    send(pid, libc::SIGTERM);
    wait_for_line(&state, &format!("got signal {}", libc::SIGTERM));
}

/// The file offset of `bin`'s ELF entry point (64-bit little-endian ELF).
fn entry_file_offset(bin: &std::path::Path) -> u64 {
    let elf = std::fs::read(bin).expect("read the target");
    let u64_at = |at: usize| u64::from_le_bytes(elf[at..at + 8].try_into().expect("8 bytes"));
    let u16_at = |at: usize| u16::from_le_bytes(elf[at..at + 2].try_into().expect("2 bytes"));
    let entry = u64_at(0x18);
    let (phoff, phentsize, phnum) = (u64_at(0x20) as usize, u16_at(0x36), u16_at(0x38));
    (0..phnum as usize)
        .map(|i| phoff + i * phentsize as usize)
        .filter(|&ph| elf[ph..ph + 4] == 1u32.to_le_bytes()) // PT_LOAD
        .find_map(|ph| {
            let (offset, vaddr, filesz) = (u64_at(ph + 8), u64_at(ph + 0x10), u64_at(ph + 0x20));
            (vaddr..vaddr + filesz)
                .contains(&entry)
                .then(|| entry - vaddr + offset)
        })
        .expect("entry point in a PT_LOAD segment")
}

/// The byte at file offset `offset` of `bin` as process `pid` sees it in
/// memory: a uprobe shows as int3 (0xcc) there.
fn byte_in_memory(pid: u32, bin: &std::path::Path, offset: u64) -> u8 {
    use std::os::unix::fs::FileExt;
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).expect("read maps");
    let name = bin.to_str().expect("utf-8 path");
    let address = maps
        .lines()
        .filter(|l| l.ends_with(name))
        .find_map(|l| {
            let mut fields = l.split_whitespace();
            let (start, end) = fields.next()?.split_once('-')?;
            let start = u64::from_str_radix(start, 16).ok()?;
            let end = u64::from_str_radix(end, 16).ok()?;
            fields.next();
            let map_offset = u64::from_str_radix(fields.next()?, 16).ok()?;
            (map_offset..map_offset + (end - start))
                .contains(&offset)
                .then(|| start + offset - map_offset)
        })
        .unwrap_or_else(|| panic!("offset {offset:#x} of {name} not mapped:\n{maps}"));
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).expect("open mem");
    let mut byte = [0u8];
    mem.read_exact_at(&mut byte, address).expect("read mem");
    byte[0]
}

/// SIGKILL of the tracer leaves nothing attached: its uprobes are links
/// owned by its file descriptors, and the kernel removes them when it
/// dies. Seen in the target's memory: --binary puts a uprobe on the
/// program's entry point (no other trace probes this freshly built file),
/// whose int3 byte must be gone once the tracer is.
#[test]
fn sigkill_of_the_tracer_leaves_no_probe_in_the_target() {
    let bin = compile_c("sites", "fp-sigkill", FP_FLAGS);
    let target = Target::start(&bin, &[]);
    let offset = entry_file_offset(&bin);
    let original = std::fs::read(&bin).expect("read the target")[offset as usize];
    let tracer = Tracer::start(&["--binary", bin.to_str().expect("utf-8 path")]);
    assert_eq!(
        byte_in_memory(target.pid(), &bin, offset),
        0xcc,
        "the entry probe is not visible as int3: this check cannot work"
    );
    tracer.signal(libc::SIGKILL);
    let out = tracer.finish();
    assert_eq!(out.status.signal(), Some(libc::SIGKILL), "{}", out.stderr);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while byte_in_memory(target.pid(), &bin, offset) != original {
        assert!(
            std::time::Instant::now() < deadline,
            "the uprobe is still in the target 60 s after the tracer was killed"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// --interval with `{n}` snapshots under `-- CMD`, the duration a multiple
/// of the interval: the last tick's snapshot comes as the command is sent
/// SIGTERM. Taking it must not consume the command's ptrace stop for that
/// signal (it was left stopped, never got SIGTERM, and was SIGKILLed
/// after the grace time: the tracer exited 137 after 8 s).
#[test]
fn numbered_snapshots_at_the_end_of_the_duration_leave_the_command_its_sigterm() {
    let bin = compile_c("lifecycle", "fp", FP_FLAGS);
    let state = state_file("snap-end");
    let dir = crate::harness::scratch("snap-end");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let pattern = dir.join("s-{n}.json");
    let tracer = Tracer::spawn(&[
        "-q",
        "--interval",
        "1",
        "-d",
        "3",
        "--format",
        "json",
        "-o",
        pattern.to_str().expect("utf-8 path"),
        "--exit-status",
        "--",
        bin.to_str().expect("utf-8 path"),
        state.to_str().expect("utf-8 path"),
        "shutdown",
    ]);
    let pid = ready_pid(&state);
    let out = tracer.finish();
    assert_eq!(out.status.code(), Some(0), "{}", out.stderr);
    wait_for_line(&state, &format!("got signal {}", libc::SIGTERM));
    assert_eq!(proc_state(pid), None, "the command outlived the tracer");
    let last = (1..=8)
        .rev()
        .map(|n| dir.join(format!("s-{n}.json")))
        .find(|p| p.exists())
        .expect("numbered reports written");
    let report = read_json(&last);
    assert_eq!(report["end_reason"], "duration elapsed");
    assert_eq!(
        report["processes"][0]["exit_status"],
        "exited with status 0"
    );
    note_containing(&report, "it was sent SIGTERM and exited");
    assert_shutdown_recorded(&report);
}
