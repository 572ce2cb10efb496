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
    let args: Args = cordon_stage::args::parse();
    match cordon_docs::write(&args.out) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // OUT the operator named is not a directory it can write under: theirs to fix (2);
            // anything else could not be done here (3).
            let code = if args.out.exists() && !args.out.is_dir() {
                2
            } else {
                3
            };
            eprintln!(
                "cordon-docs: {}: {e}: name a directory to write under (made if missing)",
                args.out.display()
            );
            std::process::ExitCode::from(code)
        }
    }
}
