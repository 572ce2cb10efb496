//! `cordon-image`: see the library's [`cordon_image::cli`].

fn main() -> std::process::ExitCode {
    cordon::exit::no_decision_on_panic();
    let args = <cordon_image::cli::Args as clap::Parser>::parse();
    cordon_image::cli::run(
        &args,
        &mut std::io::stdout().lock(),
        &mut std::io::stderr().lock(),
    )
    .into()
}
