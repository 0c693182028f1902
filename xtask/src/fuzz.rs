//! `cargo xtask fuzz`: run each fuzz target in fuzz/ (cargo-fuzz, nightly)
//! for a bounded time. An input that crashes a target is copied into
//! tracer/fuzz-regressions/TARGET/, where a unit test replays it from then on.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};

use crate::cmd::{cargo, output, repo_root, run as run_cmd};

/// The targets in fuzz/Cargo.toml, with the longest input worth trying:
/// ELF files need room for headers, sections and symbol tables.
const TARGETS: &[(&str, usize)] = &[
    ("elf", 1 << 16),
    ("maps", 1 << 12),
    ("ld_so_conf", 1 << 12),
    ("placement", 1 << 10),
    ("saved", 1 << 14),
];

pub fn run(seconds: u64, only: Option<&str>) -> Result<()> {
    if let Some(name) = only {
        if !TARGETS.iter().any(|(t, _)| *t == name) {
            let names: Vec<&str> = TARGETS.iter().map(|(t, _)| *t).collect();
            bail!(
                "no fuzz target {name}: the targets are {}",
                names.join(", ")
            );
        }
    }
    cargo_fuzz()?;
    let root = repo_root();
    let fuzz_dir = root.join("fuzz");
    let mut crashed = Vec::new();
    for &(name, max_len) in TARGETS.iter().filter(|(t, _)| only.is_none_or(|o| o == *t)) {
        let corpus = fuzz_dir.join("corpus").join(name);
        seed(&root, name, &corpus)?;
        println!("fuzz: {name} for {seconds} s");
        // The rustup proxy, not $CARGO (stable): cargo-fuzz needs nightly
        // for the sanitizer flags.
        let status = Command::new("cargo")
            .env("RUSTUP_TOOLCHAIN", "nightly")
            .env_remove("RUSTC")
            .current_dir(&fuzz_dir)
            .args(["fuzz", "run", name])
            .arg(&corpus)
            .arg("--")
            .arg(format!("-max_total_time={seconds}"))
            .arg(format!("-max_len={max_len}"))
            .arg("-rss_limit_mb=2048")
            .status()
            .context("running cargo fuzz")?;
        if !status.success() {
            let kept = keep_artifacts(&fuzz_dir, &root, name)?;
            if kept.is_empty() {
                bail!("cargo fuzz run {name} failed without a crash input (see its output above)");
            }
            crashed.push(format!("{name} ({} inputs kept)", kept.len()));
            for k in kept {
                println!("fuzz: kept {}", k.display());
            }
        }
    }
    if !crashed.is_empty() {
        bail!(
            "fuzz targets failed: {}; the inputs are in tracer/fuzz-regressions/ \
             (`cargo test -p memtrace-bpf fuzzing` replays them)",
            crashed.join(", ")
        );
    }
    println!("fuzz: no target crashed");
    Ok(())
}

/// cargo-fuzz, installed from crates.io when missing (about two minutes).
fn cargo_fuzz() -> Result<()> {
    if output(cargo().args(["fuzz", "--version"])).is_some() {
        return Ok(());
    }
    println!("installing: cargo-fuzz");
    run_cmd(cargo().args(["install", "cargo-fuzz", "--locked"]))
}

/// The corpus starts from the regression inputs and, for ELF, from small
/// objects built here (a few KiB, so mutations reach every table).
fn seed(root: &Path, name: &str, corpus: &Path) -> Result<()> {
    std::fs::create_dir_all(corpus)?;
    let kept = root.join("tracer/fuzz-regressions").join(name);
    if let Ok(entries) = std::fs::read_dir(&kept) {
        for e in entries.flatten() {
            std::fs::copy(e.path(), corpus.join(e.file_name()))?;
        }
    }
    if name == "elf" {
        let src = corpus.join("seed.c");
        std::fs::write(
            &src,
            "void *malloc(unsigned long n) { return (void *)n; }\n\
             void free(void *p) { (void)p; }\n\
             void *calloc(unsigned long n, unsigned long m) { return malloc(n * m); }\n",
        )?;
        for (out, flags) in [
            ("seed-shared.so", &["-shared", "-fPIC"][..]),
            ("seed-static", &["-static", "-nostdlib", "-e", "malloc"][..]),
        ] {
            run_cmd(
                Command::new("cc")
                    .args(["-Os", "-g0", "-Wl,--build-id=none", "-o"])
                    .arg(corpus.join(out))
                    .args(flags)
                    .arg(&src),
            )?;
        }
        std::fs::remove_file(&src)?;
    }
    Ok(())
}

/// Moves cargo-fuzz's crash, leak and timeout inputs for `name` into the
/// regression folder.
fn keep_artifacts(fuzz_dir: &Path, root: &Path, name: &str) -> Result<Vec<PathBuf>> {
    let dest = root.join("tracer/fuzz-regressions").join(name);
    std::fs::create_dir_all(&dest)?;
    let mut kept = Vec::new();
    let Ok(entries) = std::fs::read_dir(fuzz_dir.join("artifacts").join(name)) else {
        return Ok(kept);
    };
    for e in entries.flatten() {
        let to = dest.join(e.file_name());
        std::fs::copy(e.path(), &to)?;
        std::fs::remove_file(e.path())?;
        kept.push(to);
    }
    Ok(kept)
}
