//! The agent's triggers: when a cgroup's or a process's memory misbehaves,
//! a trace of it starts (docs/agent.md#triggers). A trigger is one line:
//!
//! ```text
//! cgroup=/system.slice/redis.service memory>2G seconds=60
//! pid=4242 growth>50M/30s sample-rate=65536 cooldown=600
//! cgroup=/kubepods.slice/x events
//! cgroup=/system.slice/x.service psi-some>150ms/1s
//! ```
//!
//! The target (`cgroup=PATH`, a cgroup v2 path; `pid=N`), one condition,
//! then options. Conditions: `memory>SIZE` (a cgroup's charged memory, a
//! process's RSS; `rss>` is the same), `growth>SIZE/DURATION` (it rose by
//! SIZE within DURATION), `events` (a cgroup's `memory.events` `high` or
//! `max` counters rose: v1's `memory.failcnt` and OOM kills), `psi-some>STALL/WINDOW` and
//! `psi-full>STALL/WINDOW` (memory pressure, as the kernel's PSI triggers
//! tell it: the cgroup's `memory.pressure`, else /proc/pressure/memory).
//! Options: `seconds=` (the trace's longest; default 60), `sample-rate=`
//! (default 65536), `cooldown=` (seconds before it may fire again; default
//! 300), `formats=` (besides JSON: pprof, text, collapsed, flamegraph,
//! speedscope). Pure: parsing and the conditions' arithmetic.

use std::{collections::VecDeque, path::PathBuf, time::Duration};

use serde::Serialize;

use crate::report::Format;

/// Longest trigger line.
const MAX_LINE: usize = 4096;
/// The longest growth window: its readings, 4 a second, are kept for it
/// (14,400 of 16 bytes at most).
const MAX_WINDOW: Duration = Duration::from_secs(3600);

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TriggerTarget {
    Cgroup(PathBuf),
    Pid(u32),
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Condition {
    /// Memory (a cgroup's charged bytes, a process's RSS) above this.
    Above { bytes: u64 },
    /// Rose by `bytes` within `window`.
    Growth {
        bytes: u64,
        #[serde(serialize_with = "secs")]
        window: Duration,
    },
    /// The cgroup's high/max events (v1: failcnt and oom_kill) rose.
    Events,
    /// PSI: `stall` of stalled time within `window` (some or full).
    Pressure {
        full: bool,
        #[serde(serialize_with = "secs")]
        stall: Duration,
        #[serde(serialize_with = "secs")]
        window: Duration,
    },
}

/// A duration as seconds, in GET /triggers.
fn secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Trigger {
    /// The line as given (for the logs and GET /triggers).
    pub line: String,
    pub target: TriggerTarget,
    pub condition: Condition,
    pub seconds: f64,
    pub sample_rate: u64,
    #[serde(rename = "cooldown_secs", serialize_with = "secs")]
    pub cooldown: Duration,
    /// Formats written besides JSON.
    #[serde(skip)]
    pub formats: Vec<Format>,
}

impl Trigger {
    pub fn parse(line: &str) -> Result<Trigger, String> {
        if line.len() > MAX_LINE {
            return Err(format!("a trigger is at most {MAX_LINE} bytes"));
        }
        let mut words = line.split_whitespace();
        let target = match words.next().and_then(|w| w.split_once('=')) {
            Some(("cgroup", path)) if !path.is_empty() => TriggerTarget::Cgroup(path.into()),
            Some(("pid", pid)) => match pid.parse::<u32>() {
                Ok(pid) if pid > 0 => TriggerTarget::Pid(pid),
                _ => return Err(format!("pid={pid}: not a process id")),
            },
            _ => return Err("a trigger starts with cgroup=PATH or pid=N".into()),
        };
        let condition = parse_condition(words.next().unwrap_or(""))?;
        if matches!(condition, Condition::Events) && matches!(target, TriggerTarget::Pid(_)) {
            return Err("events watches a cgroup's memory.events: use cgroup=PATH".into());
        }
        let mut trigger = Trigger {
            line: line.trim().to_string(),
            target,
            condition,
            seconds: 60.0,
            sample_rate: 65536,
            cooldown: Duration::from_secs(300),
            formats: Vec::new(),
        };
        for option in words {
            trigger.option(option)?;
        }
        Ok(trigger)
    }

    fn option(&mut self, option: &str) -> Result<(), String> {
        let (key, value) = option
            .split_once('=')
            .ok_or_else(|| format!("{option}: options are KEY=VALUE"))?;
        let number = || {
            value
                .parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v >= 0.0)
                .ok_or_else(|| format!("{key}={value}: not a number"))
        };
        match key {
            "seconds" => {
                let s = number()?;
                if !(1.0..=super::request::MAX_SECONDS).contains(&s) {
                    return Err(format!("seconds={value}: 1 to 3600"));
                }
                self.seconds = s;
            }
            "sample-rate" => {
                self.sample_rate = value
                    .parse()
                    .ok()
                    .filter(|r| (1..=super::request::MAX_SAMPLE_RATE).contains(r))
                    .ok_or_else(|| format!("sample-rate={value}: 1 to 2^30 bytes"))?;
            }
            "cooldown" => self.cooldown = Duration::from_secs_f64(number()?.min(86_400.0)),
            "formats" => {
                for name in value.split(',') {
                    let format = <Format as clap::ValueEnum>::from_str(name, true)
                        .map_err(|_| format!("formats: {name} is not a format"))?;
                    if format != Format::Json && !self.formats.contains(&format) {
                        self.formats.push(format);
                    }
                }
            }
            _ => {
                return Err(format!(
                    "{key}: options are seconds=, sample-rate=, cooldown=, formats="
                ))
            }
        }
        Ok(())
    }

    /// A short name of what and why, for report file names:
    /// `cgroup-system.slice-redis.service-memory-above`.
    pub fn slug(&self) -> String {
        let what = match &self.target {
            TriggerTarget::Cgroup(path) => format!("cgroup-{}", path.display()),
            TriggerTarget::Pid(pid) => format!("pid-{pid}"),
        };
        let why = match self.condition {
            Condition::Above { .. } => "memory-above",
            Condition::Growth { .. } => "growth",
            Condition::Events => "memory-events",
            Condition::Pressure { full: false, .. } => "psi-some",
            Condition::Pressure { full: true, .. } => "psi-full",
        };
        let name: String = format!("{what}-{why}")
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '.' || c == '_' {
                    c
                } else {
                    '-'
                }
            })
            .collect();
        let name = name.trim_matches('-').replace("--", "-");
        name.chars().take(120).collect()
    }
}

fn parse_condition(word: &str) -> Result<Condition, String> {
    let usage = "a condition: memory>SIZE, rss>SIZE, growth>SIZE/DURATION, events, \
                 psi-some>STALL/WINDOW or psi-full>STALL/WINDOW";
    if word == "events" {
        return Ok(Condition::Events);
    }
    let (name, value) = word.split_once('>').ok_or_else(|| usage.to_string())?;
    match name {
        "memory" | "rss" => Ok(Condition::Above {
            bytes: size(value)?,
        }),
        "growth" => {
            let (bytes, window) = value
                .split_once('/')
                .ok_or("growth>SIZE/DURATION, e.g. growth>100M/60s")?;
            let window = duration(window)?;
            if !(Duration::from_secs(1)..=MAX_WINDOW).contains(&window) {
                return Err("growth: a window of 1s to 1h".into());
            }
            Ok(Condition::Growth {
                bytes: size(bytes)?,
                window,
            })
        }
        "psi-some" | "psi-full" => {
            let (stall, window) = value
                .split_once('/')
                .ok_or("psi-some>STALL/WINDOW, e.g. psi-some>150ms/1s")?;
            let (stall, window) = (duration(stall)?, duration(window)?);
            // The kernel's limits on a PSI trigger.
            if !(Duration::from_millis(500)..=Duration::from_secs(10)).contains(&window)
                || stall.is_zero()
                || stall > window
            {
                return Err("psi: a window of 500ms to 10s and a stall up to it".into());
            }
            Ok(Condition::Pressure {
                full: name == "psi-full",
                stall,
                window,
            })
        }
        _ => Err(usage.to_string()),
    }
}

/// "2G", "512M", "64k", "1000" (bytes; binary units).
pub fn size(text: &str) -> Result<u64, String> {
    let (digits, shift) = match text.char_indices().last() {
        Some((i, 'k' | 'K')) => (&text[..i], 10),
        Some((i, 'm' | 'M')) => (&text[..i], 20),
        Some((i, 'g' | 'G')) => (&text[..i], 30),
        Some((i, 't' | 'T')) => (&text[..i], 40),
        _ => (text, 0),
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1 << shift))
        .filter(|&n| n > 0)
        .ok_or_else(|| format!("{text}: a size such as 512M or 2G"))
}

/// "150ms", "30s", "5m".
pub fn duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("{text}: a duration such as 150ms, 30s or 5m");
    let (number, unit) = if let Some(n) = text.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = text.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = text.strip_suffix('m') {
        (n, 60.0)
    } else {
        return Err(bad());
    };
    let value: f64 = number.parse().map_err(|_| bad())?;
    if !(value.is_finite() && value > 0.0 && value * unit <= 86_400.0) {
        return Err(bad());
    }
    Ok(Duration::from_secs_f64(value * unit))
}

/// A trigger's state, for GET /triggers.
#[derive(Clone, Serialize)]
pub struct TriggerState {
    pub trigger: Trigger,
    /// What its condition reads (bytes or a count; null for PSI).
    pub last_value: Option<u64>,
    pub holds: bool,
    pub fired: u64,
    /// Times it held but started nothing: in its cooldown or a trace of it
    /// running, or the agent at --max-traces.
    pub skipped_busy: u64,
    pub running_trace: Option<u64>,
    pub last_report: Option<String>,
    /// Why it cannot be evaluated now (its cgroup gone, no pressure file).
    pub error: Option<String>,
}

/// A condition's readings over time, and whether it holds now.
#[derive(Default)]
pub struct Readings {
    /// (seconds, value), oldest first, as long as the growth window.
    samples: VecDeque<(f64, u64)>,
}

impl Readings {
    /// Adds a reading at `secs`; whether `condition` holds with it.
    pub fn add(&mut self, condition: &Condition, secs: f64, value: u64) -> bool {
        let before = self.samples.back().map(|&(_, v)| v);
        self.samples.push_back((secs, value));
        match *condition {
            Condition::Above { bytes } => {
                self.samples.drain(..self.samples.len() - 1);
                value > bytes
            }
            Condition::Growth { bytes, window } => {
                let window = window.as_secs_f64();
                while self
                    .samples
                    .get(1)
                    .is_some_and(|&(t, _)| secs - t >= window)
                {
                    self.samples.pop_front();
                }
                let lowest = self.samples.iter().map(|&(_, v)| v).min().unwrap_or(value);
                value.saturating_sub(lowest) >= bytes
            }
            // A counter: it rose since the last reading.
            Condition::Events => {
                self.samples.drain(..self.samples.len() - 1);
                before.is_some_and(|b| value > b)
            }
            Condition::Pressure { .. } => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trigger_lines_are_read_with_their_options() {
        let t = Trigger::parse(
            "cgroup=/system.slice/redis.service memory>2G seconds=30 formats=pprof,text",
        )
        .unwrap();
        assert_eq!(
            t.target,
            TriggerTarget::Cgroup("/system.slice/redis.service".into())
        );
        assert_eq!(t.condition, Condition::Above { bytes: 2 << 30 });
        assert_eq!((t.seconds, t.sample_rate), (30.0, 65536));
        assert_eq!(t.formats, [Format::Pprof, Format::Text]);
        assert_eq!(t.slug(), "cgroup-system.slice-redis.service-memory-above");
        let g = Trigger::parse("pid=42 growth>50M/30s cooldown=10 sample-rate=1").unwrap();
        assert_eq!(
            g.condition,
            Condition::Growth {
                bytes: 50 << 20,
                window: Duration::from_secs(30)
            }
        );
        assert_eq!((g.cooldown, g.sample_rate), (Duration::from_secs(10), 1));
        let p = Trigger::parse("cgroup=x psi-full>100ms/1s").unwrap();
        assert_eq!(
            p.condition,
            Condition::Pressure {
                full: true,
                stall: Duration::from_millis(100),
                window: Duration::from_secs(1)
            }
        );
        assert_eq!(
            Trigger::parse("cgroup=/a/../b events").unwrap().slug(),
            "cgroup-a-..-b-memory-events"
        );
    }

    #[test]
    fn bad_lines_say_what_to_write() {
        let err = |l: &str| Trigger::parse(l).unwrap_err();
        assert!(err("memory>1G").contains("starts with cgroup=PATH or pid=N"));
        assert!(err("pid=0 memory>1G").contains("not a process id"));
        assert!(err("pid=1 memory").contains("a condition"));
        assert!(err("pid=1 memory>lots").contains("a size such as"));
        assert!(err("pid=1 growth>1M").contains("growth>SIZE/DURATION"));
        assert!(err("pid=1 growth>1M/0.5s").contains("1s to 1h"));
        assert!(err("pid=1 growth>1M/120m").contains("1s to 1h"));
        assert!(err("pid=1 psi-some>2s/1s").contains("window of 500ms to 10s"));
        assert!(err("pid=1 events").contains("use cgroup=PATH"));
        assert!(err("pid=1 memory>1G seconds=0").contains("1 to 3600"));
        assert!(err("pid=1 memory>1G formats=doc").contains("not a format"));
        assert!(err("pid=1 memory>1G loud").contains("KEY=VALUE"));
        assert!(err("pid=1 memory>1G x=1").contains("options are"));
        assert!(err(&"x".repeat(5000)).contains("at most"));
    }

    #[test]
    fn conditions_hold_on_their_readings() {
        let mut above = Readings::default();
        let c = Condition::Above { bytes: 100 };
        assert!(!above.add(&c, 0.0, 100));
        assert!(above.add(&c, 1.0, 101));
        let mut growth = Readings::default();
        let c = Condition::Growth {
            bytes: 50,
            window: Duration::from_secs(3),
        };
        assert!(!growth.add(&c, 0.0, 1000));
        assert!(!growth.add(&c, 1.0, 1020));
        assert!(growth.add(&c, 2.0, 1050), "rose 50 within 3 s");
        // Slow growth never rises 50 within the window.
        let mut slow = Readings::default();
        let fired = (0..20).any(|i| slow.add(&c, f64::from(i), 1000 + 10 * i as u64));
        assert!(!fired);
        assert!(slow.samples.len() <= 4, "bounded by the window");
        let mut events = Readings::default();
        assert!(!events.add(&Condition::Events, 0.0, 5), "the first reading");
        assert!(!events.add(&Condition::Events, 1.0, 5));
        assert!(events.add(&Condition::Events, 2.0, 6));
    }
}
