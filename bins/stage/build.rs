//! Records the commit this build is of, for every binary's `--version`: `CORDON_COMMIT` when
//! the builder sets it (the Nix flake does: a Nix build has no `.git`), else the checkout's
//! `git rev-parse --short=12 HEAD`, else `unknown`.

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=CORDON_COMMIT");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let git = root.join(".git");
    // Rebuilt when the checkout moves to another commit (only files that exist: a missing one
    // would rerun this on every build).
    let mut watched = vec![git.join("HEAD"), git.join("packed-refs")];
    if let Ok(head) = std::fs::read_to_string(git.join("HEAD"))
        && let Some(branch) = head.strip_prefix("ref: ")
    {
        watched.push(git.join(branch.trim()));
    }
    for f in watched.iter().filter(|f| f.exists()) {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    let commit = std::env::var("CORDON_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| {
            let out = Command::new("git")
                .arg("-C")
                .arg(&root)
                .args(["rev-parse", "--short=12", "HEAD"])
                .output()
                .ok()?;
            out.status
                .success()
                .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=CORDON_COMMIT={commit}");
}
