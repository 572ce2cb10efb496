//! `cordon-reference`: see the library's [`cordon_reference::cli`]. Started with
//! [`cordon::lease::watchdog::WATCHDOG_ARG`] it is instead a container lease's watchdog.

fn main() -> std::process::ExitCode {
    cordon::lease::watchdog::or_main(cordon_reference::cli::main)
}
