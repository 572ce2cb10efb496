//! `cordon-verify`: see the library's [`cordon_verify::cli`].

fn main() -> std::process::ExitCode {
    let args = <cordon_verify::cli::Args as clap::Parser>::parse();
    cordon_verify::cli::run(
        &args,
        &mut std::io::stdout().lock(),
        &mut std::io::stderr().lock(),
    )
    .into()
}
