//! `cordon-materialize`: see the library's [`cordon_materialize::cli`]. Started with
//! [`cordon::confine::CHILD_ARG`] it is instead its own confined analysis child.

fn main() -> std::process::ExitCode {
    cordon::exit::main(cordon_materialize::cli::main)
}
