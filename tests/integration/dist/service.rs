//! The installed binary and the unit: run under the unit's capabilities,
//! the unit's own command line as systemd expands it, `systemd-analyze
//! verify`.

use std::{
    collections::BTreeMap,
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use super::{checked, package, BIN, CONTINUOUS, DEFAULTS, TRIGGERS, UNIT};
use crate::harness::{
    compile_c,
    http::{get, served_addr},
    pids,
    process::run_timeout,
    read_json, scratch,
    sites::{assert_sites_exact, O2_FLAGS},
    system_wide_lock, Target, Tracer,
};

#[test]
fn the_installed_binary_traces_a_command_exactly_under_the_units_capabilities() {
    let p = package();
    let bin = p.root.join(BIN);
    let help = checked(Command::new(&bin).arg("--help"));
    assert!(help.contains("--serve <HOST:PORT>"), "{help}");
    let version = checked(Command::new(&bin).arg("--version"));
    assert_eq!(
        version.trim(),
        concat!("memtrace-bpf ", env!("CARGO_PKG_VERSION"))
    );

    let sites = compile_c("sites", "O2-dist", O2_FLAGS);
    // sites runs its allocations on its first line of stdin ("go"), then
    // with "exit" exits: the trace ends with it.
    let go = scratch("dist-go");
    std::fs::write(&go, "go\n").expect("write the go line");
    let report = scratch("dist-sites.json");
    let mut cmd = under_unit_capabilities(&p.root);
    cmd.arg(&bin)
        .args(["--sample-rate", "1", "--ringbuf-mb", "256"])
        .args(["--format", "json", "-o"])
        .arg(&report)
        .arg("--")
        .arg(&sites)
        .arg("exit");
    let stdin = std::fs::File::open(&go).expect("open the go line");
    let out = Tracer::spawn_command(cmd, Stdio::from(stdin)).finish();
    assert!(out.status.success(), "{}", out.stderr);
    let report = read_json(&report);
    assert_eq!(report["end_reason"], "target exited", "{}", out.stderr);
    assert_sites_exact(&report);
}

/// setpriv with the unit's CapabilityBoundingSet and NoNewPrivileges, as
/// systemd starts the service (root: the bounding set is what it keeps).
fn under_unit_capabilities(root: &Path) -> Command {
    let unit = unit_settings(root);
    let caps: Vec<String> = unit["CapabilityBoundingSet"][0]
        .split_whitespace()
        .map(|c| {
            let name = c.strip_prefix("CAP_").expect("CAP_ names");
            format!("+{}", name.to_lowercase())
        })
        .collect();
    assert!(!caps.is_empty(), "the unit names its capabilities");
    assert_eq!(unit["NoNewPrivileges"], ["yes"]);
    let mut cmd = Command::new("setpriv");
    cmd.arg(format!("--bounding-set=-all,{}", caps.join(",")))
        .args(["--inh-caps=-all", "--no-new-privs", "--"]);
    cmd
}

/// The agent unit's `Key=value` settings, each key's values in order.
fn unit_settings(root: &Path) -> BTreeMap<String, Vec<String>> {
    settings_of(root, UNIT)
}

/// A unit's `Key=value` settings, each key's values in order.
fn settings_of(root: &Path, unit: &str) -> BTreeMap<String, Vec<String>> {
    let text = std::fs::read_to_string(root.join(unit)).expect("read the unit");
    let mut settings: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with(['#', '[']) {
            continue;
        }
        let (key, value) = line.split_once('=').expect("Key=value");
        settings
            .entry(key.to_owned())
            .or_default()
            .push(value.to_owned());
    }
    settings
}

/// A service's environment as systemd builds it: the unit's
/// `Environment=` lines, then the EnvironmentFile (read after them, so its
/// values win). Values are unquoted as systemd does for these files.
fn service_environment(root: &Path, unit: &str) -> BTreeMap<String, String> {
    let unit = settings_of(root, unit);
    let mut env = BTreeMap::new();
    let mut assign = |line: &str| {
        let (key, value) = line.split_once('=').expect("KEY=value");
        let value = value
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .unwrap_or(value);
        env.insert(key.trim().to_owned(), value.to_owned());
    };
    unit["Environment"].iter().for_each(|l| assign(l));
    assert_eq!(unit["EnvironmentFile"], [format!("-/{DEFAULTS}")]);
    let file = std::fs::read_to_string(root.join(DEFAULTS)).expect("read /etc/default");
    file.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .for_each(assign);
    env
}

/// ExecStart's words with `${VAR}` as one word and `$VAR` split at
/// whitespace (systemd.service, "Command lines").
fn exec_start(root: &Path, unit: &str, env: &BTreeMap<String, String>) -> Vec<String> {
    let unit = settings_of(root, unit);
    let [line] = unit["ExecStart"].as_slice() else {
        panic!("one ExecStart: {:?}", unit["ExecStart"]);
    };
    let var = |name: &str| {
        env.get(name)
            .unwrap_or_else(|| panic!("${name} has no value (the unit sets defaults)"))
            .clone()
    };
    let mut words = Vec::new();
    for word in line.split_whitespace() {
        if let Some(name) = word.strip_prefix("${").and_then(|w| w.strip_suffix('}')) {
            words.push(var(name));
        } else if let Some(name) = word.strip_prefix('$') {
            words.extend(var(name).split_whitespace().map(str::to_owned));
        } else {
            assert!(!word.contains('$'), "a variable inside a word: {word}");
            words.push(word.to_owned());
        }
    }
    words
}

#[test]
fn the_continuous_units_command_line_serves_the_heap_and_sigterm_writes_the_report() {
    let _one_at_a_time = system_wide_lock();
    let p = package();
    let mut env = service_environment(&p.root, CONTINUOUS);
    assert_eq!(env["MEMTRACE_BPF_SERVE"], "127.0.0.1:6060");
    // As an administrator would edit /etc/default/memtrace-bpf: a free
    // port, and --comm to keep the rest of this shared machine out.
    env.insert("MEMTRACE_BPF_SERVE".into(), "127.0.0.1:0".into());
    let opts = env.get_mut("MEMTRACE_BPF_OPTS").expect("MEMTRACE_BPF_OPTS");
    opts.push_str(" --comm memtrace_svc");
    let state = p.root.join("var/lib/memtrace-bpf");
    std::fs::create_dir_all(&state).expect("the StateDirectory");
    let words: Vec<String> = exec_start(&p.root, CONTINUOUS, &env)
        .into_iter()
        .map(|w| {
            // The unpacked root stands for /.
            if w == "/usr/bin/memtrace-bpf" || w.starts_with("/var/lib/memtrace-bpf/") {
                p.root.join(&w[1..]).to_string_lossy().into_owned()
            } else {
                w
            }
        })
        .collect();
    let report = state.join("heap.json");
    assert!(
        words.iter().any(|w| Path::new(w) == report),
        "the default flags write the report to /var/lib/memtrace-bpf/heap.json: {words:?}"
    );
    let _ = std::fs::remove_file(&report);

    let dir = scratch("dist-svc");
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let program = dir.join("memtrace_svc");
    std::fs::copy(compile_c("sites", "O2-dist", O2_FLAGS), &program).expect("copy sites");
    let mut target = Target::start(&program, &[]);
    let mut cmd = under_unit_capabilities(&p.root);
    cmd.args(&words);
    let mut tracer = Tracer::spawn_command(cmd, Stdio::null());
    // The attach line comes first, then the address (as in serve.rs).
    tracer
        .stderr
        .wait_for("memtrace-bpf: tracing ", "tracer attach");
    let addr = served_addr(&mut tracer);
    target.run_sites();
    let (status, body) = get(&addr, "/debug/pprof/heap");
    assert_eq!(status, 200);
    assert!(body.starts_with(&[0x1f, 0x8b]), "gzip-compressed pprof");
    tracer.signal(libc::SIGTERM);
    let out = tracer.finish();
    assert!(
        out.status.success(),
        "SIGTERM ends it with 0: {}",
        out.stderr
    );
    let report = read_json(&report);
    assert_eq!(report["end_reason"], "terminated (SIGTERM)");
    assert_eq!(report["target"], "system-wide");
    assert_eq!(report["sample_rate"], 65536);
    assert_eq!(
        pids(&report),
        [u64::from(target.pid())],
        "{}",
        report["processes"]
    );
}

#[test]
fn the_agent_units_command_line_traces_on_request_and_sigterm_stops_it() {
    let p = package();
    let mut env = service_environment(&p.root, UNIT);
    assert_eq!(env["MEMTRACE_BPF_SERVE"], "127.0.0.1:6060");
    let opts = env["MEMTRACE_BPF_AGENT_OPTS"].clone();
    assert_eq!(opts, "--triggers /etc/memtrace-bpf/triggers");
    // As an administrator would edit /etc/default/memtrace-bpf: a free
    // port; and the socket and directories of the unpacked root, not the
    // RuntimeDirectory and StateDirectory systemd would make.
    let run = scratch("dist-agent");
    let _ = std::fs::remove_dir_all(&run);
    env.insert("MEMTRACE_BPF_SERVE".into(), "127.0.0.1:0".into());
    let socket = run.join("run/agent.sock");
    env.insert(
        "MEMTRACE_BPF_AGENT_OPTS".into(),
        format!(
            "{} --socket {} --dir {} --reports {}",
            opts.replace(
                "/etc/memtrace-bpf/triggers",
                &p.root.join(TRIGGERS).to_string_lossy()
            ),
            socket.display(),
            run.join("traces").display(),
            run.join("reports").display()
        ),
    );
    let words: Vec<String> = exec_start(&p.root, UNIT, &env)
        .into_iter()
        .map(|w| match w == "/usr/bin/memtrace-bpf" {
            true => p.root.join(BIN).to_string_lossy().into_owned(),
            false => w,
        })
        .collect();
    assert_eq!(words[1], "agent", "{words:?}");
    let mut target = Target::start(&compile_c("sites", "O2-dist", O2_FLAGS), &[]);
    let mut cmd = under_unit_capabilities(&p.root);
    cmd.args(&words);
    let mut agent = Tracer::spawn_command(cmd, Stdio::null());
    agent.stderr.wait_for("agent ready:", "agent start");
    let to = memtrace_bpf::agent::client::Address::Unix(socket);
    let ask = |method: &str, path: &str, body: Option<String>| {
        let (status, raw) = memtrace_bpf::agent::client::request(
            &to,
            method,
            path,
            body.as_deref().map(str::as_bytes),
        )
        .expect("the agent answers");
        (status, String::from_utf8_lossy(&raw).into_owned())
    };
    let body = format!(
        r#"{{"pid": {}, "seconds": 120, "sample_rate": 1}}"#,
        target.pid()
    );
    let (status, started) = ask("POST", "/traces", Some(body));
    assert_eq!(status, 201, "{started}");
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let mut state = String::new();
    while !state.contains(r#""attached": true"#) {
        assert!(
            std::time::Instant::now() < deadline,
            "never attached: {state}"
        );
        std::thread::sleep(Duration::from_millis(100));
        state = ask("GET", "/traces/1", None).1;
    }
    target.run_sites();
    assert_eq!(ask("DELETE", "/traces/1", None).0, 202);
    while !state.contains(r#""state": "done""#) {
        assert!(std::time::Instant::now() < deadline, "never done: {state}");
        std::thread::sleep(Duration::from_millis(100));
        state = ask("GET", "/traces/1", None).1;
    }
    let (status, profile) = ask("GET", "/traces/1?format=json", None);
    assert_eq!(status, 200, "{profile}");
    assert_sites_exact(&crate::harness::parse_report(&profile));
    agent.signal(libc::SIGTERM);
    let out = agent.finish();
    assert!(
        out.status.success(),
        "SIGTERM ends it with 0: {}",
        out.stderr
    );
}

#[test]
fn the_units_pass_systemd_analyze_verify() {
    for unit in [UNIT, CONTINUOUS] {
        verify(unit);
    }
}

fn verify(unit_path: &str) {
    let p = package();
    // verify checks that ExecStart's program exists and that `man` finds
    // the Documentation= page. `--root` would look for every unit the
    // service depends on (sysinit.target, ...) in the scratch root, so the
    // unit is verified as it is but for ExecStart's program, pointed at
    // the unpacked binary, with man reading the unpacked pages.
    let unit = std::fs::read_to_string(p.root.join(unit_path)).expect("read the unit");
    let installed = format!("ExecStart={}", p.root.join(BIN).display());
    assert_eq!(unit.matches("ExecStart=/usr/bin/memtrace-bpf ").count(), 1);
    let dir = scratch("dist-verify");
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let name = Path::new(unit_path).file_name().expect("a file name");
    let copy = dir.join(name);
    std::fs::write(
        &copy,
        unit.replace("ExecStart=/usr/bin/memtrace-bpf", &installed),
    )
    .expect("write the unit's copy");
    let out = run_timeout(
        Command::new("systemd-analyze")
            .arg("verify")
            .arg(&copy)
            .env("MANPATH", p.root.join("usr/share/man")),
        Duration::from_secs(60),
    );
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "systemd-analyze verify: {text}");
    // Unknown keys and bad values are remarks with exit status 0.
    assert!(text.trim().is_empty(), "systemd-analyze verify: {text}");
}
