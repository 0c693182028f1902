//! A target whose names (path, argv, symbol) are hostile, and the check
//! that an output holds no raw control character.

use std::path::PathBuf;

use super::{compile_c, scratch};

/// The symbol name `hostile.c` allocates through, after the test rewrites
/// it: it would clear the screen, retitle the terminal, start a new line,
/// split the frame (';') and pass for a count (" 99").
const PLACEHOLDER: &[u8] = b"hostile_name_placeholder_0123456789";
pub(crate) fn hostile_symbol() -> String {
    let head = "evil\x1b[2J\x1b]0;pwned\x07\nforged;x";
    let tail = " 99";
    let pad = PLACEHOLDER.len() - head.len() - tail.len();
    format!("{head}{}{tail}", "_".repeat(pad))
}

/// A file name with a colour escape and a tab, in a directory with a space.
/// (Not a newline: /proc/PID/maps shows it as `\012`, and the file then
/// cannot be found to name its functions.)
pub(crate) const HOSTILE_FILE: &str = "ho\x1b[31mstile\tprog";

/// `hostile.c` built, its symbol renamed, copied to `DIR with space/FILE`.
pub(crate) fn hostile_program(tag: &str) -> PathBuf {
    let built = compile_c("hostile", tag, &["-O2"]);
    let mut elf = std::fs::read(&built).expect("read built target");
    let symbol = hostile_symbol();
    assert_eq!(symbol.len(), PLACEHOLDER.len());
    let mut found = 0;
    for i in 0..elf.len().saturating_sub(PLACEHOLDER.len()) {
        if &elf[i..i + PLACEHOLDER.len()] == PLACEHOLDER {
            elf[i..i + PLACEHOLDER.len()].copy_from_slice(symbol.as_bytes());
            found += 1;
        }
    }
    assert!(found > 0, "placeholder symbol in {}", built.display());
    let dir = scratch(&format!("hostile {tag}"));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let path = dir.join(HOSTILE_FILE);
    std::fs::write(&path, &elf).expect("write hostile program");
    let mode = std::os::unix::fs::PermissionsExt::from_mode(0o755);
    std::fs::set_permissions(&path, mode).expect("chmod hostile program");
    path
}

/// No control character but the newlines that end lines.
pub(crate) fn assert_no_raw_controls(what: &str, out: &str) {
    let bad: Vec<char> = out
        .chars()
        .filter(|&c| c != '\n' && c.is_control())
        .collect();
    assert!(
        bad.is_empty(),
        "{what}: raw control characters {bad:?} in:\n{out}"
    );
}
