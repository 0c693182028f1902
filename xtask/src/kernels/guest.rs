//! The host's side of a guest: the programs it runs, how QEMU runs it
//! (KVM when it can boot, else TCG), and one boot with a deadline.

use std::{
    fs,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};

use crate::cmd::{cargo, output_timeout, repo_root, run, target_dir, wait_timeout};

/// The guest's side, kept next to the code that judges what it writes.
const SCRIPT: &str = include_str!("guest.sh");

/// What the guests run, all built on the host before the first boot.
pub struct Programs {
    pub tracer: PathBuf,
    pub bin: PathBuf,
    pub script: PathBuf,
}

/// Builds the tracer (dev profile unless `release`; it embeds the BPF
/// object), tests/targets/sites.c and the tikv-jemallocator program.
pub fn build(dir: &Path, release: bool) -> Result<Programs> {
    let root = repo_root();
    let mut tracer = cargo();
    tracer
        .current_dir(&root)
        .args(["build", "-p", "memtrace-bpf"]);
    if release {
        tracer.arg("--release");
    }
    run(&mut tracer)?;
    let bin = dir.join("bin");
    fs::create_dir_all(&bin)?;
    // As distributions build: no frame pointers, so the stacks come from
    // the kernel's table walk, the default mode.
    run(Command::new("cc")
        .args(["-O2", "-g", "-fomit-frame-pointer", "-pthread", "-o"])
        .arg(bin.join("sites"))
        .arg(root.join("tests/targets/sites.c")))?;
    run(Command::new("cc")
        .args(["-O2", "-g", "-o"])
        .arg(bin.join("rss_growth"))
        .arg(root.join("tests/targets/rss_growth.c")))?;
    let rjem_target = dir.join("rjem");
    run(cargo()
        .args(["build", "--release", "--locked", "--manifest-path"])
        .arg(root.join("tests/targets/rjem/Cargo.toml"))
        .arg("--target-dir")
        .arg(&rjem_target))?;
    fs::copy(rjem_target.join("release/rjem"), bin.join("rjem"))?;
    let script = dir.join("guest.sh");
    fs::write(&script, SCRIPT)?;
    let profile = if release { "release" } else { "debug" };
    Ok(Programs {
        tracer: target_dir().join(profile).join("memtrace-bpf"),
        bin,
        script,
    })
}

/// How QEMU runs guests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accel {
    Kvm,
    /// Single-threaded TCG: a multi-threaded TCG guest once oopsed on
    /// `int3` in the scheduler; single-threaded never did.
    Tcg,
}

fn vng(venv: &Path) -> Command {
    let mut cmd = Command::new(venv.join("bin/vng"));
    // vng starts virtme-run from the same venv through PATH.
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut paths = vec![venv.join("bin")];
    paths.extend(std::env::split_paths(&path));
    cmd.env("PATH", std::env::join_paths(paths).unwrap_or(path));
    cmd.current_dir(repo_root());
    cmd
}

/// KVM only if it boots `vmlinuz` to a shell command within a minute:
/// `/dev/kvm` may be a nested device (PVM) that cannot run stock kernels.
pub fn probe_accel(venv: &Path, vmlinuz: &Path) -> Accel {
    if !Path::new("/dev/kvm").exists() {
        return Accel::Tcg;
    }
    let mut probe = vng(venv);
    probe.arg("--run").arg(vmlinuz).args([
        "--cpus",
        "2",
        "--memory",
        "1G",
        "--exec",
        "echo kvm-boots",
    ]);
    let boots = output_timeout(&mut probe, Duration::from_secs(60))
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("kvm-boots"));
    if boots {
        Accel::Kvm
    } else {
        Accel::Tcg
    }
}

/// How one boot ended.
pub enum End {
    Exited,
    TimedOut,
}

/// Boots `vmlinuz` with 2 CPUs and 3 GiB, runs the guest script writing
/// into `results`, and kills the whole QEMU process group at `timeout`.
/// The console goes to results/console.log.
pub fn boot(
    venv: &Path,
    vmlinuz: &Path,
    accel: Accel,
    programs: &Programs,
    results: &Path,
    limits: (Duration, Duration),
) -> Result<(End, Duration)> {
    let (timeout, check_timeout) = limits;
    let exec = format!(
        "bash {} {} {} {} {}",
        programs.script.display(),
        results.display(),
        programs.tracer.display(),
        programs.bin.display(),
        check_timeout.as_secs()
    );
    let mut cmd = vng(venv);
    cmd.arg("--run").arg(vmlinuz);
    if accel == Accel::Tcg {
        cmd.args(["--disable-kvm", "--qemu-opts=-accel tcg,thread=single"]);
    }
    cmd.args(["--cpus", "2", "--memory", "3G"])
        .arg(format!("--rwdir={}", results.display()))
        .args(["--exec", &exec]);
    let console = fs::File::create(results.join("console.log"))?;
    eprintln!("> {}", crate::cmd::describe(&cmd));
    let start = Instant::now();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(console.try_clone()?)
        .stderr(console)
        // Its own process group, so a timeout kills QEMU with vng.
        .process_group(0)
        .spawn()
        .context("starting vng")?;
    match wait_timeout(&mut child, timeout) {
        Ok(_) => Ok((End::Exited, start.elapsed())),
        Err(_) => {
            let pgid = i32::try_from(child.id()).context("pid")?;
            // SAFETY: kill has no memory effects; the group is the one
            // this function started.
            unsafe { libc::kill(-pgid, libc::SIGKILL) };
            let _ = child.wait();
            Ok((End::TimedOut, start.elapsed()))
        }
    }
}
