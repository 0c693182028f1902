/// Builds tracer-ebpf for the BPF target (nightly + bpf-linker, installed by
/// `cargo xtask setup`) and leaves the object in OUT_DIR for
/// `include_bytes_aligned!`; then generates the pprof and OTLP profiles
/// message types.
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
    pprof_proto()?;
    otlp_proto()
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
