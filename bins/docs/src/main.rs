//! `cordon-docs OUT`: write the man pages and completions of every cordon binary under OUT.

use clap::Parser;

/// Write the man pages (`share/man/man1`) and shell completions (bash, fish, zsh) of every
/// cordon binary under OUT.
#[derive(Debug, Parser)]
#[command(name = "cordon-docs", version)]
struct Args {
    /// The directory to write them under (its `share/…` made if missing).
    out: std::path::PathBuf,
}

fn main() -> std::process::ExitCode {
    // `--help`, `--version` and a mistake are clap's (exit 0, 0, 2): never a directory named
    // after an option.
    let args = Args::parse();
    match cordon_docs::write(&args.out) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cordon-docs: {}: {e}", args.out.display());
            std::process::ExitCode::from(3)
        }
    }
}
