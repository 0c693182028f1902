//! CPUs: which ones this process may run on, pinning a program to one, and
//! CPU time spent (by a process, by reaped children, by the whole machine).

use std::{fs, process::Command};

/// The 1-minute load average per CPU this process may run on
/// (/proc/loadavg); 0 when it cannot be read.
pub fn load_per_cpu() -> f64 {
    let load: f64 = fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    load / cpus as f64
}

/// utime + stime of a process, in seconds (/proc/PID/stat, proc(5)).
pub fn cpu_secs(pid: u32) -> Option<f64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the comm: state is field 3, utime 14 and stime 15.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Some((utime + stime) / hz)
}

/// CPU time of this process's reaped children (getrusage(2)).
pub fn children_cpu_secs() -> f64 {
    // SAFETY: a zeroed rusage is valid; getrusage writes only into it.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru);
        ru
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(ru.ru_utime) + secs(ru.ru_stime)
}

/// User and system CPU time of the whole machine (/proc/stat, proc(5)):
/// interrupts are left out, the loopback traffic's softirqs among them.
pub fn machine_busy_secs() -> f64 {
    let stat = fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks: Vec<f64> = stat
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal...
    let busy = ticks.iter().take(3).sum::<f64>();
    // SAFETY: sysconf has no preconditions.
    busy / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// CPUs for redis-server and redis-benchmark: the first two this process
/// may run on, if there are two and `taskset` is installed.
pub struct Pins {
    pub server: Option<String>,
    pub client: Option<String>,
    cpus: usize,
}

impl Pins {
    pub fn choose() -> Pins {
        let allowed = allowed_cpus();
        let taskset = crate::cmd::output(Command::new("taskset").arg("--version")).is_some();
        match allowed[..] {
            [a, b, ..] if taskset => Pins {
                server: Some(a.to_string()),
                client: Some(b.to_string()),
                cpus: allowed.len(),
            },
            _ => Pins {
                server: None,
                client: None,
                cpus: allowed.len(),
            },
        }
    }

    pub fn describe(&self) -> String {
        match (&self.server, &self.client) {
            (Some(s), Some(c)) => format!(
                "{} CPUs: redis-server pinned to CPU {s}, redis-benchmark to CPU {c}, tracer unpinned",
                self.cpus
            ),
            _ => format!(
                "{} CPUs, nothing pinned (needs 2 CPUs and taskset): client and server compete",
                self.cpus
            ),
        }
    }
}

fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_getaffinity
    // writes at most its size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&cpu| libc::CPU_ISSET(cpu, &set))
            .collect()
    }
}

/// `program` run through `taskset -c CPU` when pinned.
pub fn pinned(program: &str, cpu: Option<&str>) -> Command {
    match cpu {
        Some(cpu) => {
            let mut cmd = Command::new("taskset");
            cmd.args(["-c", cpu, program]);
            cmd
        }
        None => Command::new(program),
    }
}
