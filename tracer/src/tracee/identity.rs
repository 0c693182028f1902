//! Where a process runs (`profile::Identity`): its cgroup v2 path and the
//! container, pod or systemd unit the path names, its pid in its own pid
//! namespace, and its program as its own root shows it.
//!
//! All of it comes from /proc files a process (or its container runtime)
//! shapes: every read is bounded, every name kept is checked against the
//! form it must have (hex ids, UUIDs) or cut to a length; renderers escape.

use std::{io::Read as _, path::Path};

use crate::profile::Identity;

/// Longest cgroup path kept (PATH_MAX).
const MAX_CGROUP_PATH: usize = 4096;
/// Longest unit name kept (systemd's UNIT_NAME_MAX).
const MAX_UNIT: usize = 256;
/// Bytes of /proc/PID/cgroup and /proc/PID/status read: a hybrid host lists
/// a dozen hierarchies.
const MAX_PROC_FILE: u64 = 16 * 1024;
/// Longest program path kept.
const MAX_PROGRAM: usize = 4096;

/// Reads `pid`'s identity now; what cannot be read stays None.
pub fn read(pid: u32) -> Identity {
    let cgroup = read_bounded(&format!("/proc/{pid}/cgroup")).and_then(|t| cgroup_v2_path(&t));
    let names = cgroup.as_deref().map(names_in).unwrap_or_default();
    Identity {
        container_id: names.container_id,
        pod_uid: names.pod_uid,
        unit: names.unit,
        cgroup,
        ns_pid: read_bounded(&format!("/proc/{pid}/status")).and_then(|t| ns_pid(&t)),
        ns_program: ns_program(pid),
    }
}

fn read_bounded(path: &str) -> Option<String> {
    let mut text = String::new();
    std::fs::File::open(path)
        .ok()?
        .take(MAX_PROC_FILE)
        .read_to_string(&mut text)
        .ok()?;
    Some(text)
}

/// The `0::PATH` line of /proc/PID/cgroup (cgroup v2), cut at
/// MAX_CGROUP_PATH.
pub fn cgroup_v2_path(text: &str) -> Option<String> {
    let path = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    if !path.starts_with('/') {
        return None;
    }
    Some(cut(path, MAX_CGROUP_PATH).to_string())
}

/// The innermost pid of the `NSpid:` line of /proc/PID/status, when the
/// process is in a pid namespace of its own (more than one pid listed).
pub fn ns_pid(status: &str) -> Option<u32> {
    let line = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
    let pids: Vec<&str> = line.split_whitespace().collect();
    match pids.as_slice() {
        [_, .., last] => last.parse().ok(),
        _ => None,
    }
}

/// What a cgroup path names.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Names {
    pub container_id: Option<String>,
    pub pod_uid: Option<String>,
    pub unit: Option<String>,
}

/// The container id, pod UID and systemd unit a cgroup path names, the
/// innermost of each.
pub fn names_in(path: &str) -> Names {
    let mut names = Names::default();
    let kubepods = path.contains("kubepods");
    let mut parent = "";
    for part in path.split('/').filter(|p| !p.is_empty()) {
        if let Some(id) = container_id(part, parent) {
            names.container_id = Some(id);
        }
        if let Some(uid) = kubepods.then(|| pod_uid(part)).flatten() {
            names.pod_uid = Some(uid);
        }
        let kind = part.rsplit_once('.').map(|(_, kind)| kind);
        if part.len() <= MAX_UNIT && matches!(kind, Some("service" | "scope")) {
            names.unit = Some(part.to_string());
        }
        parent = part;
    }
    names
}

/// Runtime scope prefixes that name a container (the systemd cgroup
/// driver): `<prefix><id>.scope`. The `-conmon-` scopes of CRI-O and
/// Podman hold their monitor, not the container.
const SCOPE_PREFIXES: [&str; 4] = ["docker-", "cri-containerd-", "crio-", "libpod-"];

/// The container id of one path component: a runtime scope, or (cgroupfs
/// driver) a bare id under `docker` or a pod's cgroup.
fn container_id(part: &str, parent: &str) -> Option<String> {
    let scoped = part.strip_suffix(".scope").and_then(|name| {
        SCOPE_PREFIXES
            .iter()
            .find_map(|prefix| name.strip_prefix(prefix))
    });
    let id = match scoped {
        Some(id) => id,
        None if parent == "docker" || parent.starts_with("pod") => part,
        None => return None,
    };
    Identity::is_container_id(id).then(|| id.to_string())
}

/// `kubepods-burstable-pod<uid>.slice` (underscores for the UID's dashes,
/// systemd driver) or `pod<uid>` (cgroupfs driver): the UID with dashes.
fn pod_uid(part: &str) -> Option<String> {
    let name = part.strip_suffix(".slice").unwrap_or(part);
    let at = name.rfind("pod")?;
    if at > 0 && !name[..at].ends_with('-') {
        return None;
    }
    let uid = name[at + 3..].replace('_', "-");
    Identity::is_pod_uid(&uid).then_some(uid)
}

/// The program `pid` runs as its own root shows it, when its root is not
/// this process's (a chroot) or it has a mount namespace of its own: the
/// path of /proc/PID/exe without its root's prefix, checked to exist
/// through /proc/PID/root.
fn ns_program(pid: u32) -> Option<String> {
    let own_ns = std::fs::read_link(format!("/proc/{pid}/ns/mnt")).ok()?
        != std::fs::read_link("/proc/self/ns/mnt").ok()?;
    let root = std::fs::read_link(format!("/proc/{pid}/root")).ok()?;
    if !own_ns && root == Path::new("/") {
        return None;
    }
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
    let inside = match exe.strip_prefix(&root) {
        Ok(rest) => Path::new("/").join(rest),
        Err(_) if own_ns => exe,
        Err(_) => return None,
    };
    let through = format!("/proc/{pid}/root{}", inside.display());
    if !Path::new(&through).exists() {
        return None;
    }
    let text = inside.to_string_lossy();
    Some(cut(&text, MAX_PROGRAM).to_string())
}

/// `s` cut to at most `max` bytes, at a character boundary.
fn cut(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn names(path: &str) -> (Option<String>, Option<String>, Option<String>) {
        let n = names_in(path);
        (n.container_id, n.pod_uid, n.unit)
    }

    #[test]
    fn runtime_scopes_name_their_container() {
        for prefix in SCOPE_PREFIXES {
            let path = format!("/system.slice/{prefix}{ID}.scope");
            let (id, pod, unit) = names(&path);
            assert_eq!(id.as_deref(), Some(ID), "{path}");
            assert_eq!(pod, None);
            assert_eq!(unit, Some(format!("{prefix}{ID}.scope")));
        }
        assert_eq!(names(&format!("/docker/{ID}")).0.as_deref(), Some(ID));
    }

    #[test]
    fn conmon_scopes_and_bad_ids_name_no_container() {
        for path in [
            format!("/machine.slice/libpod-conmon-{ID}.scope"),
            format!("/system.slice/docker-{}.scope", &ID[..11]),
            format!("/system.slice/docker-{ID}0.scope"),
            format!("/system.slice/docker-{}g.scope", &ID[..63]),
            "/system.slice/docker-.scope".to_string(),
            format!("/docker-{ID}"),
            format!("/other/{ID}"),
        ] {
            assert_eq!(names(&path).0, None, "{path}");
        }
    }

    #[test]
    fn pods_are_named_with_dashes_under_either_driver() {
        let uid = "1b4e28ba-2fa1-11d2-883f-0016d3cca427";
        let systemd = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/\
             cri-containerd-{ID}.scope",
            uid.replace('-', "_")
        );
        assert_eq!(
            names(&systemd),
            (
                Some(ID.to_string()),
                Some(uid.to_string()),
                Some(format!("cri-containerd-{ID}.scope"))
            )
        );
        let cgroupfs = format!("/kubepods/besteffort/pod{uid}/{ID}");
        assert_eq!(
            names(&cgroupfs),
            (Some(ID.to_string()), Some(uid.to_string()), None)
        );
        // Not under kubepods, or not a UUID: no pod.
        assert_eq!(names(&format!("/x/pod{uid}")).1, None);
        assert_eq!(names("/kubepods/pod1234").1, None);
        assert_eq!(
            names("/kubepods/mypod1b4e28ba_2fa1_11d2_883f_0016d3cca427").1,
            None
        );
    }

    #[test]
    fn units_are_services_and_scopes_the_innermost_kept() {
        assert_eq!(
            names("/system.slice/redis.service").2.as_deref(),
            Some("redis.service")
        );
        assert_eq!(
            names("/user.slice/user-0.slice/session-3.scope/x.service")
                .2
                .as_deref(),
            Some("x.service")
        );
        assert_eq!(names("/user.slice").2, None);
        assert_eq!(names("/").2, None);
        let long = format!("/{}.service", "a".repeat(MAX_UNIT));
        assert_eq!(names(&long).2, None);
    }

    #[test]
    fn hostile_paths_stay_bounded_and_whole() {
        // Control bytes are kept (renderers escape them), never split a
        // path into two identities; a huge path is cut.
        let evil = format!("0::/a\x1b[2J/docker-{ID}.scope\n0::/other\n");
        assert_eq!(
            cgroup_v2_path(&evil).as_deref(),
            Some(&*format!("/a\x1b[2J/docker-{ID}.scope"))
        );
        let huge = format!("0::/{}", "é".repeat(5000));
        let path = cgroup_v2_path(&huge).expect("path");
        assert!(path.len() <= MAX_CGROUP_PATH);
        assert_eq!(cgroup_v2_path("1:memory:/x\n"), None);
        assert_eq!(cgroup_v2_path("0::relative\n"), None);
        assert_eq!(names_in(&"/".repeat(10_000)), Names::default());
        assert_eq!(names(&format!("/docker-\u{0}{ID}.scope")).0, None);
    }

    #[test]
    fn the_innermost_namespace_pid_is_kept() {
        assert_eq!(ns_pid("Name:\tx\nNSpid:\t4242\t7\t1\n"), Some(1));
        assert_eq!(ns_pid("NSpid:\t4242\n"), None);
        assert_eq!(ns_pid("NSpid:\t4242\tx\n"), None);
        assert_eq!(ns_pid("Pid:\t4242\n"), None);
    }
}
