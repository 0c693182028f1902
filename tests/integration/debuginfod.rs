//! A stripped program with no debug file on the machine: the report says
//! which object has no symbols, by build id, and how to get its debug
//! file; with DEBUGINFOD_URLS naming elfutils' own server (`debuginfod
//! -F DIR`, serving the program's debug file), its frames get their names.

use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use serde_json::Value;

use crate::harness::{compile_c, read_json, scratch, sites::per_site, Tracer};

fn run(cmd: &str, args: &[&str]) {
    let status = Command::new(cmd)
        .args(args)
        .status()
        .unwrap_or_else(|e| panic!("run {cmd} (binutils: cargo xtask setup): {e}"));
    assert!(status.success(), "{cmd} {args:?} failed");
}

/// DIR/prog: splitdebug.c built -O2 -g, stripped (--strip-all, no debug
/// link), and DIR/debug/prog.debug its debug file (objcopy
/// --only-keep-debug), which no lookup on this machine finds. Returns
/// (DIR, the program, its build id).
fn stripped_program(tag: &str) -> (PathBuf, PathBuf, String) {
    let full = compile_c("splitdebug", tag, &["-O2", "-g", "-fomit-frame-pointer"]);
    let dir = scratch(&format!("debuginfod-{tag}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("debug")).expect("mkdir DIR/debug");
    let s = |p: &Path| p.to_str().expect("UTF-8 scratch path").to_string();
    let prog = dir.join("prog");
    run(
        "objcopy",
        &[
            "--only-keep-debug",
            &s(&full),
            &s(&dir.join("debug/prog.debug")),
        ],
    );
    run("strip", &["--strip-all", "-o", &s(&prog), &s(&full)]);
    let data = std::fs::read(&prog).expect("read the program");
    use object::Object as _;
    let id = object::File::parse(&*data)
        .expect("ELF")
        .build_id()
        .expect("notes")
        .expect("a build id");
    let id: String = id.iter().map(|b| format!("{b:02x}")).collect();
    (dir, prog, id)
}

/// Traces `prog` to its exit, DEBUGINFOD_URLS unset or set to `urls`
/// (with a cache of the test's own), and returns the JSON report.
fn trace(tag: &str, prog: &Path, urls: Option<&str>) -> Value {
    let json = scratch(&format!("{tag}.json"));
    let mut command = Command::new(env!("CARGO_BIN_EXE_memtrace-bpf"));
    command
        .args([
            "--ringbuf-mb",
            "256",
            "--sample-rate",
            "1",
            "--format",
            "json",
            "-o",
        ])
        .arg(&json)
        .arg("--")
        .arg(prog)
        .env_remove("DEBUGINFOD_URLS");
    if let Some(urls) = urls {
        let cache = scratch(&format!("{tag}-cache"));
        let _ = std::fs::remove_dir_all(&cache);
        command
            .env("DEBUGINFOD_URLS", urls)
            .env("DEBUGINFOD_CACHE_PATH", &cache);
    }
    let out = Tracer::spawn_command(command, Stdio::null()).finish();
    assert!(out.status.success(), "tracer failed: {}", out.stderr);
    read_json(&json)
}

/// The leaf function names of the stack that allocated `bytes` in all.
fn stack_of(report: &Value, alloc_bytes: u64) -> Vec<String> {
    let stack = report["stacks"]
        .as_array()
        .expect("stacks")
        .iter()
        .find(|s| s["alloc_bytes"] == alloc_bytes)
        .unwrap_or_else(|| panic!("no stack of {alloc_bytes} bytes: {report}"));
    stack["frames"]
        .as_array()
        .expect("frames")
        .iter()
        .map(|f| f["function"].as_str().unwrap_or("").to_string())
        .collect()
}

fn notes(report: &Value) -> Vec<String> {
    report["notes"]
        .as_array()
        .expect("notes")
        .iter()
        .map(|n| n.as_str().expect("a note's words").to_string())
        .collect()
}

#[test]
fn a_stripped_program_is_named_in_a_note_with_its_build_id_and_how_to_get_symbols() {
    let (_dir, prog, id) = stripped_program("no-symbols");
    let report = trace("no-symbols", &prog, None);
    assert_eq!(stack_of(&report, 4321)[0], "[unknown]");
    let notes = notes(&report);
    let note = notes
        .iter()
        .find(|n| n.contains("no symbols"))
        .unwrap_or_else(|| panic!("no note on symbols: {notes:#?}"));
    let named = format!("{} (build id {id})", prog.display());
    assert!(note.contains(&named), "{named} in {note}");
    assert!(
        note.contains("-dbgsym") && note.contains("DEBUGINFOD_URLS"),
        "how to get them: {note}"
    );
}

/// elfutils' server on a port of its own, serving the ELF files under a
/// directory; killed on drop.
struct Server {
    child: Child,
    port: u16,
}

impl Server {
    fn serve(dir: &Path, tag: &str) -> Server {
        let port = free_port_below_ephemeral();
        let db = scratch(&format!("{tag}.sqlite"));
        let _ = std::fs::remove_file(&db);
        let child = Command::new("debuginfod")
            .args(["-p", &port.to_string(), "-d"])
            .arg(&db)
            .arg("-F")
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start debuginfod (elfutils: cargo xtask setup installs it)");
        Server { child, port }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// HTTP status of GET `path`, None if nothing answers yet.
    fn status(&self, path: &str) -> Option<u16> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(60))).ok()?;
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .ok()?;
        let mut head = [0u8; 12];
        s.read_exact(&mut head).ok()?;
        std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
    }

    /// Waits until the server's scan of its directory has found `id`.
    fn wait_for(&self, id: &str) {
        let path = format!("/buildid/{id}/debuginfo");
        for _ in 0..1200 {
            if self.status(&path) == Some(200) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("debuginfod did not serve {path} within 2 minutes");
    }
}

/// A free port below the kernel's ephemeral range (32768 and up by
/// default), so that no `bind(0)` elsewhere can take it between this check
/// and the server's own bind: only a program asking for that very port
/// could.
fn free_port_below_ephemeral() -> u16 {
    let start = 20_000 + (std::process::id() % 5_000) as u16;
    (start..30_000)
        .chain(20_000..start)
        .find(|&p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok())
        .expect("a free port between 20000 and 30000")
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn with_debuginfod_urls_a_stripped_program_is_named_by_the_debug_file_fetched() {
    let (dir, prog, id) = stripped_program("fetched");
    let server = Server::serve(&dir.join("debug"), "fetched");
    server.wait_for(&id);
    let report = trace("fetched", &prog, Some(&server.url()));
    let sites = per_site(&report);
    assert_eq!(
        sites.get("static_site_kept"),
        Some(&[4321, 1, 4321, 1]),
        "{sites:?}"
    );
    let kept = stack_of(&report, 4321);
    assert_eq!(
        kept[..3],
        ["static_site_kept", "static_caller", "main"],
        "{kept:?}"
    );
    let notes = notes(&report);
    let fetches = notes
        .iter()
        .find(|n| n.starts_with("debuginfod"))
        .unwrap_or_else(|| panic!("no note on debuginfod: {notes:#?}"));
    assert!(fetches.contains(" 1 fetched"), "{fetches}");
    let named = prog.display().to_string();
    assert!(
        !notes.iter().any(|n| n.contains(&named)),
        "the program has symbols now: {notes:#?}"
    );
    let cached = scratch("fetched-cache").join(&id).join("debuginfo");
    assert!(cached.is_file(), "kept in the cache: {}", cached.display());
}
