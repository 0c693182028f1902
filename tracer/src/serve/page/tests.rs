//! The live page's HTML, from profiles with and without history: hostile
//! names stay text, nothing is fetched from outside, the size is bounded.

use std::sync::Arc;

use super::{write_page, Flame, Page};
use crate::report::{Counts, Frame, ProcessInfo, Profile, SnapshotPoint, StackReport, Trend};

const ENDPOINTS: &str = "\
/                          the live page
/debug/pprof/heap          pprof, in-use space by default
/flamegraph.svg?view=V     SVG flamegraph
";

fn frame(function: &str) -> Arc<Frame> {
    Arc::new(Frame {
        function: function.to_string(),
        module: "/opt/app/bin/app".to_string(),
        offset: 0x1000,
        file: Some("src/app.c".to_string()),
        line: Some(12),
        inlined: false,
        build_id: None,
    })
}

fn stack(leaf: &str, inuse_bytes: u64) -> StackReport {
    StackReport {
        pid: 7,
        counts: Counts {
            inuse_bytes,
            inuse_objects: inuse_bytes / 100,
            alloc_bytes: inuse_bytes * 2,
            alloc_objects: inuse_bytes / 50,
            ..Counts::default()
        },
        frames: vec![frame(leaf), frame("main"), frame("_start")].into(),
        ..StackReport::default()
    }
}

/// One process, two stacks, no history (a trace without --interval).
fn no_history() -> Profile {
    let stacks = vec![stack("leak_block", 60_000), stack("cache_fill", 20_000)];
    Profile {
        target: "pid 7".to_string(),
        duration_secs: 30.0,
        end_reason: "snapshot served while tracing (the trace went on)".to_string(),
        sample_rate: 1,
        processes: vec![ProcessInfo {
            pid: 7,
            command: "./app --serve".to_string(),
            program: "./app".to_string(),
            ..ProcessInfo::default()
        }],
        totals: Counts {
            inuse_bytes: 80_000,
            inuse_objects: 800,
            alloc_bytes: 160_000,
            alloc_objects: 1600,
            ..Counts::default()
        },
        stacks,
        ..Profile::default()
    }
}

/// Six snapshots 5 s apart: leak_block grows 20 KiB a minute, cache_fill
/// rose and stopped, shrink_me went down.
fn with_history() -> Profile {
    let mut p = no_history();
    p.snapshots = (1..=6)
        .map(|i| SnapshotPoint {
            secs: 5.0 * i as f64,
            inuse_bytes: 20_000 + 10_000 * i,
            ..SnapshotPoint::default()
        })
        .collect();
    let leak = &mut p.stacks[0];
    leak.series = (1..=6).map(|i| 10_000 * i).collect();
    leak.growth_bytes_per_sec = Some(20480.0 / 60.0);
    leak.trend = Some(Trend::Growing);
    let cache = &mut p.stacks[1];
    cache.series = vec![5_000, 20_000, 20_000, 20_000, 20_000, 20_000];
    cache.growth_bytes_per_sec = Some(300.0);
    cache.trend = Some(Trend::Plateau);
    let mut shrink = stack("shrink_me", 1_000);
    shrink.series = vec![6_000, 5_000, 4_000, 3_000, 2_000, 1_000];
    shrink.growth_bytes_per_sec = Some(-200.0);
    shrink.trend = Some(Trend::Stable);
    p.stacks.push(shrink);
    p
}

fn render(p: &Profile, flame: Flame) -> String {
    let page = Page {
        target: &p.target,
        flame,
        min_age: None,
        endpoints: ENDPOINTS,
    };
    let mut out = Vec::new();
    write_page(p, &page, &mut out).expect("render the page");
    String::from_utf8(out).expect("UTF-8")
}

/// Every value of `attr="..."` in `html`.
fn attribute_values<'a>(html: &'a str, attr: &str) -> Vec<&'a str> {
    let key = format!(" {attr}=\"");
    html.match_indices(&key)
        .filter_map(|(i, _)| html[i + key.len()..].split('"').next())
        .collect()
}

#[test]
fn without_history_the_page_says_so_and_ranks_by_in_use_bytes() {
    let p = no_history();
    let page = render(&p, Flame::Inuse);
    assert!(page.starts_with("<!DOCTYPE html>"), "{page}");
    assert!(page.contains("no history yet"), "{page}");
    assert!(
        page.contains("<h2>Top stacks by in-use bytes</h2>"),
        "{page}"
    );
    // The table: leak_block first, with its bytes.
    let leak = page.find("58.6 KiB").expect("leak_block's bytes");
    let cache = page.find("19.5 KiB").expect("cache_fill's bytes");
    assert!(leak < cache, "{page}");
    assert!(
        page.contains("<code>leak_block ← main ← _start</code>"),
        "{page}"
    );
    // The in-use flamegraph, inline.
    assert!(
        page.contains("<svg") && page.contains("leak_block"),
        "{page}"
    );
    assert!(page.contains("memtrace-bpf: in-use bytes"), "{page}");
    // Asked for growth without history: it says why and draws in-use bytes.
    let growth = render(&p, Flame::Growth);
    assert!(
        growth.contains("no history yet: the chart and growth need"),
        "{growth}"
    );
    assert!(growth.contains("memtrace-bpf: in-use bytes"), "{growth}");
    // Refreshes itself without a script.
    assert!(page.contains("<meta http-equiv=\"refresh\" content=\"5\">"));
}

#[test]
fn with_history_the_page_charts_totals_and_ranks_by_growth() {
    let p = with_history();
    let page = render(&p, Flame::Inuse);
    assert!(!page.contains("no history yet"), "{page}");
    assert!(page.contains("aria-label=\"total in-use bytes over time\""));
    assert!(page.contains(">5 s<") && page.contains(">30 s<"), "{page}");
    assert!(page.contains("<h2>Top stacks by growth</h2>"), "{page}");
    // leak_block first, then cache_fill; shrink_me does not grow.
    let table = &page[page.find("Top stacks by growth").expect("table")..];
    let leak = table.find("+20.0 KiB/min").expect("leak_block's rate");
    let cache = table.find("+17.6 KiB/min").expect("cache_fill's rate");
    assert!(leak < cache, "{table}");
    assert!(table.contains("<td>growing</td>") && table.contains("<td>plateau</td>"));
    assert!(!table.contains("shrink_me"), "{table}");
    // A sparkline per row, with its range.
    assert_eq!(table.matches("class=\"spark\"").count(), 2, "{table}");
    assert!(
        table.contains("<title>9.8 KiB to 58.6 KiB</title>"),
        "{table}"
    );
    // The growth flamegraph: weighted by bytes per minute, growing stacks only.
    let growth = render(&p, Flame::Growth);
    assert!(
        growth.contains("memtrace-bpf: growth (bytes/min)"),
        "{growth}"
    );
    let flame = &growth[growth.find("<div class=\"flame\">").expect("flame")..];
    let flame = &flame[..flame.find("</div>").expect("end")];
    assert!(flame.contains("leak_block (20,480 bytes/min"), "{flame}");
    assert!(!flame.contains("shrink_me"), "{flame}");
    // The toggle: the current one bold, the other a link.
    assert!(growth.contains("<a href=\"/?flame=inuse\">in-use bytes</a>"));
    assert!(growth.contains("<strong>growth</strong>"));
}

#[test]
fn hostile_names_stay_text() {
    let mut p = with_history();
    let evil = "<script>alert(1)</script><img src=x onerror=alert(2)>\"'&\n\u{202e}x";
    p.stacks[0].frames[0] = frame(evil);
    p.stacks[0].frames[1] = frame("f<[u8; 8]>");
    p.processes[0].program = "</title><script>".to_string();
    p.processes.push(ProcessInfo {
        pid: 8,
        program: "<b>bold</b>".to_string(),
        ..ProcessInfo::default()
    });
    for flame in [Flame::Inuse, Flame::Growth] {
        let page = render(&p, flame);
        let target = Page {
            target: "<i>pid 7</i>",
            flame,
            min_age: None,
            endpoints: ENDPOINTS,
        };
        let mut titled = Vec::new();
        write_page(&p, &target, &mut titled).expect("render");
        let titled = String::from_utf8(titled).expect("UTF-8");
        for page in [&page, &titled] {
            for raw in ["<script", "<img", "<b>", "<i>", "\u{202e}"] {
                assert!(!page.contains(raw), "{raw:?} reached the page:\n{page}");
            }
            assert!(
                page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
                "{page}"
            );
            // The newline and the override are shown, not obeyed.
            assert!(page.contains("\\n\\u{202e}x"), "{page}");
        }
        assert!(titled.contains("<title>memtrace-bpf: &lt;i&gt;pid 7&lt;/i&gt;</title>"));
    }
}

#[test]
fn the_page_fetches_nothing_and_runs_no_script() {
    let page = render(&with_history(), Flame::Growth);
    for attr in ["src", "href", "xlink:href", "action", "data", "background"] {
        for value in attribute_values(&page, attr) {
            assert!(
                value.starts_with('/') && !value.starts_with("//") || value.starts_with('#'),
                "{attr}={value:?} leaves the page"
            );
        }
    }
    let lower = page.to_lowercase();
    for tag in [
        "<script", "<iframe", "<img", "<link", "<object", "<embed", "@import",
    ] {
        assert!(!lower.contains(tag), "{tag} in the page");
    }
    assert!(!has_handler(&lower), "an event handler in the page");
    for url in page.match_indices("url(") {
        assert!(
            page[url.0..].starts_with("url(#"),
            "{}",
            &page[url.0..url.0 + 40]
        );
    }
    // The endpoints, linked.
    for path in ["/", "/debug/pprof/heap", "/flamegraph.svg"] {
        assert!(page.contains(&format!("<a href=\"{path}\">")), "{path}");
    }
}

/// An event handler attribute (`onload=`, `onclick=`...).
fn has_handler(html: &str) -> bool {
    html.match_indices(" on").any(|(i, _)| {
        let rest = &html[i + 3..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphabetic())
            .collect();
        !name.is_empty() && rest[name.len()..].starts_with('=')
    })
}

#[test]
fn a_large_profile_gives_a_bounded_page() {
    let mut p = with_history();
    p.stacks = (0..20_000u64)
        .map(|i| {
            let mut s = stack(&format!("site_{i}_{}", "x".repeat(1000)), 1000 + i);
            s.series = vec![i; 700];
            s.growth_bytes_per_sec = Some(i as f64);
            s.trend = Some(Trend::Growing);
            s
        })
        .collect();
    // The flamegraph draws the 200 largest and sums the rest, so its root
    // is as wide as everything: Σ(1000 + i) bytes, Σ 60·i bytes a minute
    // (i = 0 does not grow).
    for (flame, all, others) in [
        (Flame::Inuse, "all (219,990,000 bytes, 100%)", 19800),
        (Flame::Growth, "all (11,999,400,000 bytes/min, 100%)", 19799),
    ] {
        let page = render(&p, flame);
        assert!(page.contains(all), "{flame:?}: no {all}");
        assert!(page.contains(">[other stacks]<"), "{flame:?}");
        let note = format!("the 200 largest drawn, the other {others} summed as [other stacks]");
        assert!(page.contains(&note), "{flame:?}: no {note}");
        // About 390 KB: 200 flamegraph stacks, 20 table rows.
        assert!(page.len() < 1 << 20, "{} bytes", page.len());
        let table = &page[page.find("Top stacks by growth").expect("table")..];
        assert_eq!(table.matches("<details>").count(), 20);
        // Names are cut in the table.
        assert!(table.contains(&format!("site_19999_{}…", "x".repeat(189))));
    }
}

#[test]
fn a_min_age_page_says_so_and_its_links_keep_it() {
    let mut p = with_history();
    p.min_age_secs = Some(2.5);
    let page = Page {
        target: &p.target,
        flame: Flame::Inuse,
        min_age: Some(2.5),
        endpoints: "/metrics  Prometheus text\n?min_age=SECS  on every endpoint\n",
    };
    let mut out = Vec::new();
    write_page(&p, &page, &mut out).expect("render the page");
    let page = String::from_utf8(out).expect("UTF-8");
    assert!(
        page.contains("in use (blocks live 2.5 s or more): "),
        "{page}"
    );
    assert!(
        page.contains("<a href=\"/?flame=growth&amp;min_age=2.5\">growth</a>"),
        "{page}"
    );
    // The query row is not a link.
    assert!(
        page.contains("<tr><td><code>?min_age=SECS</code></td><td>on every endpoint</td></tr>"),
        "{page}"
    );
    assert!(!page.contains("href=\"\""), "{page}");
}

/// The page's inline flamegraph (between `<div class="flame">` and its end).
fn inline_flame(page: &str) -> &str {
    let flame = &page[page.find("<div class=\"flame\">").expect("flame")..];
    &flame[..flame.find("</div>").expect("end")]
}

#[test]
fn the_growth_flamegraph_draws_exactly_the_stacks_classed_growing() {
    let p = with_history();
    let page = render(&p, Flame::Growth);
    let flame = inline_flame(&page);
    // cache_fill rises (+300 B/s) but the table calls it plateau.
    let table = &page[page.find("Top stacks by growth").expect("table")..];
    assert!(table.contains("<td>plateau</td>") && table.contains("cache_fill"));
    assert!(flame.contains("leak_block"), "{flame}");
    assert!(!flame.contains("cache_fill"), "{flame}");
    assert!(
        page.contains("1 stack classed growing in the table below"),
        "{page}"
    );
    // None classed growing yet: it says so and draws in-use bytes.
    let mut unclassed = with_history();
    for s in &mut unclassed.stacks {
        s.trend = None;
    }
    let page = render(&unclassed, Flame::Growth);
    assert!(page.contains("no stack is classed growing (yet)"), "{page}");
    assert!(page.contains("memtrace-bpf: in-use bytes"), "{page}");
}

#[test]
fn the_inline_flamegraph_has_no_dead_controls_and_a_labelled_root() {
    for (p, flame, root) in [
        (
            no_history(),
            Flame::Inuse,
            ">all (80,000 bytes, 100%)</text>",
        ),
        (
            with_history(),
            Flame::Growth,
            ">all (20,480 bytes/min, 100%)</text>",
        ),
    ] {
        let page = render(&p, flame);
        let svg = inline_flame(&page);
        for dead in [
            "Search",
            "Reset Zoom",
            "id=\"search\"",
            "id=\"matched\"",
            "id=\"details\"",
        ] {
            assert!(
                !svg.contains(dead),
                "{dead} in the inline flamegraph:\n{svg}"
            );
        }
        assert!(svg.contains(root), "no root label {root}:\n{svg}");
        // The title and the frames are still there.
        assert!(
            svg.contains("id=\"title\"") && svg.contains("leak_block"),
            "{svg}"
        );
    }
}

#[test]
fn a_stack_leads_with_the_first_frame_outside_the_allocator() {
    let mut p = no_history();
    p.stacks[0].frames = vec![
        frame("__rust_alloc"),
        frame("alloc::raw_vec::RawVecInner<A>::finish_grow"),
        frame("app::load_config"),
        frame("main"),
    ]
    .into();
    let page = render(&p, Flame::Inuse);
    assert!(
        page.contains("<summary><code>app::load_config ← main (+2 allocator frames)</code>"),
        "{page}"
    );
    // The whole stack is still there on a click.
    assert!(page.contains("<br><code>__rust_alloc</code>"), "{page}");
}
