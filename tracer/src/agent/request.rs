//! A trace asked of the agent: from a `POST /traces` body or from
//! `/debug/pprof/heap`'s query, validated and bounded before anything is
//! started, and turned into the tracer's command line. Pure: the checks
//! that a pid, program or cgroup exists are the tracer's own (its errors
//! reach the client as the trace's failure).

use std::{collections::HashMap, path::PathBuf};

use serde::{Deserialize, Serialize};

/// Longest trace the API starts: an hour (a longer one is a service's
/// continuous trace, not a request's).
pub const MAX_SECONDS: f64 = 3600.0;
/// Longest window of `/debug/pprof/heap?seconds=`: the request waits.
pub const MAX_WINDOW_SECONDS: f64 = 300.0;
/// Largest --sample-rate asked (1 GiB between samples).
pub const MAX_SAMPLE_RATE: u64 = 1 << 30;
/// Longest path taken for --binary or --cgroup.
const MAX_PATH: usize = 4096;
/// A trace's profile so far is its latest snapshot, written this often
/// unless asked otherwise.
pub const DEFAULT_INTERVAL: f64 = 5.0;
pub const DEFAULT_SECONDS: f64 = 30.0;
pub const DEFAULT_SAMPLE_RATE: u64 = 65536;

/// What to trace: one of a process, a program, a cgroup v2.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Target {
    Pid(u32),
    Binary(PathBuf),
    Cgroup(PathBuf),
}

impl Target {
    /// The processes it has now, as the agent's --max-processes counts
    /// them: a cgroup's subtree (at least one), else one.
    pub fn processes(&self) -> usize {
        match self {
            Target::Cgroup(path) => {
                crate::tracee::cgroup::resolve(path).map_or(1, |c| c.processes().len().max(1))
            }
            Target::Pid(_) | Target::Binary(_) => 1,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TraceRequest {
    pub target: Target,
    pub seconds: f64,
    /// 1: every allocation (exact).
    pub sample_rate: u64,
    /// How often the profile so far is written.
    pub interval: f64,
    pub min_age: Option<f64>,
    /// The tracer's --otlp (triggered traces of an agent given --otlp).
    pub otlp: Option<String>,
}

/// A `POST /traces` body, as sent.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Body {
    pid: Option<u32>,
    binary: Option<String>,
    cgroup: Option<String>,
    seconds: Option<f64>,
    sample_rate: Option<u64>,
    interval: Option<f64>,
    min_age: Option<f64>,
}

impl TraceRequest {
    /// From a `POST /traces` body (JSON); the error is the 400's text.
    pub fn from_json(body: &[u8]) -> Result<TraceRequest, String> {
        let b: Body = serde_json::from_slice(body).map_err(|e| {
            format!(
                "the body is not a trace request ({e}): send JSON such as \
                 {{\"pid\": 4242, \"seconds\": 30, \"sample_rate\": 65536}} with one of pid, \
                 binary, cgroup"
            )
        })?;
        let target = target(b.pid, b.binary, b.cgroup)?;
        TraceRequest::new(
            target,
            b.seconds,
            b.sample_rate,
            b.interval,
            b.min_age,
            MAX_SECONDS,
        )
    }

    /// From `/debug/pprof/heap`'s query: `pid=`, `binary=` or `cgroup=`,
    /// `seconds=` (the window, at most `MAX_WINDOW_SECONDS`),
    /// `sample_rate=`, `min_age=`.
    pub fn from_query(params: &HashMap<String, String>) -> Result<TraceRequest, String> {
        for key in params.keys() {
            if ![
                "pid",
                "binary",
                "cgroup",
                "seconds",
                "sample_rate",
                "min_age",
            ]
            .contains(&key.as_str())
            {
                return Err(format!(
                    "unknown parameter \"{}\": this endpoint takes pid=, binary= or cgroup=, \
                     seconds=, sample_rate=, min_age=",
                    crate::escape::text(key)
                ));
            }
        }
        let number = |key: &str| -> Result<Option<f64>, String> {
            params
                .get(key)
                .map(|v| {
                    v.parse::<f64>().map_err(|_| {
                        format!("{key}=\"{}\" is not a number", crate::escape::text(v))
                    })
                })
                .transpose()
        };
        let pid = params
            .get("pid")
            .map(|v| {
                v.parse::<u32>()
                    .map_err(|_| format!("pid=\"{}\" is not a pid", crate::escape::text(v)))
            })
            .transpose()?;
        let rate = params
            .get("sample_rate")
            .map(|v| {
                v.parse::<u64>().map_err(|_| {
                    format!(
                        "sample_rate=\"{}\" is not a number of bytes",
                        crate::escape::text(v)
                    )
                })
            })
            .transpose()?;
        let target = target(
            pid,
            params.get("binary").cloned(),
            params.get("cgroup").cloned(),
        )?;
        let seconds = number("seconds")?.or(Some(DEFAULT_SECONDS));
        TraceRequest::new(
            target,
            seconds,
            rate,
            None,
            number("min_age")?,
            MAX_WINDOW_SECONDS,
        )
    }

    fn new(
        target: Target,
        seconds: Option<f64>,
        sample_rate: Option<u64>,
        interval: Option<f64>,
        min_age: Option<f64>,
        max_seconds: f64,
    ) -> Result<TraceRequest, String> {
        let seconds = seconds.unwrap_or(DEFAULT_SECONDS);
        if !(seconds.is_finite() && (1.0..=max_seconds).contains(&seconds)) {
            return Err(format!("seconds must be 1 to {max_seconds}, got {seconds}"));
        }
        let sample_rate = sample_rate.unwrap_or(DEFAULT_SAMPLE_RATE);
        if !(1..=MAX_SAMPLE_RATE).contains(&sample_rate) {
            return Err(format!(
                "sample_rate must be 1 (every allocation) to {MAX_SAMPLE_RATE} bytes, got \
                 {sample_rate}"
            ));
        }
        let interval = interval.unwrap_or(DEFAULT_INTERVAL.min(seconds));
        if !(interval.is_finite() && (0.5..=seconds).contains(&interval)) {
            return Err(format!(
                "interval must be 0.5 to the trace's {seconds} seconds, got {interval}"
            ));
        }
        if let Some(age) = min_age.filter(|a| !(a.is_finite() && (0.0..=seconds).contains(a))) {
            return Err(format!(
                "min_age must be 0 to the trace's {seconds} seconds, got {age}"
            ));
        }
        Ok(TraceRequest {
            target,
            seconds,
            sample_rate,
            interval,
            min_age,
            otlp: None,
        })
    }

    /// The tracer's arguments for this trace, its numbered snapshots
    /// written to `output` (a path with `{n}`).
    pub fn tracer_args(&self, output: &std::path::Path) -> Vec<std::ffi::OsString> {
        let mut args: Vec<std::ffi::OsString> = Vec::new();
        match &self.target {
            Target::Pid(pid) => args.extend(["--pid".into(), pid.to_string().into()]),
            Target::Binary(path) => args.extend(["--binary".into(), path.into()]),
            Target::Cgroup(path) => args.extend(["--cgroup".into(), path.into()]),
        }
        for (flag, value) in [
            ("--duration", self.seconds.to_string()),
            ("--sample-rate", self.sample_rate.to_string()),
            ("--interval", self.interval.to_string()),
        ] {
            args.extend([flag.into(), value.into()]);
        }
        if let Some(age) = self.min_age {
            args.extend(["--min-age".into(), age.to_string().into()]);
        }
        if let Some(url) = &self.otlp {
            args.push(format!("--otlp={url}").into());
        }
        args.extend(["--format".into(), "json".into(), "--quiet".into()]);
        args.extend(["--output".into(), output.into()]);
        args
    }

    /// "pid 4242", "binary /usr/bin/x", "cgroup /system.slice/x.service".
    pub fn label(&self) -> String {
        match &self.target {
            Target::Pid(pid) => format!("pid {pid}"),
            Target::Binary(path) => format!("binary {}", path.display()),
            Target::Cgroup(path) => format!("cgroup {}", path.display()),
        }
    }
}

fn target(
    pid: Option<u32>,
    binary: Option<String>,
    cgroup: Option<String>,
) -> Result<Target, String> {
    let path = |what: &str, p: String| -> Result<PathBuf, String> {
        if p.is_empty() || p.len() > MAX_PATH || p.contains('\0') {
            return Err(format!(
                "{what} takes a path of 1 to {MAX_PATH} bytes without NUL"
            ));
        }
        Ok(PathBuf::from(p))
    };
    match (pid, binary, cgroup) {
        (Some(0), None, None) => Err("pid 0 is not a process".into()),
        (Some(pid), None, None) => Ok(Target::Pid(pid)),
        (None, Some(b), None) => Ok(Target::Binary(path("binary", b)?)),
        (None, None, Some(c)) => Ok(Target::Cgroup(path("cgroup", c)?)),
        (None, None, None) => Err(
            "say what to trace: one of pid, binary (a program's path) or cgroup (a cgroup v2 \
             path); the agent does not trace the whole host on request"
                .into(),
        ),
        _ => Err("give one of pid, binary, cgroup, not several".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_gives_a_request_with_its_defaults_and_its_command_line() {
        let r = TraceRequest::from_json(br#"{"pid": 42, "seconds": 10, "sample_rate": 1}"#)
            .expect("a request");
        assert_eq!(r.target, Target::Pid(42));
        assert_eq!((r.seconds, r.sample_rate, r.interval), (10.0, 1, 5.0));
        let args: Vec<String> = r
            .tracer_args(std::path::Path::new("/d/1-{n}.json"))
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect();
        assert_eq!(
            args.join(" "),
            "--pid 42 --duration 10 --sample-rate 1 --interval 5 --format json --quiet \
             --output /d/1-{n}.json"
        );
        let short = TraceRequest::from_json(br#"{"binary": "/usr/bin/x", "seconds": 2}"#).unwrap();
        assert_eq!(
            (short.interval, short.sample_rate),
            (2.0, DEFAULT_SAMPLE_RATE)
        );
        assert_eq!(short.label(), "binary /usr/bin/x");
    }

    #[test]
    fn bad_bodies_and_queries_say_what_is_wrong() {
        let err = |body: &str| TraceRequest::from_json(body.as_bytes()).unwrap_err();
        assert!(err("").contains("not a trace request"));
        assert!(err(r#"{"pid": 1, "evil": 2}"#).contains("unknown field"));
        assert!(err(r#"{"pid": 1, "binary": "/x"}"#).contains("not several"));
        assert!(err("{}").contains("say what to trace"));
        assert!(err(r#"{"pid": 0}"#).contains("pid 0"));
        assert!(err(r#"{"pid": 1, "seconds": 0}"#).contains("seconds must be 1 to 3600"));
        assert!(err(r#"{"pid": 1, "seconds": 1e9}"#).contains("seconds must be"));
        assert!(err(r#"{"pid": 1, "sample_rate": 0}"#).contains("sample_rate must be"));
        assert!(err(r#"{"pid": 1, "interval": 0.1}"#).contains("interval must be"));
        assert!(err(r#"{"pid": 1, "min_age": -1}"#).contains("min_age must be"));
        assert!(err(r#"{"cgroup": ""}"#).contains("path of 1 to"));
        let q = |pairs: &[(&str, &str)]| {
            let params: HashMap<String, String> = pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            TraceRequest::from_query(&params)
        };
        let ok = q(&[("pid", "7"), ("seconds", "5"), ("sample_rate", "1")]).unwrap();
        assert_eq!((ok.seconds, ok.sample_rate, ok.interval), (5.0, 1, 5.0));
        assert_eq!(q(&[("pid", "7")]).unwrap().seconds, DEFAULT_SECONDS);
        assert!(q(&[("pid", "7"), ("seconds", "301")])
            .unwrap_err()
            .contains("1 to 300"));
        assert!(q(&[("pid", "x\u{1b}[2J")])
            .unwrap_err()
            .contains("x\\x1b[2J"));
        assert!(q(&[("pid", "7"), ("debug", "1")])
            .unwrap_err()
            .contains("unknown parameter"));
    }
}
