//! `cordon-policy`: check, identity, diff and explain for cordon policy files.

use clap::Parser;

fn main() -> std::process::ExitCode {
    cordon::exit::no_decision_on_panic();
    let args = cordon_policy::cli::Args::parse();
    cordon_policy::cli::run(
        &args,
        &mut std::io::stdout().lock(),
        &mut std::io::stderr().lock(),
    )
    .into()
}
