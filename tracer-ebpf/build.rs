use which::which;

/// Building this crate needs the `bpf-linker` binary, which cargo cannot
/// declare as a dependency: rebuild when it changes. `cargo xtask setup`
/// installs it.
fn main() {
    match which("bpf-linker") {
        Ok(path) => println!("cargo:rerun-if-changed={}", path.display()),
        Err(err) => println!("cargo:warning=bpf-linker not found ({err}): run `cargo xtask setup`"),
    }
}
