//! `cordon-materialize`: see the library's [`cordon_materialize::cli`].

fn main() -> std::process::ExitCode {
    let args = <cordon_materialize::cli::Args as clap::Parser>::parse();
    cordon_materialize::cli::run(
        &args,
        &mut std::io::stdin().lock(),
        &mut std::io::stdout().lock(),
        &mut std::io::stderr().lock(),
    )
    .into()
}
