//! `cordon-prebuild`: see the library's [`cordon_prebuild::cli`].

fn main() -> std::process::ExitCode {
    let args = <cordon_prebuild::cli::Args as clap::Parser>::parse();
    cordon_prebuild::cli::run(
        &args,
        &mut std::io::stdin().lock(),
        &mut std::io::stdout().lock(),
        &mut std::io::stderr().lock(),
    )
    .into()
}
