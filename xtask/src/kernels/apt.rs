//! Debian's kernel packages through an apt state of our own under
//! target/kernels/apt: the system's apt lists and cache stay untouched.

use std::{
    cmp::Ordering,
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, SystemTime},
};

use anyhow::{bail, Context, Result};

use super::{debver, Kernel, KERNELS};
use crate::cmd::{output, run};

/// Indexes younger than this are reused: a second run downloads nothing.
const FRESH: Duration = Duration::from_secs(24 * 3600);
const KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";

/// One kernel image package in one suite (a line of `apt-cache madison`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub package: String,
    pub version: String,
    pub suite: String,
}

/// A chosen kernel, downloaded and extracted.
pub struct Extracted {
    pub package: String,
    pub version: String,
    pub vmlinuz: PathBuf,
}

pub struct Apt {
    root: PathBuf,
}

impl Apt {
    pub fn new(root: PathBuf) -> Apt {
        Apt { root }
    }

    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(program);
        let r = &self.root;
        for (key, value) in [
            ("Dir::Etc::sourcelist", r.join("sources.list")),
            ("Dir::Etc::sourceparts", PathBuf::from("-")),
            ("Dir::State::Lists", r.join("lists")),
            ("Dir::Cache", r.join("cache")),
            ("Acquire::Languages", PathBuf::from("none")),
        ] {
            cmd.arg("-o").arg(format!("{key}={}", value.display()));
        }
        cmd
    }

    /// Writes our sources.list (every suite of the matrix, so one update
    /// serves any selection) and runs `apt-get update` unless the indexes
    /// of these same sources are fresh.
    pub fn update(&self) -> Result<()> {
        let (archive, security) = system_mirrors()?;
        let sources = sources_list(&archive, &security);
        let list = self.root.join("sources.list");
        let stamp = self.root.join("lists/updated");
        let fresh = fs::read_to_string(&list).is_ok_and(|s| s == sources)
            && fs::metadata(&stamp)
                .and_then(|m| m.modified())
                .is_ok_and(|t| SystemTime::now().duration_since(t).unwrap_or_default() < FRESH);
        if fresh {
            return Ok(());
        }
        for dir in ["lists/partial", "cache/archives/partial"] {
            fs::create_dir_all(self.root.join(dir))?;
        }
        fs::write(&list, &sources)?;
        run(self.command("apt-get").args(["-q", "update"]))?;
        fs::write(stamp, "")?;
        Ok(())
    }

    /// Every amd64 kernel image package the indexes know, with its suites.
    pub fn candidates(&self) -> Result<Vec<Candidate>> {
        let mut names = Vec::new();
        for prefix in ["linux-image-", "linux-binary-unsigned-"] {
            let list = output(self.command("apt-cache").args(["pkgnames", prefix]))
                .with_context(|| format!("apt-cache pkgnames {prefix}"))?;
            names.extend(
                list.lines()
                    .filter(|n| image_abi(n).is_some())
                    .map(str::to_owned),
            );
        }
        if names.is_empty() {
            bail!("no kernel image packages in {}", self.root.display());
        }
        let listing = output(self.command("apt-cache").arg("madison").args(&names))
            .context("apt-cache madison")?;
        Ok(parse_madison(&listing))
    }

    /// Downloads (unless cached) and extracts (unless done) `chosen`.
    pub fn fetch(&self, kernel: &Kernel, chosen: &Candidate, dir: &Path) -> Result<Extracted> {
        let debs = self.root.join("../debs");
        fs::create_dir_all(&debs)?;
        let (abi, split) = image_abi(&chosen.package).context("not an image package")?;
        let mut packages = vec![chosen.package.clone()];
        if split {
            // 7.x splits the kernel: the image needs the modules (for the
            // initramfs virtme-ng builds) and the base package.
            packages.push(format!("linux-modules-{abi}-amd64"));
            packages.push(format!("linux-base-{abi}-amd64"));
        }
        let dest = dir.join(format!("{}-{abi}", kernel.name));
        let done = dest.join(".extracted");
        for package in &packages {
            let deb = debs.join(format!(
                "{package}_{}_amd64.deb",
                chosen.version.replace(':', "%3a")
            ));
            if !deb.is_file() {
                let pinned = format!("{package}={}", chosen.version);
                run(self
                    .command("apt-get")
                    .current_dir(&debs)
                    .args(["-q", "download", &pinned]))?;
            }
            if !done.exists() {
                fs::create_dir_all(&dest)?;
                run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&dest))?;
            }
        }
        fs::write(&done, "")?;
        let vmlinuz = find_vmlinuz(&dest)?;
        Ok(Extracted {
            package: chosen.package.clone(),
            version: chosen.version.clone(),
            vmlinuz,
        })
    }
}

/// The ABI name in an amd64 image package's name (`5.10.0-35`,
/// `6.12.118+deb13`), and whether the kernel comes split in several
/// packages (7.x); None for flavours (cloud, rt), metapackages and others.
pub fn image_abi(name: &str) -> Option<(&str, bool)> {
    let (abi, split) = if let Some(rest) = name.strip_prefix("linux-binary-unsigned-") {
        (rest.strip_suffix("-amd64")?, true)
    } else {
        let rest = name.strip_prefix("linux-image-")?;
        (rest.strip_suffix("-amd64-unsigned")?, false)
    };
    let flavour = abi.ends_with("-cloud") || abi.ends_with("-rt");
    (abi.starts_with(|c: char| c.is_ascii_digit()) && !flavour).then_some((abi, split))
}

/// `apt-cache madison` lines: `PACKAGE | VERSION | URI SUITE/COMPONENT ARCH Packages`.
pub fn parse_madison(listing: &str) -> Vec<Candidate> {
    listing
        .lines()
        .filter_map(|line| {
            let mut fields = line.split('|').map(str::trim);
            let (package, version, source) = (fields.next()?, fields.next()?, fields.next()?);
            let suite = source.split_whitespace().nth(1)?.split('/').next()?;
            Some(Candidate {
                package: package.to_owned(),
                version: version.to_owned(),
                suite: suite.to_owned(),
            })
        })
        .collect()
}

/// The newest image package of `kernel`'s suites and series.
pub fn pick_newest<'a>(kernel: &Kernel, candidates: &'a [Candidate]) -> Option<&'a Candidate> {
    candidates
        .iter()
        .filter(|c| kernel.suites.contains(&c.suite.as_str()))
        .filter(|c| {
            let Some((abi, _)) = image_abi(&c.package) else {
                return false;
            };
            kernel
                .series
                .is_none_or(|s| abi.strip_prefix(s).is_some_and(|r| r.starts_with('.')))
        })
        .max_by(|a, b| match debver::compare(&a.version, &b.version) {
            // The same version in two suites (trixie, trixie-security):
            // either is the same file; keep the first for a stable choice.
            Ordering::Equal => Ordering::Greater,
            o => o,
        })
}

/// The Debian archive and security URIs of the system's apt sources, so
/// the matrix downloads from the mirror this machine already uses.
fn system_mirrors() -> Result<(String, String)> {
    let mut texts = Vec::new();
    if let Ok(t) = fs::read_to_string("/etc/apt/sources.list") {
        texts.push(t);
    }
    if let Ok(dir) = fs::read_dir("/etc/apt/sources.list.d") {
        let mut paths: Vec<PathBuf> = dir.filter_map(|e| Some(e.ok()?.path())).collect();
        paths.sort();
        texts.extend(paths.iter().filter_map(|p| fs::read_to_string(p).ok()));
    }
    mirrors(&texts)
        .context("no Debian archive (a URI ending in /debian) in /etc/apt/sources.list(.d)")
}

/// (archive, security) from sources in one-line or deb822 form; the
/// security archive defaults to the archive's host.
pub fn mirrors(texts: &[String]) -> Option<(String, String)> {
    let uris: Vec<&str> = texts
        .iter()
        .flat_map(|t| t.lines())
        .map(str::trim)
        .flat_map(|line| {
            let words: Vec<&str> = if let Some(rest) = line.strip_prefix("URIs:") {
                rest.split_whitespace().collect()
            } else if line.starts_with("deb ") {
                line.split_whitespace()
                    .filter(|w| w.contains("://"))
                    .take(1)
                    .collect()
            } else {
                Vec::new()
            };
            words
        })
        .map(|u| u.trim_end_matches('/'))
        .collect();
    let archive = uris.iter().find(|u| u.ends_with("/debian"))?.to_string();
    let security = uris
        .iter()
        .find(|u| u.ends_with("/debian-security"))
        .map_or_else(|| format!("{archive}-security"), |u| u.to_string());
    Some((archive, security))
}

fn sources_list(archive: &str, security: &str) -> String {
    let mut out = String::new();
    for suite in KERNELS.iter().flat_map(|k| k.suites) {
        let uri = if suite.ends_with("-security") {
            security
        } else {
            archive
        };
        out.push_str(&format!("deb [signed-by={KEYRING}] {uri} {suite} main\n"));
    }
    out
}

/// `boot/vmlinuz-*` (up to 6.x) or `usr/lib/modules/VER/vmlinuz[.unsigned]` (7.x).
fn find_vmlinuz(dest: &Path) -> Result<PathBuf> {
    if let Ok(dir) = fs::read_dir(dest.join("boot")) {
        for e in dir.flatten() {
            if e.file_name().to_string_lossy().starts_with("vmlinuz-") {
                return Ok(e.path());
            }
        }
    }
    for modules in ["usr/lib/modules", "lib/modules"] {
        if let Ok(dir) = fs::read_dir(dest.join(modules)) {
            for e in dir.flatten() {
                // The unsigned package's name for it; the signed one's is vmlinuz.
                for name in ["vmlinuz.unsigned", "vmlinuz"] {
                    let image = e.path().join(name);
                    if image.is_file() {
                        return Ok(image);
                    }
                }
            }
        }
    }
    bail!("no vmlinuz in {}", dest.display())
}
