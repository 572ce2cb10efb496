//! `cordon-lane`: see the library's [`cordon_lane::cli`].

fn main() -> std::process::ExitCode {
    cordon::exit::main(cordon_lane::cli::main)
}
