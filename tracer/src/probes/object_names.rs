//! Which of the names user space finds in the BPF object
//! (`tracer_common::names`) the object lacks. Shared with build.rs, which
//! fails the build on any: the BPF side's macros take identifiers, not
//! constants, so the two spellings are kept one by this check. Depends on
//! nothing but `object`, to compile in the build script too.

use object::{Object as _, ObjectSection as _, ObjectSymbol as _, SymbolKind};

/// What kind of item a name is in the object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A map: data in the `maps` or `.maps` section.
    Map,
    /// A read-only global: data in `.rodata`.
    Global,
    /// A program: a function in a program section (not `.text`).
    Program,
}

/// `kind name` of each name not in the object as a global symbol of that
/// kind (all of them when the object does not parse).
pub fn missing(object_bytes: &[u8], names: &[(Kind, &[&str])]) -> Vec<String> {
    let file = object::File::parse(object_bytes).ok();
    let found = |kind: Kind, name: &str| {
        let Some(file) = &file else {
            return false;
        };
        let Some(sym) = file
            .symbols()
            .find(|s| s.is_global() && s.name() == Ok(name))
        else {
            return false;
        };
        let Some(section) = sym
            .section_index()
            .and_then(|i| file.section_by_index(i).ok())
        else {
            return false;
        };
        let section = section.name().unwrap_or_default();
        match kind {
            Kind::Map => {
                sym.kind() == SymbolKind::Data && (section == "maps" || section == ".maps")
            }
            Kind::Global => sym.kind() == SymbolKind::Data && section == ".rodata",
            Kind::Program => sym.kind() == SymbolKind::Text && section != ".text",
        }
    };
    names
        .iter()
        .flat_map(|(kind, names)| names.iter().map(move |n| (*kind, *n)))
        .filter(|(kind, name)| !found(*kind, name))
        .map(|(kind, name)| format!("{} {name}", format!("{kind:?}").to_lowercase()))
        .collect()
}

#[cfg(test)]
mod tests {
    use tracer_common::names::{global, map, program};

    use super::*;
    use crate::probes::loader::bpf_object;

    #[test]
    fn the_object_has_every_name_user_space_finds_in_it() {
        let names: [(Kind, &[&str]); 3] = [
            (Kind::Map, &map::ALL),
            (Kind::Global, &global::ALL),
            (Kind::Program, &program::ALL),
        ];
        assert_eq!(missing(bpf_object(), &names), Vec::<String>::new());
    }

    #[test]
    fn a_name_missing_or_of_another_kind_is_reported() {
        let names: [(Kind, &[&str]); 3] = [
            (Kind::Map, &["LIVE", "NO_SUCH_MAP", "SAMPLE_RATE"]),
            (Kind::Global, &["SAMPLE_RATE", "LIVE"]),
            (
                Kind::Program,
                &["malloc_enter", "memtrace_walk_step", "LIVE"],
            ),
        ];
        assert_eq!(
            missing(bpf_object(), &names),
            [
                "map NO_SUCH_MAP",
                "map SAMPLE_RATE",
                "global LIVE",
                "program memtrace_walk_step",
                "program LIVE"
            ]
        );
        assert_eq!(missing(b"not an ELF", &names[..1]).len(), 3);
    }
}
