//! The repository's Nix files: find them, parse them (rnix, through alejandra) and format them
//! (alejandra, pinned by `Cargo.lock`, so the flake's `formatter` — this crate built by Nix —
//! and the check in the test suite agree byte for byte).
//!
//! Owns: which files are the repository's Nix files and what "formatted" means for them. Writes
//! only when asked to format in place, one file at a time (write a sibling, then rename).

use std::io;
use std::path::{Path, PathBuf};

/// The `.nix` files beneath `root`, sorted, skipping `target/` and dot-directories.
///
/// # Errors
/// A directory could not be read.
pub fn nix_files(root: &Path) -> io::Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            let kind = entry.file_type()?;
            if kind.is_dir() && !name.starts_with('.') && name != "target" {
                dirs.push(entry.path());
            } else if kind.is_file() && name.ends_with(".nix") {
                found.push(entry.path());
            }
        }
    }
    found.sort();
    Ok(found)
}

/// What is wrong with one Nix file.
#[derive(Debug, PartialEq, Eq)]
pub enum Problem {
    /// It does not parse; the parser's first error.
    Syntax(String),
    /// It parses but is not formatted.
    Unformatted,
}

/// `text` formatted, or why it cannot be.
///
/// # Errors
/// The text does not parse.
pub fn format(path: &Path, text: &str) -> Result<String, Problem> {
    match alejandra::format::in_memory(path.display().to_string(), text.to_owned()) {
        (alejandra::format::Status::Error(e), _) => Err(Problem::Syntax(e)),
        (alejandra::format::Status::Changed(_), after) => Ok(after),
    }
}

/// Whether `text` parses and is formatted.
///
/// # Errors
/// It does not parse, or formatting would change it.
pub fn check(path: &Path, text: &str) -> Result<(), Problem> {
    if format(path, text)? == text {
        Ok(())
    } else {
        Err(Problem::Unformatted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_syntax_error_and_an_unformatted_file_are_told_apart() {
        let p = Path::new("x.nix");
        assert!(matches!(check(p, "{ a = ; }"), Err(Problem::Syntax(_))));
        assert_eq!(check(p, "{a=1;}"), Err(Problem::Unformatted));
        let formatted = format(p, "{a=1;}").map_err(|e| format!("{e:?}"));
        assert_eq!(formatted.as_deref(), Ok("{a = 1;}\n"));
        assert_eq!(check(p, "{a = 1;}\n"), Ok(()));
    }

    /// Every .nix file of the repository parses and is formatted (`cordon-nixfmt FILE…`
    /// formats in place; `nix fmt` does the same on a Nix host).
    #[test]
    fn every_nix_file_of_the_repository_parses_and_is_formatted() -> io::Result<()> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let files = nix_files(&root)?;
        assert!(
            files.len() >= 6,
            "expected the flake, the module and the checks: {files:?}"
        );
        let mut bad = Vec::new();
        for f in files {
            let text = std::fs::read_to_string(&f)?;
            if let Err(problem) = check(&f, &text) {
                bad.push(format!("{}: {problem:?}", f.display()));
            }
        }
        assert!(bad.is_empty(), "run cordon-nixfmt on: {bad:#?}");
        Ok(())
    }
}
