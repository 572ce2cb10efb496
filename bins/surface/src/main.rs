//! `cordon-surface`: see the library's [`cordon_surface::cli`].

fn main() -> std::process::ExitCode {
    let args = <cordon_surface::cli::Args as clap::Parser>::parse();
    cordon_surface::cli::run(
        &args,
        &mut std::io::stdout().lock(),
        &mut std::io::stderr().lock(),
    )
    .into()
}
