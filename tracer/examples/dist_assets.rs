//! Writes the man pages and shell completions of `memtrace-bpf` into DIR,
//! generated from the clap definition itself (`command_line::command`), so
//! they cannot drift from `--help`. Run by `cargo xtask dist`:
//!
//!     cargo run --release -p memtrace-bpf --example dist_assets -- DIR
//!
//! DIR gets `memtrace-bpf.1`, `memtrace-bpf-report.1`, `memtrace-bpf-diff.1`
//! and `completions/{memtrace-bpf.bash,_memtrace-bpf,memtrace-bpf.fish}`.
//! An example rather than a hidden subcommand: clap_mangen and
//! clap_complete are dev-dependencies and stay out of the shipped binary.

use std::{
    fs,
    path::{Path, PathBuf},
    process::ExitCode,
};

use clap_complete::Shell;

const BIN: &str = "memtrace-bpf";

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let (Some(dir), None) = (args.next(), args.next()) else {
        println!("usage: dist_assets DIR (writes man pages and completions into DIR)");
        return ExitCode::from(2);
    };
    match write_all(Path::new(&dir)) {
        Ok(written) => {
            for path in written {
                println!("{}", path.display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!("dist_assets: {e}");
            ExitCode::FAILURE
        }
    }
}

fn write_all(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let command = memtrace_bpf::command_line::command();
    fs::create_dir_all(dir)?;
    // One page per command, named by its display name (memtrace-bpf-report).
    clap_mangen::generate_to(command.clone(), dir)?;
    let mut written: Vec<PathBuf> = std::iter::once(BIN.to_owned())
        .chain(
            command
                .get_subcommands()
                .map(|s| format!("{BIN}-{}", s.get_name())),
        )
        .map(|name| dir.join(format!("{name}.1")))
        .collect();
    if let Some(missing) = written.iter().find(|p| !p.is_file()) {
        return Err(std::io::Error::other(format!(
            "clap_mangen wrote no {}",
            missing.display()
        )));
    }
    for page in &written {
        let is_trace = page.file_name() == Some(std::ffi::OsStr::new("memtrace-bpf.1"));
        append_sections(page, is_trace)?;
    }
    let completions = dir.join("completions");
    fs::create_dir_all(&completions)?;
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        let path = clap_complete::generate_to(shell, &mut command.clone(), BIN, &completions)?;
        if shell == Shell::Bash {
            mend_bash_subcommands(&path)?;
        }
        written.push(path);
    }
    Ok(written)
}

/// What clap_mangen does not write: ENVIRONMENT, EXIT STATUS, and FILES
/// (where the documents `--help` names as docs/NAME.md are installed), in
/// roff, after its sections. `trace`: the tracing command's page, else
/// `report`'s or `diff`'s.
fn append_sections(page: &Path, trace: bool) -> std::io::Result<()> {
    let mut text = fs::read_to_string(page)?;
    text.push_str(if trace {
        TRACE_ENVIRONMENT
    } else {
        ".SH ENVIRONMENT\nNone is read.\n"
    });
    text.push_str(if trace {
        TRACE_EXIT_STATUS
    } else {
        SAVED_EXIT_STATUS
    });
    text.push_str(FILES);
    fs::write(page, text)
}

const TRACE_ENVIRONMENT: &str = r".SH ENVIRONMENT
.TP
\fBOTEL_EXPORTER_OTLP_PROFILES_ENDPOINT\fR, \fBOTEL_EXPORTER_OTLP_ENDPOINT\fR
Where \fB\-\-otlp\fR without a URL sends profiles (the signal's own URL, else a base URL).
.TP
\fBOTEL_EXPORTER_OTLP_PROFILES_HEADERS\fR, \fBOTEL_EXPORTER_OTLP_HEADERS\fR
Headers of every \fB\-\-otlp\fR request, as key=value,key2=value2 with percent\-encoded values.
.TP
\fBOTEL_EXPORTER_OTLP_PROFILES_PROTOCOL\fR, \fBOTEL_EXPORTER_OTLP_PROTOCOL\fR
When set, must be http/protobuf.
.TP
\fBOTEL_SERVICE_NAME\fR, \fBOTEL_RESOURCE_ATTRIBUTES\fR
The service name and attributes added to every process's OTLP resource.
.TP
\fBPATH\fR
Where the program of \fB\-\-\fR \fICMD\fR is looked up, as a shell does.
.TP
\fBTERM\fR
\fBdumb\fR: no progress line on a terminal.
";

const TRACE_EXIT_STATUS: &str = r#".SH "EXIT STATUS"
.TP
\fB0\fR
The trace ended (duration, target exit, SIGINT, SIGTERM) and its report was written.
.TP
\fB1\fR
An error, said on stderr with what to do: no privileges, nothing to trace, a probe that could not be attached, a report that could not be written.
.TP
\fB2\fR
A bad command line.
.TP
\fB128\fR+\fIN\fR
Signal \fIN\fR came while the probes were being loaded: nothing was traced.
.PP
With \fB\-\-exit\-status\fR and a command, the command's own status instead (128+\fIN\fR if signal \fIN\fR killed it).
"#;

const SAVED_EXIT_STATUS: &str = r#".SH "EXIT STATUS"
.TP
\fB0\fR
The report was written.
.TP
\fB1\fR
A file could not be read (what it is and why is said on stderr), or the report could not be written.
.TP
\fB2\fR
A bad command line.
"#;

const FILES: &str = r".SH FILES
.TP
\fI/usr/share/doc/memtrace\-bpf/\fR
The documents that \fB\-\-help\fR names as docs/\fINAME\fR.md, installed as \fINAME\fR.md by the Debian package.
";

/// clap_complete 4.6's bash script reaches `memtrace__bpf__subcmd__report`
/// for `memtrace-bpf report ...` but labels that case
/// `memtrace__subcmd__bpf__subcmd__report` (the program's hyphen escaped as
/// a subcommand separator: clap-rs/clap#6421), so nothing completed after
/// `report` or `diff`. The labels are spelled as the loop spells them.
fn mend_bash_subcommands(path: &Path) -> std::io::Result<()> {
    let script = fs::read_to_string(path)?;
    let wrong = format!("        {}__subcmd__", BIN.replace('-', "__subcmd__"));
    let right = format!("        {}__subcmd__", BIN.replace('-', "__"));
    let mended = script.replace(&wrong, &right);
    if mended.contains(&format!("{}__subcmd__", BIN.replace('-', "__subcmd__"))) {
        return Err(std::io::Error::other(format!(
            "{}: a subcommand label still spelled as clap-rs/clap#6421 spells it",
            path.display()
        )));
    }
    fs::write(path, mended)
}
