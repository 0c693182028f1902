/// Builds tracer-ebpf for the BPF target (nightly + bpf-linker, installed by
/// `cargo xtask setup`) and leaves the object in OUT_DIR for
/// `include_bytes_aligned!`.
fn main() -> anyhow::Result<()> {
    let root_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../tracer-ebpf");
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "tracer-ebpf",
            root_dir,
            ..Default::default()
        }],
        aya_build::Toolchain::default(),
    )
}
