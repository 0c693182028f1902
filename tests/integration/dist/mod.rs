//! The Debian package (`cargo xtask dist`, docs/packaging.md): built once,
//! unpacked with `dpkg -x` into a scratch root, and what it installs run or
//! read by the programs that will use it: the binary on a target under the
//! unit's capabilities, the unit's own command line system-wide with SIGTERM
//! at the end, the man pages by groff and man, the completions by their
//! shells, the unit by `systemd-analyze verify`.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::OnceLock,
    time::Duration,
};

use crate::harness::{
    compile_c,
    http::{get, served_addr},
    pids,
    process::run_timeout,
    read_json, scratch,
    sites::{assert_sites_exact, O2_FLAGS},
    system_wide_lock, toolchain_binary, Target, Tracer,
};

const UNIT: &str = "lib/systemd/system/memtrace-bpf.service";
const DEFAULTS: &str = "etc/default/memtrace-bpf";
const BIN: &str = "usr/bin/memtrace-bpf";
/// The build it needs (the dev binary the tests use, and the assets
/// example) takes minutes on two busy cores when it is not already done
/// (`cargo xtask test` runs `dist --dev` before the tests).
const BUILD_TIMEOUT: Duration = Duration::from_secs(40 * 60);

struct Package {
    deb: PathBuf,
    /// Where `dpkg -x` unpacked it.
    root: PathBuf,
}

/// `cargo xtask dist --dev` (the release package's files, from the dev
/// build), once for all the tests here, unpacked.
fn package() -> &'static Package {
    static PACKAGE: OnceLock<Package> = OnceLock::new();
    PACKAGE.get_or_init(|| {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let out = run_timeout(
            Command::new(toolchain_binary("cargo"))
                .current_dir(&repo)
                .args(["xtask", "dist", "--dev"]),
            BUILD_TIMEOUT,
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "cargo xtask dist failed ({}):\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let deb = PathBuf::from(stdout.lines().last().expect("the .deb's path, last"));
        assert!(deb.is_file(), "no package at {}", deb.display());
        let root = scratch("dist-root");
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).expect("scratch root");
        checked(Command::new("dpkg").arg("-x").arg(&deb).arg(&root));
        Package { deb, root }
    })
}

/// Runs `cmd`, asserts it succeeded, returns its stdout.
fn checked(cmd: &mut Command) -> String {
    let out = run_timeout(cmd, Duration::from_secs(120));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_package_has_its_control_fields_conffile_and_files() {
    let p = package();
    let field = |name: &str| checked(Command::new("dpkg-deb").arg("-f").arg(&p.deb).arg(name));
    assert_eq!(field("Package").trim(), "memtrace-bpf");
    assert_eq!(field("Version").trim(), env!("CARGO_PKG_VERSION"));
    assert_eq!(field("Architecture").trim(), "amd64");
    let depends = field("Depends");
    assert!(depends.starts_with("libc6 (>= 2."), "Depends: {depends}");
    let control = scratch("dist-control");
    let _ = std::fs::remove_dir_all(&control);
    checked(Command::new("dpkg-deb").arg("-e").arg(&p.deb).arg(&control));
    let conffiles = std::fs::read_to_string(control.join("conffiles")).expect("conffiles");
    assert_eq!(conffiles, "/etc/default/memtrace-bpf\n");
    let listing = checked(Command::new("dpkg-deb").arg("-c").arg(&p.deb));
    for path in [
        BIN,
        UNIT,
        DEFAULTS,
        "usr/share/man/man1/memtrace-bpf.1.gz",
        "usr/share/man/man1/memtrace-bpf-report.1.gz",
        "usr/share/man/man1/memtrace-bpf-diff.1.gz",
        "usr/share/bash-completion/completions/memtrace-bpf",
        "usr/share/zsh/vendor-completions/_memtrace-bpf",
        "usr/share/fish/vendor_completions.d/memtrace-bpf.fish",
        "usr/share/doc/memtrace-bpf/copyright",
    ] {
        let line = listing
            .lines()
            .find(|l| l.ends_with(&format!("./{path}")))
            .unwrap_or_else(|| panic!("{path} not in the package:\n{listing}"));
        assert!(line.contains("root/root"), "{line}");
        let mode = if path == BIN {
            "-rwxr-xr-x"
        } else {
            "-rw-r--r--"
        };
        assert!(line.starts_with(mode), "{line}");
    }
}

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

/// The unit's `Key=value` settings, each key's values in order.
fn unit_settings(root: &Path) -> BTreeMap<String, Vec<String>> {
    let text = std::fs::read_to_string(root.join(UNIT)).expect("read the unit");
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

/// The service's environment as systemd builds it: the unit's
/// `Environment=` lines, then the EnvironmentFile (read after them, so its
/// values win). Values are unquoted as systemd does for these files.
fn service_environment(root: &Path) -> BTreeMap<String, String> {
    let unit = unit_settings(root);
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
fn exec_start(root: &Path, env: &BTreeMap<String, String>) -> Vec<String> {
    let unit = unit_settings(root);
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
fn the_units_command_line_serves_the_heap_and_sigterm_writes_the_report() {
    let _one_at_a_time = system_wide_lock();
    let p = package();
    let mut env = service_environment(&p.root);
    assert_eq!(env["MEMTRACE_BPF_SERVE"], "127.0.0.1:6060");
    // As an administrator would edit /etc/default/memtrace-bpf: a free
    // port, and --comm to keep the rest of this shared machine out.
    env.insert("MEMTRACE_BPF_SERVE".into(), "127.0.0.1:0".into());
    let opts = env.get_mut("MEMTRACE_BPF_OPTS").expect("MEMTRACE_BPF_OPTS");
    opts.push_str(" --comm memtrace_svc");
    let state = p.root.join("var/lib/memtrace-bpf");
    std::fs::create_dir_all(&state).expect("the StateDirectory");
    let words: Vec<String> = exec_start(&p.root, &env)
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
fn the_man_pages_render_without_warnings() {
    let p = package();
    let dir = p.root.join("usr/share/man/man1");
    for (page, needles) in [
        (
            "memtrace-bpf",
            &["--serve", "--sample-rate", "report", "diff"][..],
        ),
        ("memtrace-bpf-report", &["--format", "FILE"][..]),
        ("memtrace-bpf-diff", &["OLD", "NEW"][..]),
    ] {
        let path = dir.join(format!("{page}.1.gz"));
        let out = run_timeout(
            Command::new("man")
                .arg("-l")
                .arg(&path)
                .env("MANPAGER", "cat")
                .env("MANWIDTH", "100")
                // Warnings from groff, on stderr.
                .env("MAN_KEEP_STDERR", "1")
                .env("MANROFFOPT", "-ww"),
            Duration::from_secs(60),
        );
        let text = String::from_utf8_lossy(&out.stdout);
        let warnings = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "man -l {page}: {warnings}");
        assert!(warnings.trim().is_empty(), "man -l {page}: {warnings}");
        for section in [
            "NAME",
            "SYNOPSIS",
            "DESCRIPTION",
            "OPTIONS",
            "ENVIRONMENT",
            "EXIT STATUS",
            "FILES",
        ] {
            assert!(text.contains(section), "{page}: no {section}:\n{text}");
        }
        for needle in needles {
            assert!(text.contains(needle), "{page}: no {needle}:\n{text}");
        }
    }
}

/// Every docs/NAME.md that `--help` or a man page names is installed as
/// /usr/share/doc/memtrace-bpf/NAME.md, where the man pages' FILES says.
#[test]
fn the_documents_help_and_the_man_pages_name_are_installed() {
    let p = package();
    let bin = p.root.join(BIN);
    let mut texts = vec![checked(Command::new(&bin).arg("--help"))];
    for page in ["memtrace-bpf", "memtrace-bpf-report", "memtrace-bpf-diff"] {
        let path = p.root.join(format!("usr/share/man/man1/{page}.1.gz"));
        texts.push(checked(
            Command::new("man")
                .arg("-l")
                .arg(&path)
                .env("MANPAGER", "cat")
                .env("MANWIDTH", "1000"),
        ));
    }
    let doc_dir = p.root.join("usr/share/doc/memtrace-bpf");
    let mut named = std::collections::BTreeSet::new();
    for text in &texts {
        for (i, _) in text.match_indices("docs/") {
            let rest = &text[i + "docs/".len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || "-_.".contains(*c))
                .collect();
            let name = name.strip_suffix('.').unwrap_or(&name).strip_suffix(".md");
            // FILES's own placeholder, docs/NAME.md, names no document.
            if let Some(name) = name.filter(|n| *n != "NAME") {
                named.insert(format!("{name}.md"));
            }
        }
    }
    assert!(named.contains("otlp.md"), "{named:?}");
    for name in &named {
        assert!(
            doc_dir.join(name).is_file(),
            "docs/{name} is named but not installed in {}",
            doc_dir.display()
        );
    }
}

#[test]
fn the_completions_load_in_bash_zsh_and_fish() {
    let p = package();
    let share = p.root.join("usr/share");
    let bash = share.join("bash-completion/completions/memtrace-bpf");
    checked(Command::new("bash").arg("-n").arg(&bash));
    // Loaded, it registers a function for memtrace-bpf, which completes
    // `memtrace-bpf --ser` as bash would call it.
    let spec = checked(
        Command::new("bash")
            .arg("-c")
            .arg(r#"source "$1" && complete -p memtrace-bpf"#)
            .arg("bash")
            .arg(&bash),
    );
    let function = spec
        .split_whitespace()
        .skip_while(|w| *w != "-F")
        .nth(1)
        .unwrap_or_else(|| panic!("bash: no -F FUNCTION in {spec}"));
    let replies = checked(
        Command::new("bash")
            .arg("-c")
            .arg(
                r#"source "$1"; COMP_WORDS=(memtrace-bpf --ser); COMP_CWORD=1
                COMP_LINE="memtrace-bpf --ser"; COMP_POINT=${#COMP_LINE}
                "$2" memtrace-bpf --ser memtrace-bpf; printf '%s\n' "${COMPREPLY[@]}""#,
            )
            .arg("bash")
            .arg(&bash)
            .arg(function),
    );
    assert_eq!(replies.trim(), "--serve", "bash");
    // A subcommand's own options and values: clap_complete 4.6 spells the
    // case labels of a hyphenated program's subcommands apart from the
    // state its loop computes (clap-rs/clap#6421), so nothing completed
    // past `report` or `diff` until dist_assets.rs mended them.
    let replies = checked(
        Command::new("bash")
            .arg("-c")
            .arg(
                r#"source "$1"
                COMP_WORDS=(memtrace-bpf report heap.json --group-by ""); COMP_CWORD=4
                "$2" memtrace-bpf "" --group-by; printf '%s\n' "${COMPREPLY[@]}"
                COMP_WORDS=(memtrace-bpf diff a.json b.json --vi); COMP_CWORD=4
                "$2" memtrace-bpf --vi b.json; printf '%s\n' "${COMPREPLY[@]}""#,
            )
            .arg("bash")
            .arg(&bash)
            .arg(function),
    );
    assert_eq!(
        replies.split_whitespace().collect::<Vec<_>>(),
        ["process", "cgroup", "container", "--view"],
        "bash, after a subcommand"
    );

    let zsh_dir = share.join("zsh/vendor-completions");
    checked(
        Command::new("zsh")
            .arg("-n")
            .arg(zsh_dir.join("_memtrace-bpf")),
    );
    // compinit reads #compdef lines from $fpath: the function is registered.
    let registered = checked(
        Command::new("zsh")
            .args(["-f", "-c"])
            .arg(r#"fpath=("$1" $fpath); autoload -Uz compinit; compinit -u -D; print -r -- $_comps[memtrace-bpf]"#)
            .arg("zsh")
            .arg(&zsh_dir),
    );
    assert_eq!(registered.trim(), "_memtrace-bpf");

    let fish = share.join("fish/vendor_completions.d/memtrace-bpf.fish");
    checked(Command::new("fish").arg("--no-execute").arg(&fish));
    let listed = checked(
        Command::new("fish")
            .args(["--no-config", "-c"])
            .arg("source $argv[1]; complete -C 'memtrace-bpf --ser'")
            .arg(&fish),
    );
    assert!(listed.contains("--serve"), "fish: {listed}");
}

#[test]
fn the_unit_passes_systemd_analyze_verify() {
    let p = package();
    // verify checks that ExecStart's program exists and that `man` finds
    // the Documentation= page. `--root` would look for every unit the
    // service depends on (sysinit.target, ...) in the scratch root, so the
    // unit is verified as it is but for ExecStart's program, pointed at
    // the unpacked binary, with man reading the unpacked pages.
    let unit = std::fs::read_to_string(p.root.join(UNIT)).expect("read the unit");
    let installed = format!("ExecStart={}", p.root.join(BIN).display());
    assert_eq!(unit.matches("ExecStart=/usr/bin/memtrace-bpf ").count(), 1);
    let dir = scratch("dist-verify");
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let copy = dir.join("memtrace-bpf.service");
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

#[test]
fn dpkg_installs_it_keeps_the_conffile_on_remove_and_drops_it_on_purge() {
    let p = package();
    // An empty dpkg database in a scratch root: dpkg --root installs there
    // (the root has no libc6 package, hence --force-depends; the host's
    // versions are checked against Depends below).
    let root = scratch("dist-dpkg-root");
    let _ = std::fs::remove_dir_all(&root);
    let db = root.join("var/lib/dpkg");
    for dir in ["info", "updates", "triggers"] {
        std::fs::create_dir_all(db.join(dir)).expect("dpkg database dirs");
    }
    std::fs::write(db.join("status"), "").expect("status");
    let dpkg = |args: &[&str]| {
        checked(
            Command::new("dpkg")
                .arg(format!("--root={}", root.display()))
                .args(["--force-depends", "--force-script-chrootless"])
                .args(args),
        )
    };
    dpkg(&["-i", p.deb.to_str().expect("utf-8 path")]);
    let status = checked(
        Command::new("dpkg")
            .arg(format!("--root={}", root.display()))
            .args(["-s", "memtrace-bpf"]),
    );
    assert!(status.contains("Status: install ok installed"), "{status}");
    assert!(
        status.contains("Conffiles:\n /etc/default/memtrace-bpf "),
        "{status}"
    );
    assert!(root.join(BIN).is_file());
    dpkg(&["-r", "memtrace-bpf"]);
    assert!(!root.join(BIN).exists(), "remove removes the binary");
    assert!(root.join(DEFAULTS).is_file(), "remove keeps the conffile");
    dpkg(&["--purge", "memtrace-bpf"]);
    assert!(!root.join(DEFAULTS).exists(), "purge removes the conffile");

    // This machine (where the binary ran) meets every Depends.
    let depends = checked(
        Command::new("dpkg-deb")
            .arg("-f")
            .arg(&p.deb)
            .arg("Depends"),
    );
    for dep in depends.trim().split(", ") {
        let (name, rest) = dep.split_once(" (>= ").expect("NAME (>= VERSION)");
        let wanted = rest.strip_suffix(')').expect("closing parenthesis");
        let installed = checked(Command::new("dpkg-query").args(["-W", "-f=${Version}", name]));
        checked(Command::new("dpkg").args(["--compare-versions", &installed, "ge", wanted]));
    }
}
