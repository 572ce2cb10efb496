//! `cordon-surface`: see the library's [`cordon_surface::cli`]. Started with
//! [`cordon::lease::watchdog::WATCHDOG_ARG`] it is instead a run's watchdog.

fn main() -> std::process::ExitCode {
    cordon::lease::watchdog::or_main(cordon_surface::cli::main)
}
