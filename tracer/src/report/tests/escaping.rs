//! Every string a traced process controls, escaped in the text, collapsed
//! and flamegraph reports.

use super::*;

#[test]
fn text_escapes_every_target_controlled_string() {
    let p = hostile();
    let out = String::from_utf8(text(&p, 10)).expect("UTF-8");
    assert_no_raw_controls(&out);
    assert!(
        out.contains("ev\\x1b]0;owned\\x07il\\n#1  999 bytes"),
        "{out}"
    );
    assert!(out.contains("\\u{9b}2J"), "{out}");
    // No line was forged: every stack summary line is one of ours.
    let summaries = out.lines().filter(|l| l.starts_with('#')).count();
    let at_exit = p.not_freed_at_exit.stacks.len();
    let inuse = p.stacks.iter().filter(|s| s.counts.inuse_bytes > 0).count();
    assert_eq!(summaries, inuse.min(10) + at_exit, "{out}");
    assert!(out.contains("by 2 processes of ev\\x1b]0;owned"), "{out}");
}

#[test]
fn collapsed_escapes_names_and_keeps_one_line_per_stack() {
    let p = hostile();
    let out = String::from_utf8(collapsed(&p, View::AllocObjects)).expect("UTF-8");
    assert_no_raw_controls(&out);
    let expected = p
        .stacks
        .iter()
        .filter(|s| s.counts.alloc_objects > 0)
        .count();
    // Stacks may merge, never split.
    assert!(out.lines().count() <= expected, "{out}");
    for line in out.lines() {
        let (_, value) = line.rsplit_once(' ').expect("stack VALUE");
        value.parse::<u64>().expect("count after the last space");
        let (_, before) = line[..line.len() - value.len() - 1]
            .rsplit_once(' ')
            .unwrap_or(("", "x"));
        assert!(
            before.parse::<f64>().is_err(),
            "reads as differential: {line}"
        );
    }
    // The process root frame keeps the program's path whole.
    assert!(
        out.contains("ev\\x1b]0:owned\\x07il\\n#1  999 bytes <&> \\u{9b}2J (pid 101);"),
        "{out}"
    );
    assert!(out.contains(";leaf:ev\\x1b]0:owned"), "{out}");
}

#[test]
fn flamegraph_of_hostile_names_is_well_formed_xml() {
    let svg = flamegraph(&hostile(), View::AllocSpace);
    assert_no_raw_controls(&svg);
    assert!(svg.contains("&lt;&amp;&gt;"), "XML metacharacters escaped");
    assert!(!svg.contains("<&>"));
}
