//! `cordon-reap`: see the library's [`cordon_reap::cli`].

fn main() -> std::process::ExitCode {
    let args = <cordon_reap::cli::Args as clap::Parser>::parse();
    cordon_reap::cli::run(
        &args,
        &mut std::io::stdout().lock(),
        &mut std::io::stderr().lock(),
    )
    .into()
}
