//! `memtrace-bpf agent`: nothing is attached until a trace is asked for
//! (only the standby tracer runs, its programs loaded); traces of two
//! processes at two sample rates run at once, the first given to the
//! standby tracer, each with its own numbers; a trace ends early on
//! DELETE with its final profile; `go tool pprof` reads the on-demand heap
//! profile; `--agent` runs the usual
//! command line through it; the Unix socket refuses other users; bad
//! requests get a 4xx and start nothing.

use std::{
    os::unix::{fs::PermissionsExt as _, process::CommandExt as _},
    path::Path,
    process::Command,
};

use memtrace_bpf::agent::client::request;
use serde_json::Value;

pub(crate) use crate::harness::agent::Agent;
use crate::harness::{
    compile_c,
    pprof::pprof,
    scratch,
    sites::{assert_sites_exact, O2_FLAGS},
    Target, TRACER,
};

/// The probes a process holds: its perf-event and BPF-link descriptors.
fn probes_held(pid: u32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("the process's descriptors")
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .map(|target| target.to_string_lossy().into_owned())
        .filter(|t| t.contains("perf_event") || t.contains("bpf_link"))
        .collect()
}

fn sites_target() -> Target {
    Target::start(&compile_c("sites", "agent-sites", O2_FLAGS), &[])
}

/// The pid of each of the profile's stacks.
fn stack_pids(profile: &Value) -> Vec<u64> {
    profile["stacks"]
        .as_array()
        .expect("stacks")
        .iter()
        .filter_map(|s| s["pid"].as_u64())
        .collect()
}

/// Only `pid`'s stacks, and each of its sites exactly.
fn assert_sites_of(profile: &Value, pid: u32) {
    let pids = stack_pids(profile);
    assert!(pids.iter().all(|&p| p == u64::from(pid)), "{pids:?}");
    assert_sites_exact(profile);
}

#[test]
fn traces_start_on_request_run_side_by_side_and_end_early_on_delete() {
    let agent = Agent::start("traces");
    // Before a request only the standby tracer runs: its programs are
    // loaded, and attached nowhere.
    let standby = agent.standby_ready();
    assert_eq!(probes_held(standby), Vec::<String>::new());
    assert!(agent.tracers().is_empty(), "nothing runs before a request");
    let (status, list) = agent.call("GET", "/traces", None);
    assert_eq!((status, &list["traces"]), (200, &Value::Array(vec![])));

    let (mut a, mut b) = (sites_target(), sites_target());
    let exact = agent.post(&format!(
        r#"{{"pid": {}, "seconds": 120, "sample_rate": 1}}"#,
        a.pid()
    ));
    let sampled = agent.post(&format!(
        r#"{{"pid": {}, "seconds": 120, "sample_rate": 4096, "interval": 1}}"#,
        b.pid()
    ));
    assert_eq!(agent.tracers().len(), 2);
    // The first was given to the standby tracer, the second loaded its own
    // programs: both count exactly (below).
    for (id, ahead) in [(exact, true), (sampled, false)] {
        let state = agent.wait(id, "attached", |s| s["attached"] == true);
        assert_eq!(state["loaded_ahead"], ahead, "{state}");
    }
    a.run_sites();
    b.run_sites();
    // The profile so far: a snapshot of the sampled trace, still running.
    let so_far = agent.wait(sampled, "wrote a snapshot", |s| s["profile"] == true);
    assert_eq!(so_far["state"], "running", "{so_far}");
    let (status, svg) = request(
        &agent.unix(),
        "GET",
        &format!("/traces/{sampled}?format=flamegraph"),
        None,
    )
    .unwrap();
    assert_eq!(status, 200);
    assert!(
        String::from_utf8_lossy(&svg).contains("<svg"),
        "a flamegraph"
    );

    for id in [exact, sampled] {
        let (status, state) = agent.call("DELETE", &format!("/traces/{id}"), None);
        assert_eq!(status, 202, "{state}");
    }
    for id in [exact, sampled] {
        let done = agent.wait(id, "ended", |s| s["state"] != "running");
        assert_eq!(
            (&done["state"], &done["ended_early"]),
            (&"done".into(), &true.into()),
            "{done}"
        );
        assert!(done["elapsed_secs"].as_f64() < Some(100.0), "{done}");
    }
    let exact_profile = agent.profile(exact);
    assert_eq!(exact_profile["sample_rate"], 1);
    assert_sites_of(&exact_profile, a.pid());
    let sampled_profile = agent.profile(sampled);
    assert_eq!(sampled_profile["sample_rate"], 4096);
    let pids = stack_pids(&sampled_profile);
    assert!(
        !pids.is_empty() && pids.iter().all(|&p| p == u64::from(b.pid())),
        "{pids:?}"
    );
    assert!(agent.tracers().is_empty(), "the tracers were reaped");
    // Their files: the final profile and the log of each, nothing older
    // (and the next standby tracer's log).
    let mut files: Vec<String> = std::fs::read_dir(&agent.dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|name| !name.starts_with("standby-"))
        .collect();
    files.sort();
    assert_eq!(files.len(), 4, "{files:?}");
    // Stopped (SIGTERM) while a trace runs, the agent ends its standby
    // tracer and starts no other as the trace winds down: no standby
    // tracer's log is left.
    let last = agent.post(&format!(r#"{{"pid": {}, "seconds": 120}}"#, a.pid()));
    agent.wait(last, "attached", |s| s["attached"] == true);
    let dir = agent.dir.clone();
    drop(agent);
    let standby_logs: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.starts_with("standby-"))
        .collect();
    assert_eq!(standby_logs, Vec::<String>::new());
}

#[test]
fn go_tool_pprof_reads_the_on_demand_heap_profile() {
    let agent = Agent::start("pprof");
    let bin = compile_c("rss_growth", "agent-rss", crate::harness::sites::FP_FLAGS);
    let target = Target::start(&bin, &["malloc", "60"]);
    let (status, body) = crate::harness::http::get(
        &agent.tcp,
        &format!(
            "/debug/pprof/heap?pid={}&seconds=3&sample_rate=1",
            target.pid()
        ),
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let file = scratch("agent-heap.pb");
    std::fs::write(&file, &body).unwrap();
    let top = pprof(&["-top", "-sample_index=inuse_space"], &file);
    assert!(top.contains("leak_block"), "{top}");
    assert!(top.contains("Type: inuse_space"), "{top}");
    let (status, _) = crate::harness::http::get(
        &agent.tcp,
        &format!("/debug/pprof/allocs?pid={}&seconds=1", target.pid()),
    );
    assert_eq!(status, 200);
    let allocs = scratch("agent-allocs.pb");
    let (_, body) = crate::harness::http::get(
        &agent.tcp,
        &format!(
            "/debug/pprof/allocs?pid={}&seconds=1&sample_rate=1",
            target.pid()
        ),
    );
    std::fs::write(&allocs, &body).unwrap();
    assert!(pprof(&["-top"], &allocs).contains("Type: alloc_space"));
}

#[test]
fn the_agent_flag_runs_the_usual_command_line_through_it() {
    let agent = Agent::start("client");
    let bin = compile_c(
        "rss_growth",
        "agent-client",
        crate::harness::sites::FP_FLAGS,
    );
    let target = Target::start(&bin, &["malloc", "60"]);
    let out = scratch("agent-client.json");
    let run = Command::new(TRACER)
        .arg("--agent")
        .arg(&agent.socket)
        .args([
            "--pid",
            &target.pid().to_string(),
            "-d",
            "3",
            "--sample-rate",
            "1",
        ])
        .args(["-f", "json", "-o"])
        .arg(&out)
        .output()
        .expect("run the client");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    assert!(stderr.contains("through the agent done"), "{stderr}");
    let report = crate::harness::read_json(&out);
    assert_eq!(report["sample_rate"], 1);
    let leak = crate::harness::inuse_from(&report, "leak_block");
    assert!(leak.0 >= 20 && leak.1 >= 20 << 20, "{leak:?}");
    // What does not go through an agent is said.
    let refused = Command::new(TRACER)
        .arg("--agent")
        .arg(&agent.socket)
        .args(["--", "/bin/true"])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("is not taken through --agent"));
}

#[test]
fn the_socket_refuses_other_users_and_bad_requests_start_nothing() {
    let agent = Agent::start("guard");
    let mode = std::fs::metadata(&agent.socket)
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "{mode:o}");
    let connect = format!(
        "import socket; s = socket.socket(socket.AF_UNIX); s.connect({:?})",
        agent.socket.to_str().unwrap()
    );
    let nobody = Command::new("python3")
        .args(["-c", &connect])
        .uid(65534)
        .gid(65534)
        .output()
        .expect("python3 as nobody");
    assert!(!nobody.status.success());
    assert!(String::from_utf8_lossy(&nobody.stderr).contains("PermissionError"));

    let bad: [(&str, &str, Option<&str>, u16, &str); 9] = [
        (
            "POST",
            "/traces",
            Some("not json"),
            400,
            "not a trace request",
        ),
        (
            "POST",
            "/traces",
            Some(r#"{"pid": 1, "seconds": 99999}"#),
            400,
            "seconds must be",
        ),
        (
            "POST",
            "/traces",
            Some(r#"{"pid": 1, "sample_rate": 0}"#),
            400,
            "sample_rate must be",
        ),
        (
            "POST",
            "/traces",
            Some(r#"{"pid": 4194304}"#),
            400,
            "no process has pid",
        ),
        (
            "POST",
            "/traces",
            Some(r#"{"binary": "/nonexistent"}"#),
            400,
            "no such file",
        ),
        ("POST", "/traces", Some("{}"), 400, "say what to trace"),
        ("GET", "/traces/77", None, 404, "no trace 77"),
        (
            "GET",
            "/debug/pprof/heap?pid=1&seconds=9999",
            None,
            400,
            "1 to 300",
        ),
        ("GET", "/nowhere", None, 404, "the agent serves"),
    ];
    for (method, path, body, want, says) in bad {
        let (status, answer) = agent.call(method, path, body);
        assert_eq!(status, want, "{method} {path}: {answer}");
        assert!(
            answer.to_string().contains(says),
            "{method} {path}: {answer}"
        );
    }
    let big = format!(r#"{{"pid": 1, "binary": "{}"}}"#, "x".repeat(8000));
    assert_eq!(agent.call("POST", "/traces", Some(&big)).0, 413);
    assert_eq!(
        agent.call("GET", "/traces", None).1["traces"],
        Value::Array(vec![])
    );
    assert!(agent.tracers().is_empty(), "nothing was started");
    assert!(!Path::new(&agent.dir).join("1.stderr").exists());
}

#[test]
fn a_trace_past_the_process_budget_is_refused() {
    let agent = Agent::start_with("budget", &["--max-processes", "2"]);
    let cgroup = crate::harness::cgroup::V2Cgroup::new("agent-budget");
    let mut sleepers: Vec<std::process::Child> = (0..3)
        .map(|_| Command::new("sleep").arg("60").spawn().expect("sleep"))
        .collect();
    for s in &sleepers {
        cgroup.add(s.id());
    }
    let body = format!(r#"{{"cgroup": "{}", "seconds": 5}}"#, cgroup.path());
    let (status, answer) = agent.call("POST", "/traces", Some(&body));
    assert_eq!(status, 429, "{answer}");
    assert!(
        answer
            .to_string()
            .contains("would cover 3 processes and the running traces cover 0"),
        "{answer}"
    );
    assert!(agent.tracers().is_empty(), "nothing was started");
    // Two fit.
    let _ = sleepers[2].kill();
    let _ = sleepers[2].wait();
    let id = agent.post(&body);
    agent.wait(id, "ended", |s| s["state"] != "running");
    for s in &mut sleepers {
        let _ = s.kill();
        let _ = s.wait();
    }
}
