//! `?seconds=N` on `/debug/pprof/heap` and `/debug/pprof/allocs`: the
//! profile of the next N seconds, as Go's `net/http/pprof` answers a
//! delta: what was allocated in the window, and the in-use bytes of the
//! blocks allocated in it that are still live at its end.

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

use axum::{http::StatusCode, response::Response};

use super::app::{error, pprof, App, MinAge, MAX_DELTAS, MAX_DELTA_SECS};
use crate::report::{Counts, Note, Profile, StackReport, View};

/// Answers `?seconds=TEXT`: waits the window out on the server's event
/// loop (other requests go on meanwhile), then renders it as `view`.
/// At most `MAX_DELTAS` at once; a trace that ends during the window
/// answers 503.
pub async fn serve(app: &App, seconds: &str, min_age: MinAge, view: View, name: &str) -> Response {
    let seconds = match seconds.parse::<u64>() {
        Ok(n) if (1..=MAX_DELTA_SECS).contains(&n) => n,
        _ => {
            return error(
                StatusCode::BAD_REQUEST,
                &format!(
                    "?seconds= takes a whole number of seconds from 1 to {MAX_DELTA_SECS}: the \
                     window the profile covers"
                ),
            )
        }
    };
    let Ok(_delta) = app.deltas.clone().try_acquire_owned() else {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            &format!(
                "{MAX_DELTAS} delta profiles (?seconds=) are in progress already, the most at \
                 once: try again when one ends"
            ),
        );
    };
    // Both ends new: a shared snapshot would shift the window.
    let before = match app.snapshot_for(Duration::ZERO, (min_age, None)).await {
        Ok(s) => s,
        Err(response) => return response,
    };
    let started = Instant::now();
    tokio::select! {
        () = tokio::time::sleep(Duration::from_secs(seconds)) => {}
        () = app.ended() => {
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                &format!(
                    "the trace ended {:.1} s into this {seconds} s delta profile: no profile \
                     for the window (the trace's report has the whole trace)",
                    started.elapsed().as_secs_f64()
                ),
            )
        }
    }
    // In use at the end: only the blocks allocated since `before`.
    let window = (min_age, Some(before.taken_ns));
    let after = match app.snapshot_for(Duration::ZERO, window).await {
        Ok(s) => s,
        Err(response) => return response,
    };
    let profile = between(&before.profile, &after.profile, seconds);
    pprof(Arc::new(profile), view, &format!("{name}-delta")).await
}

/// A stack's identity across snapshots: its process and its frames.
type Key<'a> = (u32, Option<u64>, bool, Vec<(&'a str, u64, &'a str)>);

fn key(s: &StackReport) -> Key<'_> {
    let frames = s
        .frames
        .iter()
        .map(|f| (f.module.as_str(), f.offset, f.function.as_str()))
        .collect();
    (s.pid, s.start_time, s.truncated, frames)
}

/// `after` with its allocated counts reduced to what was allocated since
/// `before`. In-use counts stay those of `after`, which counts only the
/// blocks allocated since `before` (see `serve`). Stacks that allocated
/// nothing in the window are left out. The profile starts when the window
/// did and lasts `seconds`.
pub fn between(before: &Profile, after: &Profile, seconds: u64) -> Profile {
    let earlier: HashMap<Key<'_>, Counts> =
        before.stacks.iter().map(|s| (key(s), s.counts)).collect();
    let mut delta = after.clone();
    delta.stacks.retain_mut(|s| {
        if let Some(old) = earlier.get(&key(s)).copied() {
            s.counts.alloc_bytes = s.counts.alloc_bytes.saturating_sub(old.alloc_bytes);
            s.counts.alloc_objects = s.counts.alloc_objects.saturating_sub(old.alloc_objects);
        }
        s.counts.alloc_objects > 0
    });
    delta.totals.alloc_bytes = delta.stacks.iter().map(|s| s.counts.alloc_bytes).sum();
    delta.totals.alloc_objects = delta.stacks.iter().map(|s| s.counts.alloc_objects).sum();
    delta.totals.inuse_bytes = delta.stacks.iter().map(|s| s.counts.inuse_bytes).sum();
    delta.totals.inuse_objects = delta.stacks.iter().map(|s| s.counts.inuse_objects).sum();
    delta.totals.peak_inuse_bytes = delta.stacks.iter().map(|s| s.counts.peak_inuse_bytes).sum();
    delta.totals.peak_inuse_objects = delta
        .stacks
        .iter()
        .map(|s| s.counts.peak_inuse_objects)
        .sum();
    delta.duration_secs = seconds as f64;
    delta.start_unix_ns = after
        .start_unix_ns
        .map(|start| start.saturating_add((before.duration_secs * 1e9) as u64));
    delta.notes.push(Note::Delta { seconds });
    delta
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::report::Frame;

    fn stack(function: &str, alloc_bytes: u64, inuse_bytes: u64) -> StackReport {
        StackReport {
            pid: 7,
            counts: Counts {
                inuse_bytes,
                inuse_objects: inuse_bytes / 16,
                alloc_bytes,
                alloc_objects: alloc_bytes / 16,
                ..Counts::default()
            },
            frames: vec![Arc::new(Frame {
                function: function.into(),
                module: "/bin/t".into(),
                ..Frame::default()
            })]
            .into(),
            ..StackReport::default()
        }
    }

    #[test]
    fn only_what_was_allocated_in_the_window() {
        let before = Profile {
            stacks: vec![stack("old", 160, 160), stack("grows", 320, 0)],
            duration_secs: 12.5,
            start_unix_ns: Some(1_700_000_000_000_000_000),
            ..Profile::default()
        };
        let after = Profile {
            duration_secs: 17.5,
            start_unix_ns: Some(1_700_000_000_000_000_000),
            stacks: vec![
                stack("old", 160, 160),
                stack("grows", 800, 48),
                stack("new", 64, 64),
            ],
            ..Profile::default()
        };
        let d = between(&before, &after, 5);
        let got: Vec<(&str, u64, u64, u64)> = d
            .stacks
            .iter()
            .map(|s| {
                (
                    s.frames[0].function.as_str(),
                    s.counts.alloc_bytes,
                    s.counts.alloc_objects,
                    s.counts.inuse_bytes,
                )
            })
            .collect();
        assert_eq!(got, [("grows", 480, 30, 48), ("new", 64, 4, 64)]);
        assert_eq!((d.totals.alloc_bytes, d.totals.inuse_bytes), (544, 112));
        assert_eq!(d.duration_secs, 5.0);
        // It starts when the window opened.
        assert_eq!(d.start_unix_ns, Some(1_700_000_012_500_000_000));
    }
}
