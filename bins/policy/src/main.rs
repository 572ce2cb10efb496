//! `cordon-policy`: check, identity, diff and explain for cordon policy files.

fn main() -> std::process::ExitCode {
    cordon::exit::main(cordon_policy::cli::main)
}
