//! The words of the notes on objects without symbols and on debug files
//! fetched from debuginfod servers.

use std::fmt;

use super::counted;

/// "2 objects have frames left [unknown] and no symbols …: A (build id
/// …), B (build id …); …and how to get their debug files".
pub(super) fn without_symbols(
    f: &mut fmt::Formatter<'_>,
    modules: u64,
    listed: &[String],
    debuginfod: bool,
) -> fmt::Result {
    write!(
        f,
        "{} frames left [unknown] and no symbols (stripped, no debug file found): {}",
        counted(modules, "object has", "objects have"),
        listed.join(", ")
    )?;
    let more = modules.saturating_sub(listed.len() as u64);
    if more > 0 {
        write!(f, " and {more} more")?;
    }
    let (its, files, them) = match modules {
        1 => ("its", "file", "it"),
        _ => ("their", "files", "them"),
    };
    write!(
        f,
        "; install {its} debug {files} (Debian: the -dbgsym packages of debian-debug, Fedora: \
         dnf debuginfo-install)"
    )?;
    if !debuginfod {
        write!(
            f,
            ", or set DEBUGINFOD_URLS (https://debuginfod.debian.net) to fetch {them}"
        )?;
    }
    f.write_str(", or trace an unstripped build: docs/debug-files.md")
}

/// "debuginfod: 3 debug files asked for: 1 fetched, 1 not found, …".
pub(super) fn fetches(
    f: &mut fmt::Formatter<'_>,
    (asked, found, not_found): (u64, u64, u64),
    (failed, unfinished, over_cap): (u64, u64, u64),
    example: Option<&str>,
) -> fmt::Result {
    write!(
        f,
        "debuginfod (DEBUGINFOD_URLS): {} asked for, {found} fetched or in the cache",
        counted(asked, "debug file", "debug files"),
    )?;
    if not_found > 0 {
        write!(f, ", {not_found} on no server")?;
    }
    if failed > 0 {
        write!(f, ", {failed} failed")?;
        if let Some(why) = example {
            write!(f, " ({why})")?;
        }
    }
    if unfinished > 0 {
        write!(
            f,
            ", {unfinished} still downloading when the report was made"
        )?;
    }
    if over_cap > 0 {
        write!(
            f,
            "; {} not asked for (at most 64 per trace)",
            counted(over_cap, "object", "objects")
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::profile::Note;

    #[test]
    fn objects_without_symbols_are_listed_up_to_the_bound_and_the_rest_counted() {
        let listed: Vec<String> = (1..=5)
            .map(|i| format!("/bin/p{i} (build id 0{i})"))
            .collect();
        let note = Note::ModulesWithoutSymbols {
            modules: 7,
            listed,
            debuginfod: false,
        }
        .to_string();
        assert!(
            note.starts_with(
                "7 objects have frames left [unknown] and no symbols (stripped, no debug file \
                 found): /bin/p1 (build id 01), /bin/p2 (build id 02), /bin/p3 (build id 03), \
                 /bin/p4 (build id 04), /bin/p5 (build id 05) and 2 more; install their debug \
                 files (Debian: the -dbgsym packages"
            ),
            "{note}"
        );
        assert!(note.contains("set DEBUGINFOD_URLS"), "{note}");
        let one = Note::ModulesWithoutSymbols {
            modules: 1,
            listed: vec!["/bin/p (build id none)".into()],
            debuginfod: true,
        }
        .to_string();
        assert!(one.starts_with("1 object has frames"), "{one}");
        assert!(one.contains("install its debug file ("), "{one}");
        assert!(!one.contains("set DEBUGINFOD_URLS"), "asked already: {one}");
    }

    #[test]
    fn fetches_say_what_became_of_each_and_one_failure() {
        let note = Note::DebuginfodFetches {
            asked: 4,
            found: 1,
            not_found: 1,
            failed: 1,
            unfinished: 1,
            over_cap: 2,
            example: Some("http://s: refused".into()),
        }
        .to_string();
        assert_eq!(
            note,
            "debuginfod (DEBUGINFOD_URLS): 4 debug files asked for, 1 fetched or in the cache, \
             1 on no server, 1 failed (http://s: refused), 1 still downloading when the report \
             was made; 2 objects not asked for (at most 64 per trace)"
        );
    }
}
