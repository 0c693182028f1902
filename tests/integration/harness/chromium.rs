//! Headless Chromium (Debian's `chromium`, installed by `cargo xtask
//! setup`) for the tests that check what a browser shows of our output,
//! and a loopback file server to show it from.
//!
//! Chromium runs as root here, so it needs `--no-sandbox`; each run gets a
//! profile directory of its own (parallel runs sharing one would meet
//! Chromium's profile lock) and resolves no host name, so a page can reach
//! nothing outside this machine.

use std::{
    collections::HashMap,
    io::{Read as _, Write as _},
    net::{TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc, Mutex,
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use crate::harness::scratch;

/// Longest a Chromium run may take (it usually takes about a second).
const TIMEOUT: Duration = Duration::from_secs(90);

/// Where tests keep what a person may want to look at after a run:
/// target/test-artefacts/NAME.
pub fn artefact(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("target dir")
        .join("test-artefacts");
    std::fs::create_dir_all(&dir).expect("create target/test-artefacts");
    dir.join(name)
}

/// The DOM of `url` after its scripts ran for `budget` of virtual time
/// (Chromium's virtual time skips idle waits, so this is not wall time).
pub fn dump_dom(url: &str, budget: Duration) -> String {
    run(url, budget, &["--dump-dom"])
}

/// Saves a `width`×`height` screenshot of `url` as PNG to `file`.
pub fn screenshot(url: &str, budget: Duration, file: &Path, width: u32, height: u32) {
    let _ = std::fs::remove_file(file);
    run(
        url,
        budget,
        &[
            &format!("--screenshot={}", file.display()),
            &format!("--window-size={width},{height}"),
        ],
    );
    let png = std::fs::read(file).unwrap_or_default();
    assert!(
        png.starts_with(b"\x89PNG\r\n\x1a\n"),
        "chromium wrote no PNG screenshot to {}",
        file.display()
    );
}

/// Runs headless Chromium on `url` with `extra` arguments; its stdout.
fn run(url: &str, budget: Duration, extra: &[&str]) -> String {
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    let n = RUNS.fetch_add(1, Ordering::Relaxed);
    let dir = scratch(&format!("chromium-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("chromium scratch dir");
    let (stdout, stderr) = (dir.join("stdout"), dir.join("stderr"));
    let mut child = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-extensions",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
        ])
        .arg(format!("--user-data-dir={}", dir.join("profile").display()))
        .arg(format!("--virtual-time-budget={}", budget.as_millis()))
        .args(extra)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout).expect("chromium stdout file"))
        .stderr(std::fs::File::create(&stderr).expect("chromium stderr file"))
        .spawn()
        .expect("run chromium (Debian's chromium: cargo xtask setup)");
    let deadline = Instant::now() + TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for chromium") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "chromium did not finish {url} within {TIMEOUT:?}: {}",
                std::fs::read_to_string(&stderr).unwrap_or_default()
            );
        }
        thread::sleep(Duration::from_millis(50));
    };
    let out = std::fs::read_to_string(&stdout).unwrap_or_default();
    let err = std::fs::read_to_string(&stderr).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        status.success(),
        "chromium failed on {url} ({status}): {err}"
    );
    out
}

/// The text a person reads on the page: the DOM without its tags, scripts
/// and styles, entities decoded, runs of white space as one space.
pub fn page_text(dom: &str) -> String {
    let mut text = String::with_capacity(dom.len() / 2);
    let mut rest = dom;
    while let Some(open) = rest.find('<') {
        text.push_str(&rest[..open]);
        text.push(' ');
        rest = &rest[open..];
        let skip_to = ["script", "style"]
            .iter()
            .find(|t| rest[1..].starts_with(*t))
            .map(|t| format!("</{t}>"));
        let end = match skip_to {
            Some(close) => rest.find(&close).map(|i| i + close.len()),
            None => rest.find('>').map(|i| i + 1),
        };
        rest = &rest[end.unwrap_or(rest.len())..];
    }
    text.push_str(rest);
    let text = text
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&nbsp;", " ")
        .replace("&amp;", "&");
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The rows of the DOM's tables, each as the text of its cells.
pub fn table_rows(dom: &str) -> Vec<Vec<String>> {
    dom.split("<tr")
        .skip(1)
        .map(|row| {
            let row = row.split("</tr>").next().unwrap_or(row);
            row.split("<td")
                .skip(1)
                .map(|cell| page_text(&format!("<td{cell}")))
                .collect()
        })
        .collect()
}

/// A loopback HTTP server of the files of one directory (by file name: no
/// sub-directories, no `..`) and of files given in memory, for as long as
/// it lives. Records the paths it was asked for.
pub struct FileServer {
    addr: String,
    stop: Arc<AtomicBool>,
    asked: Arc<Mutex<Vec<String>>>,
    thread: Option<JoinHandle<()>>,
}

impl FileServer {
    pub fn start(dir: &Path, extra: HashMap<String, Vec<u8>>) -> FileServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let addr = listener.local_addr().expect("local address").to_string();
        let stop = Arc::new(AtomicBool::new(false));
        let asked = Arc::new(Mutex::new(Vec::new()));
        let files = Arc::new((dir.to_path_buf(), extra));
        let (stop2, asked2) = (stop.clone(), asked.clone());
        let thread = thread::spawn(move || {
            for stream in listener.incoming() {
                if stop2.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(stream) = stream else { continue };
                let (files, asked) = (files.clone(), asked2.clone());
                thread::spawn(move || serve_one(stream, &files.0, &files.1, &asked));
            }
        });
        FileServer {
            addr,
            stop,
            asked,
            thread: Some(thread),
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The paths asked for so far.
    pub fn asked(&self) -> Vec<String> {
        self.asked.lock().map(|a| a.clone()).unwrap_or_default()
    }
}

impl Drop for FileServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wakes the accept loop up so it sees the flag.
        let _ = TcpStream::connect(&self.addr);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn serve_one(
    mut stream: TcpStream,
    dir: &Path,
    extra: &HashMap<String, Vec<u8>>,
    asked: &Mutex<Vec<String>>,
) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let head = String::from_utf8_lossy(&head);
    let path = head.split(' ').nth(1).unwrap_or("/");
    let path = path.split(['?', '#']).next().unwrap_or(path).to_string();
    if let Ok(mut a) = asked.lock() {
        a.push(path.clone());
    }
    let name = path.trim_start_matches('/');
    let body = extra.get(name).cloned().or_else(|| {
        let plain = !name.is_empty() && !name.contains('/') && !name.starts_with('.');
        plain.then(|| std::fs::read(dir.join(name)).ok()).flatten()
    });
    let response = match body {
        Some(body) => {
            let mut r = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                content_type(name),
                body.len()
            )
            .into_bytes();
            r.extend(body);
            r
        }
        None => {
            b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_vec()
        }
    };
    let _ = stream.write_all(&response);
}

/// Module scripts need a JavaScript type, or Chromium refuses to run them.
fn content_type(name: &str) -> &'static str {
    match name.rsplit('.').next() {
        Some("html") => "text/html; charset=utf-8",
        Some("js") => "text/javascript",
        Some("css") => "text/css",
        Some("json") => "application/json",
        Some("wasm") => "application/wasm",
        Some("png") => "image/png",
        Some("ico") => "image/x-icon",
        Some("woff2") => "font/woff2",
        _ => "application/octet-stream",
    }
}
