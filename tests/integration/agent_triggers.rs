//! The agent's triggers: a slow leaker trips a growth-rate trigger on its
//! pid, and its profile is pushed to an OTLP collector (`--otlp`); a program spiking in a memory-limited cgroup trips a memory
//! trigger whose trace names the spiking stack before the OOM kill. Each
//! report lands in the reports directory under a name that says when,
//! what and why. PSI triggers are registered with the kernel, and one
//! fires when a reader thrashes the page cache in a small memory cgroup.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::{
    agent::Agent,
    harness::{
        cgroup::{MemoryCgroup, V2Cgroup},
        compile_c,
        otlp::Receiver,
        parse_report,
        sites::FP_FLAGS,
        Target,
    },
};

/// Waits for the first JSON report in the reports directory.
fn first_report(agent: &Agent, within: Duration) -> (String, Value) {
    let deadline = Instant::now() + within;
    loop {
        let found = std::fs::read_dir(&agent.reports).ok().and_then(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.file_name().into_string().unwrap_or_default())
                .find(|n| {
                    std::path::Path::new(n)
                        .extension()
                        .is_some_and(|e| e == "json")
                })
        });
        if let Some(name) = found {
            // Written by a copy: whole once its name is there and it parses.
            let text = std::fs::read_to_string(agent.reports.join(&name)).unwrap_or_default();
            if serde_json::from_str::<Value>(&text).is_ok() {
                return (name, parse_report(&text));
            }
        }
        let (_, triggers) = agent.call("GET", "/triggers", None);
        assert!(Instant::now() < deadline, "no report: {triggers}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn top_function(report: &Value) -> &str {
    report["stacks"][0]["frames"][0]["function"]
        .as_str()
        .unwrap_or("")
}

#[test]
fn a_slow_leaker_trips_a_growth_trigger_and_its_report_is_named_for_it() {
    let bin = compile_c("rss_growth", "trigger-growth", FP_FLAGS);
    let target = Target::start(&bin, &["malloc", "120"]);
    let trigger = format!("pid={} growth>8M/3s seconds=4 formats=pprof", target.pid());
    let receiver = Receiver::start("agent-otlp", 0);
    let url = receiver.url();
    let agent = Agent::start_with(
        "growth-trigger",
        &["--trigger", &trigger, "--otlp", url.as_str()],
    );
    let (name, report) = first_report(&agent, Duration::from_secs(90));
    assert!(
        name.ends_with(&format!("Z-pid-{}-growth.json", target.pid())),
        "{name}"
    );
    assert_eq!(
        top_function(&report),
        "leak_block",
        "{}",
        report["stacks"][0]
    );
    let pprof = agent.reports.join(name.replace(".json", ".pb.gz"));
    assert!(pprof.exists(), "{}", pprof.display());
    let (_, triggers) = agent.call("GET", "/triggers", None);
    let state = &triggers["triggers"][0];
    assert_eq!(state["fired"], 1, "{state}");
    assert_eq!(state["trigger"]["line"], trigger.as_str());
    assert_eq!(state["last_report"], name.as_str());
    // The trace pushed its profile before it ended, the report was kept
    // after: the collector has it, of the leaker.
    let request = receiver.request(1);
    assert_eq!(request["path"], "/v1development/profiles");
    let resource = crate::otlp::resource(&request, target.pid());
    assert!(
        resource["profiles"]
            .as_array()
            .is_some_and(|p| !p.is_empty()),
        "{resource}"
    );
}

#[test]
fn a_spike_in_a_limited_cgroup_is_traced_before_the_oom_kill() {
    let bin = compile_c("rss_growth", "trigger-spike", FP_FLAGS);
    let traced = V2Cgroup::new("spike-trigger");
    // This host's memory controller is on cgroup v1: its cgroup at the
    // same path, as systemd makes them (v2 is checked in the kernel matrix).
    let limited = (!MemoryCgroup::is_v2()).then(|| MemoryCgroup::new("spike-trigger", 400 << 20));
    let trigger = format!(
        "cgroup={} memory>24M seconds=60 sample-rate=65536",
        traced.path()
    );
    let agent = Agent::start_with("spike-trigger", &["--trigger", &trigger]);
    // As on a host where the agent has run for a while: its standby
    // tracer's programs are loaded when the spike comes.
    agent.standby_ready();
    // 20 MiB/s: past the trigger in about 1 s, killed at the limit in
    // about 20 s.
    let mut spike = std::process::Command::new(&bin)
        .args(["malloc", "120", "2"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("start the spike");
    traced.add(spike.id());
    if let Some(m) = &limited {
        std::fs::write(m.procs(), spike.id().to_string()).expect("join the memory cgroup");
    }
    let (name, report) = first_report(&agent, Duration::from_secs(150));
    let status = spike.wait().expect("the spike ends");
    assert!(name.contains("memory-above"), "{name}");
    // A sampled trace of a cgroup, run by the standby tracer: its
    // settings came from the map.
    let (_, traces) = agent.call("GET", "/traces", None);
    assert_eq!(traces["traces"][0]["loaded_ahead"], true, "{traces}");
    assert_eq!(
        top_function(&report),
        "leak_block",
        "{}",
        report["stacks"][0]
    );
    if limited.is_some() {
        use std::os::unix::process::ExitStatusExt as _;
        assert_eq!(status.signal(), Some(9), "OOM-killed: {status:?}");
        assert_eq!(report["oom_kills"], 1, "{}", report["processes"]);
        let leak = crate::harness::inuse_from(&report, "leak_block");
        assert!(leak.1 >= 64 << 20, "the spike's heap at the kill: {leak:?}");
    }
    drop(limited);
}

#[test]
fn psi_triggers_are_registered_with_the_kernel() {
    let agent = Agent::start_with(
        "psi-trigger",
        &["--trigger", "pid=1 psi-some>150ms/2s seconds=10"],
    );
    let (_, triggers) = agent.call("GET", "/triggers", None);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut state = triggers["triggers"][0].clone();
    while state.is_null() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        state = agent.call("GET", "/triggers", None).1["triggers"][0].clone();
    }
    assert_eq!(state["error"], Value::Null, "{state}");
    assert_eq!(state["trigger"]["condition"]["pressure"]["window"], 2.0);
}

#[test]
fn page_cache_thrashing_fires_a_psi_trigger() {
    use std::io::Write as _;
    let bin = compile_c("file_thrash", "trigger-psi", FP_FLAGS);
    // A file four times the cgroup's limit: each pass reads it from disk.
    let data = crate::harness::scratch("psi-thrash.data");
    {
        let mut file = std::fs::File::create(&data).expect("the data file");
        let chunk = vec![0x5au8; 1 << 20];
        for _ in 0..96 {
            file.write_all(&chunk).expect("write the data file");
        }
        file.sync_all().expect("sync the data file");
    }
    let limited = MemoryCgroup::new("psi-trigger", 24 << 20);
    let mut reader = std::process::Command::new(&bin)
        .arg(&data)
        .arg("60")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start the reader");
    let mut out = crate::harness::Lines::new(reader.stdout.take().expect("stdout"));
    out.wait_for("ready", "the reader starts");
    std::fs::write(limited.procs(), reader.id().to_string()).expect("join the memory cgroup");
    let trigger = format!(
        "pid={} psi-some>100ms/2s seconds=5 sample-rate=1",
        reader.id()
    );
    let agent = Agent::start_with("psi-fire", &["--trigger", &trigger]);
    // Registered first: the kernel's trigger only sees stalls after it.
    let deadline = Instant::now() + Duration::from_secs(20);
    while agent.call("GET", "/triggers", None).1["triggers"][0].is_null() {
        assert!(Instant::now() < deadline, "the trigger never armed");
        std::thread::sleep(Duration::from_millis(100));
    }
    writeln!(reader.stdin.as_ref().expect("stdin"), "go").expect("start the reads");
    let (name, report) = first_report(&agent, Duration::from_secs(90));
    assert!(name.contains("-psi-some"), "{name}");
    let (_, triggers) = agent.call("GET", "/triggers", None);
    assert!(
        triggers["triggers"][0]["fired"].as_u64() >= Some(1),
        "{triggers}"
    );
    // The trace was of the reader: its buffers, allocated in read_pass.
    let allocated = report["stacks"]
        .as_array()
        .expect("stacks")
        .iter()
        .any(|s| s["frames"][0]["function"] == "read_pass");
    assert!(allocated, "{}", report["stacks"]);
    let _ = reader.kill();
    let _ = reader.wait();
    drop(limited);
    let _ = std::fs::remove_file(&data);
}
