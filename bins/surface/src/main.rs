//! `cordon-surface`: see the library's [`cordon_surface::cli`].

fn main() -> std::process::ExitCode {
    cordon::exit::main(cordon_surface::cli::main)
}
