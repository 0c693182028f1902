#[path = "src/probes/object_names.rs"]
mod object_names;

/// Builds tracer-ebpf for the BPF target (nightly + bpf-linker, installed by
/// `cargo xtask setup`) and leaves the object in OUT_DIR for
/// `include_bytes_aligned!`, after checking that it defines every name user
/// space finds in it; then generates the pprof and OTLP profiles message
/// types.
fn main() -> anyhow::Result<()> {
    let root_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../tracer-ebpf");
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "tracer-ebpf",
            root_dir,
            ..Default::default()
        }],
        aya_build::Toolchain::default(),
    )?;
    let out_dir = std::env::var("OUT_DIR")?;
    check_names(&std::fs::read(format!("{out_dir}/memtrace"))?)?;
    pprof_proto()?;
    otlp_proto()
}

/// Fails the build when a name of `tracer_common::names` is not in the
/// BPF object as that kind of symbol.
fn check_names(object_bytes: &[u8]) -> anyhow::Result<()> {
    use object_names::Kind;
    use tracer_common::names::{global, map, program};

    let missing = object_names::missing(
        object_bytes,
        &[
            (Kind::Map, &map::ALL),
            (Kind::Global, &global::ALL),
            (Kind::Program, &program::ALL),
        ],
    );
    anyhow::ensure!(
        missing.is_empty(),
        "the BPF object (tracer-ebpf) lacks what tracer_common::names says user space finds \
         in it: {}; rename the item on the BPF side or the constant in \
         tracer-common/src/names.rs",
        missing.join(", ")
    );
    Ok(())
}

/// `perftools.profiles` from the published profile.proto (checked in under
/// proto/), compiled by protox (pure Rust) so the build needs no `protoc`.
fn pprof_proto() -> anyhow::Result<()> {
    println!("cargo:rerun-if-changed=proto/profile.proto");
    let descriptors = protox::compile(["profile.proto"], ["proto"])?;
    prost_build::Config::new().compile_fds(descriptors)?;
    Ok(())
}

/// `opentelemetry.proto.collector.profiles.v1development` and what it
/// imports, from the published .proto files (checked in under
/// proto/opentelemetry, see its README), into one file of nested modules
/// (`otlp.rs`): the generated code names the other packages by relative
/// paths (`super::super::common::v1`).
fn otlp_proto() -> anyhow::Result<()> {
    println!("cargo:rerun-if-changed=proto/opentelemetry");
    let descriptors = protox::compile(
        ["opentelemetry/proto/collector/profiles/v1development/profiles_service.proto"],
        ["proto"],
    )?;
    prost_build::Config::new()
        .include_file("otlp.rs")
        .compile_fds(descriptors)?;
    Ok(())
}
