//! `cordon-nixfmt [--check] [FILE…]`: format the given .nix files in place (default: every .nix
//! file beneath the current directory), or with `--check` only report those that do not parse
//! or are not formatted. Exit 0 all well, 1 some file is not, 2 an I/O error.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let check = args.first().is_some_and(|a| a == "--check");
    if check {
        args.remove(0);
    }
    let files: Vec<PathBuf> = if args.is_empty() {
        match cordon_nixfmt::nix_files(Path::new(".")) {
            Ok(f) => f,
            Err(e) => {
                eprintln!("cordon-nixfmt: {e}");
                return ExitCode::from(2);
            }
        }
    } else {
        args.into_iter().map(PathBuf::from).collect()
    };
    let mut status = ExitCode::SUCCESS;
    for f in files {
        let text = match std::fs::read_to_string(&f) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("cordon-nixfmt: {}: {e}", f.display());
                return ExitCode::from(2);
            }
        };
        match cordon_nixfmt::format(&f, &text) {
            Err(problem) => {
                eprintln!("{}: {problem:?}", f.display());
                status = ExitCode::from(1);
            }
            Ok(after) if after != text => {
                if check {
                    eprintln!("{}: not formatted", f.display());
                    status = ExitCode::from(1);
                } else if let Err(e) = write(&f, &after) {
                    eprintln!("cordon-nixfmt: {}: {e}", f.display());
                    return ExitCode::from(2);
                }
            }
            Ok(_) => {}
        }
    }
    status
}

/// Replace `f` by a sibling written in full, then renamed over it.
fn write(f: &Path, text: &str) -> std::io::Result<()> {
    let tmp = f.with_extension("nix.cordon-nixfmt");
    std::fs::write(&tmp, text)?;
    std::fs::rename(tmp, f)
}
