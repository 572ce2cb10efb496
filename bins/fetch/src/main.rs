//! `cordon-fetch`: see the library's [`cordon_fetch::cli`]. Started with
//! [`cordon::confine::CHILD_ARG`] it is instead its own confined archive parser child.

fn main() -> std::process::ExitCode {
    cordon::exit::main(cordon_fetch::cli::main)
}
