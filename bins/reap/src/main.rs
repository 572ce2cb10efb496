//! `cordon-reap`: see the library's [`cordon_reap::cli`].

fn main() -> std::process::ExitCode {
    cordon::exit::main(cordon_reap::cli::main)
}
