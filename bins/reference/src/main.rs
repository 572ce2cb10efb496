//! `cordon-reference`: see the library's [`cordon_reference::cli`].

fn main() -> std::process::ExitCode {
    cordon::exit::main(cordon_reference::cli::main)
}
