//! `cordon-prebuild`: see the library's [`cordon_prebuild::cli`].

fn main() -> std::process::ExitCode {
    cordon::exit::main(cordon_prebuild::cli::main)
}
