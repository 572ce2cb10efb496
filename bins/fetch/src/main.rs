//! `cordon-fetch`: see the library's [`cordon_fetch::cli`].

fn main() -> std::process::ExitCode {
    let args = <cordon_fetch::cli::Args as clap::Parser>::parse();
    cordon_fetch::cli::run(&args, &mut std::io::stdout(), &mut std::io::stderr()).into()
}
