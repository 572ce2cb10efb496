//! The man pages and shell completions of every cordon binary, generated from the same clap
//! definitions the binaries parse with, so they cannot drift from the real options, and the
//! JSON Schema of every receipt kind, generated from the receipt types
//! ([`cordon_evidence::schema`]).
//!
//! Owns: the list of documented binaries (a test holds it equal to the workspace's binaries
//! less the worker, which runs only inside the runtime image) and the
//! layout under the output directory. Does not own: any binary's options. Writes only beneath
//! the directory it is given; the Nix package runs it in its install phase and then removes it.

use std::io;
use std::path::Path;

use clap::CommandFactory;
use clap_complete::Shell;

/// Every documented binary with its command definition.
#[must_use]
pub fn commands() -> Vec<clap::Command> {
    vec![
        cordon_fetch::cli::Args::command().name("cordon-fetch"),
        cordon_image::cli::Args::command().name("cordon-image"),
        cordon_lane::cli::Args::command().name("cordon-lane"),
        cordon_materialize::cli::Args::command().name("cordon-materialize"),
        cordon_policy::cli::Args::command().name("cordon-policy"),
        cordon_prebuild::cli::Args::command().name("cordon-prebuild"),
        cordon_reap::cli::Args::command().name("cordon-reap"),
        cordon_reference::cli::Args::command().name("cordon-reference"),
        cordon_surface::cli::Args::command().name("cordon-surface"),
        cordon_verify::cli::Args::command().name("cordon-verify"),
    ]
}

/// The sections clap does not write, appended to each binary's own page: how it ends, what a
/// signal does to it, and the files it reads and writes by default.
fn closing_sections(name: &str) -> String {
    let exit = match name {
        "cordon-policy" => {
            "0: valid, identical, or (diff --fail-on weaken) nothing weakens. 1: diff found a change (with --fail-on weaken: one that weakens containment). 2: a usage or policy error. 3: what it computes could not be established on this host."
        }
        "cordon-verify" | "cordon-image" => {
            "0: verified. 1: something does not verify (the message says what). 2: a usage error or a missing store, file or layout. 3: the host could not establish the check (an unreadable key directory, a store in doubt)."
        }
        _ => {
            "0: ok, the stage established its result and the candidate passed. 1: rejected, the candidate failed a check (the receipt says which). 2: a usage, policy or input-wiring error, reported on stderr (no receipt, except an upstream verdict passed on). 3: no-decision, cordon could not establish the result (the receipt's reasons say why); never a pass or a fail."
        }
    };
    let files = "/etc/cordon/policy.kdl: the policy read without --policy (checks/install.sh or the NixOS module installs it). /var/lib/cordon/images/ROLE: the pinned image layouts read without --images. /var/lib/cordon/store: the policy's default store (receipts, trees, publications, evidence). /var/lib/cordon-keys: the host's receipt-signing key. /run/cordon: per-lease run directories. /run/cordon-locks: executor and GPU locks. /run/cordon-runc: the runtime state root without --state-root.";
    format!(
        ".SH \"EXIT STATUS\"\n{exit}\n.SH SIGNALS\nSIGINT, SIGTERM and SIGHUP stop the candidate and end the stage through its release, with a no-decision receipt naming the signal (exit 3); a second signal does not cut the release short. A panic is a defect in cordon and ends with exit 3.\n.SH FILES\n{files}\n"
    )
}

/// Write `share/man/man1/*.1` (one page per command and subcommand, each binary's own page
/// closed with [`closing_sections`]), the bash, zsh and fish completions and
/// `share/cordon/schemas/<stage>.json` (each receipt kind's JSON Schema) under `out`, which
/// must exist.
///
/// # Errors
/// A directory or file could not be written.
pub fn write(out: &Path) -> io::Result<()> {
    let man = out.join("share/man/man1");
    let shells = [
        (Shell::Bash, "share/bash-completion/completions"),
        (Shell::Zsh, "share/zsh/site-functions"),
        (Shell::Fish, "share/fish/vendor_completions.d"),
    ];
    std::fs::create_dir_all(&man)?;
    for (_, dir) in shells {
        std::fs::create_dir_all(out.join(dir))?;
    }
    let schemas = out.join("share/cordon/schemas");
    std::fs::create_dir_all(&schemas)?;
    // Every stage's receipt, and `cordon-policy identity --json`'s (a `policy` receipt).
    let identity = (
        cordon_evidence::receipt::StageName::Policy,
        cordon_policy::cli::identity_schema(),
    );
    for (stage, schema) in cordon_evidence::schema::receipts()
        .into_iter()
        .chain([identity])
    {
        let text = serde_json::to_string_pretty(&schema).map_err(io::Error::other)?;
        std::fs::write(
            schemas.join(format!("{}.json", stage.as_str())),
            text + "\n",
        )?;
    }
    for mut cmd in commands() {
        let name = cmd.get_name().to_owned();
        clap_mangen::generate_to(cmd.clone(), &man)?;
        let page = man.join(format!("{name}.1"));
        let mut text = std::fs::read_to_string(&page)?;
        text.push_str(&closing_sections(&name));
        std::fs::write(&page, text)?;
        for (shell, dir) in shells {
            clap_complete::generate_to(shell, &mut cmd, &name, out.join(dir))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `[[bin]]` of the workspace but the worker (which runs only inside the runtime
    /// image), this generator and the Nix formatter (developer tools the package does not
    /// install): a binary added without its docs fails here.
    fn workspace_binaries() -> io::Result<Vec<String>> {
        let bins = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut names = Vec::new();
        for entry in std::fs::read_dir(bins)? {
            let manifest = entry?.path().join("Cargo.toml");
            let Ok(text) = std::fs::read_to_string(&manifest) else {
                continue;
            };
            for section in text.split("[[bin]]").skip(1) {
                let name = section
                    .lines()
                    .find_map(|l| l.trim().strip_prefix("name = "))
                    .map(|n| n.trim_matches('"').to_owned());
                names.extend(name);
            }
        }
        names.retain(|n| {
            !matches!(
                n.as_str(),
                "cordon-worker" | "cordon-docs" | "cordon-nixfmt"
            )
        });
        names.sort();
        Ok(names)
    }

    #[test]
    fn every_binary_a_person_runs_is_documented() -> io::Result<()> {
        let mut documented: Vec<String> =
            commands().iter().map(|c| c.get_name().to_owned()).collect();
        documented.sort();
        assert_eq!(documented, workspace_binaries()?);
        Ok(())
    }

    #[test]
    fn pages_and_completions_are_written_for_each() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        write(dir.path())?;
        for stage in [
            "fetch",
            "materialize",
            "prebuild",
            "lane",
            "qualify",
            "reference",
            "verdict",
            "reap",
            "surface",
            "audit",
            "policy",
        ] {
            let text = std::fs::read_to_string(
                dir.path()
                    .join(format!("share/cordon/schemas/{stage}.json")),
            )?;
            let schema: serde_json::Value =
                serde_json::from_str(&text).map_err(io::Error::other)?;
            assert_eq!(schema["properties"]["stage"]["const"], stage, "{text}");
        }
        for cmd in commands() {
            let name = cmd.get_name();
            // roff writes a hyphen as `\\-`.
            let page =
                std::fs::read_to_string(dir.path().join(format!("share/man/man1/{name}.1")))?
                    .replace("\\-", "-");
            assert!(page.contains(".TH"), "{name}.1 is not a man page");
            for section in [".SH \"EXIT STATUS\"", ".SH SIGNALS", ".SH FILES"] {
                assert!(page.contains(section), "{name}.1 has no {section}");
            }
            // A hidden argument is root's wiring between its own processes (`--per-run-state`),
            // never an operator's: the man page leaves it out.
            for long in cmd
                .get_arguments()
                .filter(|a| !a.is_hide_set())
                .filter_map(clap::Arg::get_long)
            {
                assert!(page.contains(long), "{name}.1 does not mention --{long}");
            }
            assert!(
                dir.path()
                    .join(format!("share/bash-completion/completions/{name}.bash"))
                    .is_file()
                    || dir
                        .path()
                        .join(format!("share/bash-completion/completions/{name}"))
                        .is_file()
            );
            assert!(
                dir.path()
                    .join(format!("share/zsh/site-functions/_{name}"))
                    .is_file()
            );
            assert!(
                dir.path()
                    .join(format!("share/fish/vendor_completions.d/{name}.fish"))
                    .is_file()
            );
        }
        Ok(())
    }
}
