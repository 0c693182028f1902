//! What the live page's two halves share: the page's request, the
//! stacks it ranks, and HTML escaping. Below page.rs and page_flame.rs,
//! so that neither imports the other's internals.

use crate::report::{Profile, StackReport};

/// Which flamegraph the page draws.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flame {
    /// In-use bytes now.
    Inuse,
    /// Each stack's positive growth rate over the history.
    Growth,
}

impl Flame {
    /// `?flame=` values.
    pub fn parse(text: &str) -> Option<Flame> {
        match text {
            "inuse" => Some(Flame::Inuse),
            "growth" => Some(Flame::Growth),
            _ => None,
        }
    }
}

/// What the page shows.
pub struct Page<'a> {
    /// What is traced, as the user named it.
    pub target: &'a str,
    pub flame: Flame,
    /// The page's `?min_age=`, kept by its own links.
    pub min_age: Option<f64>,
    /// The server's endpoints, one `PATH  description` per line.
    pub endpoints: &'a str,
}

/// Why there is no chart or growth yet.
/// (The history is taken every --interval seconds, or on --serve's own
/// tick: both are the trace's business, not the page's.)
pub const NO_HISTORY: &str = "no history yet: the chart and growth need two snapshots of the \
                          heap's history or more (see --interval)";

pub fn has_growth(p: &Profile) -> bool {
    p.stacks.iter().any(|s| s.growth_bytes_per_sec.is_some())
}

/// The stacks holding memory, most first.
pub fn by_inuse(p: &Profile) -> Vec<&StackReport> {
    let mut stacks: Vec<&StackReport> = p
        .stacks
        .iter()
        .filter(|s| s.counts.inuse_bytes > 0)
        .collect();
    stacks.sort_by_key(|s| std::cmp::Reverse(s.counts.inuse_bytes));
    stacks
}

/// Stacks with a positive growth rate, fastest first, at most `n`.
pub fn top_growing(p: &Profile, n: usize) -> Vec<(&StackReport, f64)> {
    let mut growing: Vec<(&StackReport, f64)> = p
        .stacks
        .iter()
        .filter_map(|s| s.growth_bytes_per_sec.map(|g| (s, g)))
        .filter(|(_, g)| *g > 0.0)
        .collect();
    growing.sort_by(|a, b| b.1.total_cmp(&a.1));
    growing.truncate(n);
    growing
}

/// `s` safe as HTML text or a quoted attribute value: controls and
/// reordering characters made visible first (`escape::text`), then the
/// five characters HTML gives meaning to.
pub fn html(s: &str) -> String {
    let visible = crate::escape::text(s);
    let mut out = String::with_capacity(visible.len());
    for c in visible.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}
