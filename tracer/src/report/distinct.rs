//! Stacks that would print identically: the same functions through
//! different call sites of one function (without line information, or on
//! one line). Where their frames' addresses differ is what tells them
//! apart, and the text report shows those addresses.

use std::{collections::HashMap, sync::Arc};

use super::{Frame, StackReport};

/// What a stack prints as: its process, group, frame lines and whether it
/// is cut short.
type Look<'a> = (u32, Option<&'a str>, Vec<String>, bool);

/// For each stack of `stacks` (by index), the frames (by index) whose
/// address must be shown: empty for a stack that prints unlike any other.
/// `shown(frame)` is how a frame prints.
pub fn addresses_to_show(
    stacks: &[&StackReport],
    shown: impl Fn(&Frame) -> String,
) -> Vec<Vec<bool>> {
    let mut groups: HashMap<Look<'_>, Vec<usize>> = HashMap::new();
    for (i, s) in stacks.iter().enumerate() {
        let lines = s.frames.iter().map(|f| shown(f)).collect();
        let key = (s.pid, s.exited_group.as_deref(), lines, s.truncated);
        groups.entry(key).or_default().push(i);
    }
    let mut marks = vec![Vec::new(); stacks.len()];
    for members in groups.values().filter(|m| m.len() > 1) {
        let frames: Vec<&[Arc<Frame>]> = members.iter().map(|&i| &*stacks[i].frames).collect();
        let differs: Vec<bool> = (0..frames[0].len())
            .map(|at| frames.iter().any(|f| f[at].offset != frames[0][at].offset))
            .collect();
        for &i in members {
            marks[i].clone_from(&differs);
        }
    }
    marks
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stack(pid: u32, frames: &[(&str, u64)]) -> StackReport {
        StackReport {
            pid,
            frames: frames
                .iter()
                .map(|&(function, offset)| {
                    Arc::new(Frame {
                        function: function.into(),
                        offset,
                        ..Frame::default()
                    })
                })
                .collect(),
            ..StackReport::default()
        }
    }

    #[test]
    fn only_the_frames_that_differ_in_look_alike_stacks_are_marked() {
        let a = stack(1, &[("leaf", 0x10), ("main", 0x100)]);
        let b = stack(1, &[("leaf", 0x10), ("main", 0x120)]);
        let c = stack(1, &[("other", 0x30), ("main", 0x100)]);
        let d = stack(2, &[("leaf", 0x10), ("main", 0x140)]);
        let marks = addresses_to_show(&[&a, &b, &c, &d], |f| f.function.clone());
        assert_eq!(marks[0], [false, true]);
        assert_eq!(marks[1], [false, true]);
        assert!(marks[2].is_empty() && marks[3].is_empty());
    }
}
