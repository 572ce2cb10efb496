//! `cordon-lane`: see the library's [`cordon_lane::cli`]. Started with
//! [`cordon::lease::watchdog::WATCHDOG_ARG`] it is instead a container lease's watchdog.

fn main() -> std::process::ExitCode {
    cordon::lease::watchdog::or_main(cordon_lane::cli::main)
}
