//! What the package installs for people: man pages (rendered by groff and
//! man), the documents they and `--help` name, the shell completions
//! (loaded by their shells).

use std::{process::Command, time::Duration};

use super::{checked, package, BIN};
use crate::harness::process::run_timeout;

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
