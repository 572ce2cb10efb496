//! `cordon-surface`: see the library's [`cordon_surface::cli`]. Started with
//! [`cordon::lease::watchdog::WATCHDOG_ARG`] it is instead a run's watchdog, and with
//! [`cordon_surface::egress::FORWARD_ARG`] a run's egress forwarder.

fn main() -> std::process::ExitCode {
    // First, while single-threaded: the forwarder joins a user namespace.
    if let Some(code) = cordon_surface::egress::forwarder_requested() {
        return std::process::ExitCode::from(code);
    }
    cordon::lease::watchdog::or_main(cordon_surface::cli::main)
}
