//! A profile with its lists of frames held another way: how a saved file,
//! read with each list as written (indices into its frames table), becomes
//! the `Profile` the renderers take. Every struct is taken apart in full,
//! so a field added to one does not compile here until it is carried over.

use std::fmt;

use super::{ExitStackOf, NotFreedAtExitOf, ProfileOf, StackReportOf};

/// Which list of frames a conversion is at, for its errors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FramesAt {
    /// `stacks[i]`.
    Stack(usize),
    /// `not_freed_at_exit.stacks[i]`.
    ExitStack(usize),
}

impl fmt::Display for FramesAt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FramesAt::Stack(i) => write!(f, "stack {i}"),
            FramesAt::ExitStack(i) => write!(f, "not_freed_at_exit stack {i}"),
        }
    }
}

impl<F> ProfileOf<F> {
    /// The same profile with each list of frames converted by `convert`,
    /// the stacks first, then those not freed at exit, each in order.
    pub fn map_frames<G, E>(
        self,
        convert: &mut impl FnMut(F, FramesAt) -> Result<G, E>,
    ) -> Result<ProfileOf<G>, E> {
        let ProfileOf {
            target,
            duration_secs,
            start_unix_ns,
            end_reason,
            sample_rate,
            unwind,
            processes,
            hooks,
            totals,
            stacks,
            not_freed_at_exit,
            losses,
            notes,
            snapshots,
            min_age_secs,
            oom_kills,
            temporary,
            group_by,
            cgroup_memory,
        } = self;
        let stacks = stacks
            .into_iter()
            .enumerate()
            .map(|(i, s)| s.map_frames(|f| convert(f, FramesAt::Stack(i))))
            .collect::<Result<_, E>>()?;
        Ok(ProfileOf {
            target,
            duration_secs,
            start_unix_ns,
            end_reason,
            sample_rate,
            unwind,
            processes,
            hooks,
            totals,
            stacks,
            not_freed_at_exit: not_freed_at_exit.map_frames(convert)?,
            losses,
            notes,
            snapshots,
            min_age_secs,
            oom_kills,
            temporary,
            group_by,
            cgroup_memory,
        })
    }
}

impl<F> StackReportOf<F> {
    fn map_frames<G, E>(
        self,
        convert: impl FnOnce(F) -> Result<G, E>,
    ) -> Result<StackReportOf<G>, E> {
        let StackReportOf {
            pid,
            start_time,
            exited_group,
            counts,
            frames,
            truncated,
            series,
            growth_bytes_per_sec,
            trend,
            temporary,
        } = self;
        Ok(StackReportOf {
            pid,
            start_time,
            exited_group,
            counts,
            frames: convert(frames)?,
            truncated,
            series,
            growth_bytes_per_sec,
            trend,
            temporary,
        })
    }
}

impl<F> NotFreedAtExitOf<F> {
    fn map_frames<G, E>(
        self,
        convert: &mut impl FnMut(F, FramesAt) -> Result<G, E>,
    ) -> Result<NotFreedAtExitOf<G>, E> {
        let NotFreedAtExitOf {
            processes,
            bytes,
            objects,
            stacks,
            stacks_left_out,
        } = self;
        let stacks = stacks
            .into_iter()
            .enumerate()
            .map(|(i, s)| {
                let ExitStackOf {
                    program,
                    processes,
                    bytes,
                    objects,
                    frames,
                    truncated,
                } = s;
                Ok(ExitStackOf {
                    program,
                    processes,
                    bytes,
                    objects,
                    frames: convert(frames, FramesAt::ExitStack(i))?,
                    truncated,
                })
            })
            .collect::<Result<_, E>>()?;
        Ok(NotFreedAtExitOf {
            processes,
            bytes,
            objects,
            stacks,
            stacks_left_out,
        })
    }
}

/// A stack's temporary allocations as the JSON writes them: two fields of
/// the stack, `temporary_objects` and `temporary_bytes`, null when
/// sampling.
pub(super) mod stack_temporary {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use crate::profile::Temporary;

    #[derive(Serialize, Deserialize, Default)]
    #[serde(default)]
    struct Fields {
        temporary_objects: Option<u64>,
        temporary_bytes: Option<u64>,
    }

    #[expect(
        clippy::ref_option,
        reason = "serde's `with` passes the field by reference"
    )]
    pub fn serialize<S: Serializer>(t: &Option<Temporary>, s: S) -> Result<S::Ok, S::Error> {
        Fields {
            temporary_objects: t.map(|t| t.objects),
            temporary_bytes: t.map(|t| t.bytes),
        }
        .serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Temporary>, D::Error> {
        let f = Fields::deserialize(d)?;
        Ok(f.temporary_objects.map(|objects| Temporary {
            objects,
            bytes: f.temporary_bytes.unwrap_or(0),
        }))
    }
}
