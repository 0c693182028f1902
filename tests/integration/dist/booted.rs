//! The package installed, run and removed under a real systemd: the test
//! machines have no systemd as PID 1, so systemd-nspawn boots one in a
//! container over this machine's own root (a copy-on-write overlay on a
//! tmpfs, discarded when it stops; its own network, so port 6060 is free),
//! where dpkg runs the maintainer scripts as on a host.

use std::{
    path::Path,
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

use super::package;
use crate::harness::{parse_report, process::run_timeout, scratch, system_wide_lock};

/// The continuous service traces every process of the container; a
/// `--comm` that nothing has keeps it from recording this machine's other
/// processes.
const OPTS: &str =
    "--sample-rate 65536 --comm memtrace_none --format json -o /var/lib/memtrace-bpf/heap.json";

#[test]
fn dpkg_stops_the_running_services_on_remove_and_purge_leaves_nothing() {
    // The continuous service is a system-wide trace, as in service.rs.
    let _one_at_a_time = system_wide_lock();
    let p = package();
    let dist = p.deb.parent().expect("the package's directory");
    let booted = Booted::start(dist);
    let deb = p.deb.display();

    // This machine is an image whose policy-rc.d (exit status 101) forbids
    // maintainer scripts to start or stop services; a host has none.
    booted.ok("rm -f /usr/sbin/policy-rc.d");
    booted.ok(&format!("dpkg -i {deb}"));
    for unit in ["memtrace-bpf", "memtrace-bpf-continuous"] {
        assert_eq!(
            booted.out(&format!("systemctl is-enabled {unit}")),
            "disabled"
        );
        assert_eq!(
            booted.out(&format!("systemctl is-active {unit}")),
            "inactive"
        );
    }

    // The agent: serving, with its root-only socket, nothing attached.
    booted.ok("systemctl enable --now memtrace-bpf");
    booted.ok(
        "until python3 -c 'import urllib.request as u; u.urlopen(\"http://127.0.0.1:6060/traces\")' \
         2>/dev/null; do systemctl is-active --quiet memtrace-bpf || exit 1; sleep 0.2; done",
    );
    assert_eq!(booted.out("stat -c %a /run/memtrace-bpf/agent.sock"), "600");
    // The continuous trace conflicts with it: starting it stops the agent.
    booted.ok(&format!(
        "sed -i 's|^MEMTRACE_BPF_OPTS=.*|MEMTRACE_BPF_OPTS=\"{OPTS}\"|' /etc/default/memtrace-bpf"
    ));
    booted.ok("systemctl start memtrace-bpf-continuous");
    assert_eq!(booted.out("systemctl is-active memtrace-bpf"), "inactive");
    // Serving: the trace has attached (a SIGTERM during the attach ends it
    // too, but the report to read afterwards would be a different one).
    booted.ok(
        "until python3 -c 'import urllib.request as u; u.urlopen(\"http://127.0.0.1:6060/metrics\")' \
         2>/dev/null; do systemctl is-active --quiet memtrace-bpf-continuous || exit 1; sleep 0.2; done",
    );
    let pid = booted.out("systemctl show -P MainPID memtrace-bpf-continuous");
    assert_ne!(pid, "0", "the service runs");

    booted.ok("dpkg -r memtrace-bpf");
    // Stopped by prerm, as `systemctl stop` does: SIGTERM, the report.
    assert_eq!(
        booted.out("systemctl is-active memtrace-bpf-continuous"),
        "inactive"
    );
    assert_eq!(
        booted
            .out(&format!("kill -0 {pid} 2>&1 || echo gone"))
            .lines()
            .last(),
        Some("gone")
    );
    let report = parse_report(&booted.out("cat /var/lib/memtrace-bpf/heap.json"));
    assert_eq!(report["end_reason"], "terminated (SIGTERM)");
    // Masked while removed: the enable link left for a reinstall starts
    // nothing at the next boot.
    assert_eq!(booted.out("systemctl is-enabled memtrace-bpf"), "masked");

    booted.ok("dpkg -P memtrace-bpf");
    assert_eq!(
        booted.out("find /etc/systemd /var/lib/systemd /var/lib/memtrace-bpf /etc/memtrace-bpf -name '*memtrace*' 2>/dev/null; true"),
        "",
        "purge leaves no links, state, reports or triggers"
    );
    assert_eq!(
        booted.out("ls /var/lib/memtrace-bpf 2>&1 >/dev/null | wc -l"),
        "1"
    );
}

/// A systemd booted by systemd-nspawn; stopped (and its overlay dropped)
/// on Drop.
struct Booted {
    nspawn: Child,
    /// The container's PID 1 (systemd), as this machine numbers it.
    init: u32,
}

impl Booted {
    /// Boots to basic.target with `share` bound read-only at the same path.
    fn start(share: &Path) -> Booted {
        let dir = scratch("dist-nspawn-root");
        std::fs::create_dir_all(&dir).expect("nspawn mount point");
        let log = std::fs::File::create(scratch("dist-nspawn.log")).expect("nspawn log");
        // nspawn refuses `/` itself as the directory: a bind mount of it,
        // in a mount namespace of its own, stands for it.
        let mut cmd = Command::new("unshare");
        cmd.args(["--mount", "--propagation", "private", "sh", "-c"])
            .arg(r#"mount --bind / "$1" && shift && exec systemd-nspawn "$@""#)
            .arg("sh")
            .arg(&dir)
            .arg(format!("--directory={}", dir.display()))
            .args(["--volatile=overlay", "--private-network", "--register=no"])
            .args(["--keep-unit", "--capability=CAP_BPF,CAP_PERFMON", "--quiet"])
            // nspawn's default seccomp filter refuses these two.
            .arg("--system-call-filter=bpf perf_event_open")
            .arg(format!("--bind-ro={}", share.display()))
            .args(["--boot", "systemd.unit=basic.target"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log);
        let nspawn = cmd
            .spawn()
            .expect("start systemd-nspawn (cargo xtask setup)");
        // nspawn's first child sets the container up and forks its PID 1,
        // which execs systemd: wait for that one.
        let deadline = Instant::now() + Duration::from_secs(120);
        let log = || std::fs::read_to_string(scratch("dist-nspawn.log")).unwrap_or_default();
        let init = loop {
            let children =
                std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", nspawn.id()))
                    .unwrap_or_default();
            let systemd = children.split_whitespace().find(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/comm"))
                    .is_ok_and(|comm| comm.trim() == "systemd")
            });
            if let Some(pid) = systemd {
                break pid.parse().expect("a pid");
            }
            assert!(
                Instant::now() < deadline,
                "systemd-nspawn started no systemd:\n{}",
                log()
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        let booted = Booted { nspawn, init };
        // `--wait` waits for the boot to end once systemd answers at all
        // (before that, nsenter or systemctl fails). `degraded` if a unit
        // of this machine's own fails in a container; what matters is that
        // the boot is over.
        loop {
            let out = booted.run("systemctl is-system-running --wait");
            let state = String::from_utf8_lossy(&out.stdout).trim().to_owned();
            if ["running", "degraded"].contains(&state.as_str()) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the container's systemd: {state} {}\n{}",
                String::from_utf8_lossy(&out.stderr),
                log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        booted
    }

    /// `sh -c script` inside the container, as root.
    fn run(&self, script: &str) -> Output {
        run_timeout(
            Command::new("nsenter")
                .args(["--target", &self.init.to_string(), "--all"])
                .args(["sh", "-c", script]),
            Duration::from_secs(5 * 60),
        )
    }

    /// Runs `script`, asserting it succeeded.
    fn ok(&self, script: &str) {
        let out = self.run(script);
        assert!(
            out.status.success(),
            "{script} ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `script`'s stdout, trimmed, whatever its exit status.
    fn out(&self, script: &str) -> String {
        String::from_utf8_lossy(&self.run(script).stdout)
            .trim()
            .to_owned()
    }
}

impl Drop for Booted {
    fn drop(&mut self) {
        // SIGTERM asks nspawn to power the container off; killing its init
        // ends every process in it if that does not happen.
        let pid = self.nspawn.id() as libc::pid_t;
        // SAFETY: kill(2) on the nspawn this value started.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if self.nspawn.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        // SAFETY: kill(2) on the container's init, found as nspawn's child.
        unsafe { libc::kill(self.init as libc::pid_t, libc::SIGKILL) };
        let _ = self.nspawn.kill();
        let _ = self.nspawn.wait();
    }
}
