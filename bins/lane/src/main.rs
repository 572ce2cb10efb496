//! `cordon-lane`: see the library's [`cordon_lane::cli`].

fn main() -> std::process::ExitCode {
    let args = <cordon_lane::cli::Args as clap::Parser>::parse();
    cordon_lane::cli::run(
        &args,
        &mut std::io::stdin().lock(),
        &mut std::io::stdout().lock(),
        &mut std::io::stderr().lock(),
    )
    .into()
}
