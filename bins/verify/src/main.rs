//! `cordon-verify`: see the library's [`cordon_verify::cli`].

fn main() -> std::process::ExitCode {
    cordon::exit::main(cordon_verify::cli::main)
}
