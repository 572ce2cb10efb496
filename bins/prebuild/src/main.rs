//! `cordon-prebuild`: see the library's [`cordon_prebuild::cli`]. Started with
//! [`cordon::lease::watchdog::WATCHDOG_ARG`] it is instead a container lease's watchdog.

fn main() -> std::process::ExitCode {
    cordon::lease::watchdog::or_main(cordon_prebuild::cli::main)
}
