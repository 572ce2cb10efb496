//! The `cordon-image` command.
//!
//! - `cordon-image build SPEC --out DIR`: write the layout, print the manifest digest.
//! - `cordon-image verify DIR sha256:M`: check every digest and diff_id.
//! - `cordon-image unpack --store S DIR sha256:M`: verify, then unpack into the store's image
//!   cache; prints the root filesystem's path.
//!
//! Exit codes: 0 ok; 2 usage or spec error; 3 the layout is not the pinned image, or the store
//! or the filesystem failed (an image cordon cannot establish is a no-decision).

use std::io::Write;
use std::path::PathBuf;
use std::str::FromStr;

use clap::{Parser, Subcommand};
use cordon::ExitCode;
use cordon::canonical::Digest;
use cordon::image;
use cordon::store::Store;
use cordon_stage::args::{Diagnostics, report_diagnostic};
use miette::Diagnostic;

use crate::spec;

/// Build, verify and unpack OCI image layouts.
#[derive(Debug, Parser)]
#[command(name = "cordon-image", version, about)]
pub struct Args {
    /// How errors are printed on stderr.
    #[arg(long, value_enum, default_value_t = Diagnostics::Text, global = true)]
    pub diagnostics: Diagnostics,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Build a layout from a spec.
    Build {
        /// The spec (KDL).
        spec: PathBuf,
        /// The layout directory to create.
        #[arg(long)]
        out: PathBuf,
    },
    /// Verify a layout against a pinned manifest digest.
    Verify {
        /// The layout directory.
        dir: PathBuf,
        /// The pinned manifest digest.
        manifest: String,
    },
    /// Verify and unpack a layout into the store's read-only image cache.
    Unpack {
        /// The store directory.
        #[arg(long)]
        store: PathBuf,
        /// The layout directory.
        dir: PathBuf,
        /// The pinned manifest digest.
        manifest: String,
    },
}

/// An error of `verify` or `unpack` with its exit code: a layout path that holds nothing is the
/// operator's (2); anything else about the layout or the store could not be established (3).
fn layout_error(e: image::ImageError) -> (Box<dyn Diagnostic>, ExitCode) {
    let code = if matches!(e, image::ImageError::Missing { .. }) {
        ExitCode::Usage
    } else {
        ExitCode::NoDecision
    };
    (Box::new(e), code)
}

/// Run the tool: the whole of `main`.
pub fn run(args: &Args, stdout: &mut dyn Write, stderr: &mut dyn Write) -> ExitCode {
    let digest = |s: &str| Digest::from_str(s);
    let result: Result<String, (Box<dyn Diagnostic>, ExitCode)> = match &args.command {
        Command::Build { spec: path, out } => spec::load(path)
            .map_err(|e| (Box::new(e) as Box<dyn Diagnostic>, ExitCode::Usage))
            .and_then(|s| {
                image::build(&s, out)
                    .map(|d| d.to_string())
                    .map_err(|e| (Box::new(e) as Box<dyn Diagnostic>, ExitCode::Usage))
            }),
        Command::Verify { dir, manifest } => match digest(manifest) {
            Err(e) => Err((Box::new(e), ExitCode::Usage)),
            Ok(m) => image::verify(dir, &m)
                .map(|v| format!("ok {}", v.manifest))
                .map_err(layout_error),
        },
        Command::Unpack {
            store,
            dir,
            manifest,
        } => match digest(manifest) {
            Err(e) => Err((Box::new(e), ExitCode::Usage)),
            // A layout path that holds nothing is the operator's typo: said before a store
            // is made for it.
            Ok(_) if !dir.exists() => Err(layout_error(image::ImageError::Missing {
                dir: dir.clone(),
            })),
            Ok(m) => Store::open(store)
                .map_err(image::ImageError::from)
                .and_then(|s| image::unpack(&s, dir, &m))
                .map(|p| p.display().to_string())
                .map_err(layout_error),
        },
    };
    match result {
        Ok(line) => match writeln!(stdout, "{line}") {
            Ok(()) => ExitCode::Ok,
            Err(_) => ExitCode::NoDecision,
        },
        Err((e, code)) => {
            report_diagnostic(e.as_ref(), args.diagnostics, stderr);
            code
        }
    }
}

/// The whole of `cordon-image`'s `main` (which installs the panic hook first, through
/// `cordon::exit::main`): parse the arguments, run, the exit code.
#[must_use]
pub fn main() -> ExitCode {
    cordon::exit::with_stdio(cordon_stage::args::parse::<Args>, run)
}
