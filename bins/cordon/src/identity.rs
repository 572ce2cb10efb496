//! Assembly of the authority identity (brief §5).
//!
//! The authority identity is the domain-separated digest of {policy digest, the OCI runtime
//! binary's digest and `--version` text, the pinned image digests, the digests of the cordon
//! binaries installed beside the running one}. It is stamped on every receipt; a stage refuses
//! an input receipt of another authority.
//!
//! This module probes the host for the runtime and binary components and combines them. It does
//! not compute the policy digest (the policy crate does, through [`crate::canonical`]) and does
//! not decide whether a runtime version is new enough (the runtime driver does).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::canonical::{CanonicalError, Digest, domain_digest};
use crate::exit::ExitCode;
use crate::host::{Host, Tool};

/// The binaries whose digests enter the identity when installed beside the running one.
pub const CORDON_BINARIES: [&str; 9] = [
    "cordon-fetch",
    "cordon-image",
    "cordon-lane",
    "cordon-materialize",
    "cordon-policy",
    "cordon-prebuild",
    "cordon-reap",
    "cordon-reference",
    "cordon-surface",
];

/// How long `RUNTIME --version` may take before the runtime counts as broken.
const VERSION_DEADLINE: Duration = Duration::from_secs(10);

/// The most `--version` output kept; a runtime printing more is not a runtime we trust.
const VERSION_MAX_BYTES: u64 = 4096;

/// Why a component of the identity could not be established. Every variant is a no-decision:
/// without its identity a stage has no authority to decide anything.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum IdentityError {
    /// The runtime binary is not at the policy's path.
    #[error("oci runtime not found at {path}")]
    #[diagnostic(
        code(cordon::identity::runtime_missing),
        help(
            "install the runtime (Debian: apt-get install runc) or fix `runtime path=` in the policy"
        )
    )]
    RuntimeMissing {
        /// The policy's runtime path.
        path: PathBuf,
    },
    /// The runtime binary exists but could not be hashed.
    #[error("cannot hash the oci runtime")]
    #[diagnostic(code(cordon::identity::runtime_unreadable))]
    RuntimeUnreadable {
        /// The hashing error.
        #[source]
        source: CanonicalError,
    },
    /// The runtime's digest differs from the policy's pin.
    #[error("oci runtime {path} has digest {found}, the policy pins {pinned}")]
    #[diagnostic(
        code(cordon::identity::runtime_pin),
        help("a changed runtime is a new authority: review it and update `runtime sha256=`")
    )]
    RuntimePinMismatch {
        /// The runtime path.
        path: PathBuf,
        /// The digest the policy pins.
        pinned: Digest,
        /// The digest found on disk.
        found: Digest,
    },
    /// `RUNTIME --version` could not be run or failed.
    #[error("`{path} --version` failed: {detail}")]
    #[diagnostic(code(cordon::identity::runtime_version))]
    RuntimeVersion {
        /// The runtime path.
        path: PathBuf,
        /// What went wrong.
        detail: String,
    },
    /// The running executable's directory could not be listed or a binary hashed.
    #[error("cannot hash the cordon binaries beside {exe}")]
    #[diagnostic(code(cordon::identity::binaries))]
    Binaries {
        /// The running executable.
        exe: PathBuf,
        /// The underlying error.
        #[source]
        source: CanonicalError,
    },
    /// Some of the cordon binaries are installed beside the running one, not all.
    #[error("a partial install: {missing} missing from {dir}")]
    #[diagnostic(
        code(cordon::identity::partial_install),
        help(
            "the authority counts every cordon binary: install them all side by side (cargo build --workspace --release, or the Nix package), never a subset"
        )
    )]
    PartialInstall {
        /// The directory of the running executable.
        dir: PathBuf,
        /// The binaries not there.
        missing: String,
    },
    /// The running executable's own path is unknown.
    #[error("cannot find the running executable")]
    #[diagnostic(code(cordon::identity::current_exe))]
    CurrentExe {
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The components could not be encoded.
    #[error("identity components cannot be encoded")]
    #[diagnostic(code(cordon::identity::encode))]
    Encode {
        /// The encoder's error.
        #[source]
        source: CanonicalError,
    },
}

impl crate::exit::ExitClass for IdentityError {
    /// Always a no-decision: the authority could not be established.
    fn exit_class(&self) -> ExitCode {
        ExitCode::NoDecision
    }
}

/// What the identity records of the OCI runtime.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RuntimeFacts {
    /// `runc`, `crun` or `runsc`.
    pub kind: String,
    /// The absolute path from the policy.
    pub path: PathBuf,
    /// The binary's digest.
    pub sha256: Digest,
    /// The trimmed output of `RUNTIME --version`.
    pub version: String,
}

/// Everything the authority identity is made of.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AuthorityComponents {
    /// The policy's canonical digest.
    pub policy: Digest,
    /// The OCI runtime.
    pub runtime: RuntimeFacts,
    /// Image role → pinned manifest digest, from the policy.
    pub images: BTreeMap<String, Digest>,
    /// Binary name → digest, for each of [`CORDON_BINARIES`] installed beside the running one
    /// (and the running executable as `(running) NAME` when it is none of them).
    pub binaries: BTreeMap<String, Digest>,
}

impl AuthorityComponents {
    /// Each part that differs between `self` (a receipt's authority) and `now` (this run's),
    /// one line each: `policy`, `runtime` (its path, bytes or version), an image role, a
    /// binary — what an operator changed between the two.
    #[must_use]
    pub fn differs(&self, now: &Self) -> Vec<String> {
        let mut out = Vec::new();
        let mut part = |what: String, a: &dyn std::fmt::Display, b: &dyn std::fmt::Display| {
            out.push(format!("{what}: {a} → {b}"));
        };
        if self.policy != now.policy {
            part("the policy".into(), &self.policy, &now.policy);
        }
        let (ra, rb) = (&self.runtime, &now.runtime);
        if ra.kind != rb.kind || ra.path != rb.path {
            part(
                "the runtime".into(),
                &format!("{} {}", ra.kind, ra.path.display()),
                &format!("{} {}", rb.kind, rb.path.display()),
            );
        }
        if ra.sha256 != rb.sha256 {
            part("the runtime's bytes".into(), &ra.sha256, &rb.sha256);
        }
        if ra.version != rb.version {
            part("the runtime's version".into(), &ra.version, &rb.version);
        }
        let shown = |d: Option<&Digest>| d.map_or_else(|| "(none)".to_owned(), ToString::to_string);
        for (what, a, b) in [
            ("the image", &self.images, &now.images),
            ("the binary", &self.binaries, &now.binaries),
        ] {
            let names: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for name in names {
                let (x, y) = (a.get(name), b.get(name));
                if x != y {
                    part(format!("{what} {name}"), &shown(x), &shown(y));
                }
            }
        }
        out
    }

    /// The authority identity.
    ///
    /// # Errors
    /// [`IdentityError::Encode`] (cannot happen for these types, but the encoder is fallible).
    pub fn authority(&self) -> Result<Digest, IdentityError> {
        domain_digest("cordon.authority", 1, self)
            .map_err(|source| IdentityError::Encode { source })
    }
}

/// Hash the runtime binary, check it against the policy's pin, and read its version.
///
/// # Errors
/// An [`IdentityError`] for a missing, unreadable, mismatching or failing runtime.
pub fn probe_runtime(
    host: &dyn Host,
    kind: &str,
    path: &Path,
    pin: Option<&Digest>,
) -> Result<RuntimeFacts, IdentityError> {
    // Through the seam: the bytes hashed are the bytes the host has.
    let sha256 = match host.digest(path) {
        Ok(digest) => digest,
        Err(source) if source.kind() == std::io::ErrorKind::NotFound => {
            return Err(IdentityError::RuntimeMissing {
                path: path.to_path_buf(),
            });
        }
        Err(source) => {
            return Err(IdentityError::RuntimeUnreadable {
                source: CanonicalError::ReadFile {
                    path: path.to_path_buf(),
                    source,
                },
            });
        }
    };
    if let Some(pinned) = pin
        && *pinned != sha256
    {
        return Err(IdentityError::RuntimePinMismatch {
            path: path.to_path_buf(),
            pinned: *pinned,
            found: sha256,
        });
    }
    let version = runtime_version(host, path)?;
    Ok(RuntimeFacts {
        kind: kind.to_owned(),
        path: path.to_path_buf(),
        sha256,
        version,
    })
}

fn runtime_version(host: &dyn Host, path: &Path) -> Result<String, IdentityError> {
    let fail = |detail: String| IdentityError::RuntimeVersion {
        path: path.to_path_buf(),
        detail,
    };
    // Through the seam: no environment but PATH, no stdin, bounded in time and output.
    let mut tool = Tool::new(path, &["--version"]);
    tool.timeout = VERSION_DEADLINE;
    tool.max_output = VERSION_MAX_BYTES;
    let out = host.run(&tool).map_err(|e| fail(e.to_string()))?;
    if out.truncated {
        return Err(fail(format!("printed more than {VERSION_MAX_BYTES} bytes")));
    }
    if !out.success() {
        return Err(fail(format!("exited with {:?}", out.code)));
    }
    let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if text.is_empty() {
        return Err(fail("printed no version".to_owned()));
    }
    Ok(text)
}

/// Hash each of [`CORDON_BINARIES`] in the directory of `exe`, through the seam. An
/// installation is whole or refused: once one of them is there, every one must be, or the
/// authority would be computed over a different set of binaries than the reviewed one's
/// (a directory holding none of them is a test or tool binary's, and counts none). One that
/// is there but cannot be read is an error, never left out. A running executable that is not
/// one of them by name (a renamed copy, a test binary) is hashed too, as `(running) NAME`: the
/// code that makes a receipt is always part of the authority it is made under.
///
/// # Errors
/// [`IdentityError::Binaries`] when a present binary cannot be read,
/// [`IdentityError::PartialInstall`] when some are missing.
pub fn cordon_binaries(
    host: &dyn Host,
    exe: &Path,
) -> Result<BTreeMap<String, Digest>, IdentityError> {
    let dir = exe.parent().unwrap_or_else(|| Path::new("/"));
    let mut out = BTreeMap::new();
    let mut missing = Vec::new();
    for name in CORDON_BINARIES {
        let path = dir.join(name);
        match host.digest(&path) {
            Ok(digest) => {
                out.insert(name.to_owned(), digest);
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => missing.push(name),
            Err(source) => {
                return Err(IdentityError::Binaries {
                    exe: exe.to_path_buf(),
                    source: CanonicalError::ReadFile { path, source },
                });
            }
        }
    }
    if !out.is_empty() && !missing.is_empty() {
        return Err(IdentityError::PartialInstall {
            dir: dir.to_path_buf(),
            missing: missing.join(", "),
        });
    }
    let name = exe
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if !CORDON_BINARIES.contains(&name.as_str()) {
        let digest = host.digest(exe).map_err(|source| IdentityError::Binaries {
            exe: exe.to_path_buf(),
            source: CanonicalError::ReadFile {
                path: exe.to_path_buf(),
                source,
            },
        })?;
        out.insert(format!("(running) {name}"), digest);
    }
    Ok(out)
}

/// [`cordon_binaries`] for the running executable.
///
/// # Errors
/// [`IdentityError::CurrentExe`] or [`IdentityError::Binaries`].
pub fn installed_binaries(host: &dyn Host) -> Result<BTreeMap<String, Digest>, IdentityError> {
    let exe = std::env::current_exe().map_err(|source| IdentityError::CurrentExe { source })?;
    cordon_binaries(host, &exe)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exit::ExitClass;
    use std::os::unix::fs::PermissionsExt;

    fn fake_runtime(dir: &Path, script: &str) -> PathBuf {
        let path = dir.join("runc");
        std::fs::write(&path, format!("#!/bin/sh\n{script}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    #[test]
    fn runtime_is_hashed_versioned_and_pinned() {
        let dir = tempfile::tempdir().unwrap();
        let path = fake_runtime(dir.path(), "echo 'runc version 9.9'");
        let facts = probe_runtime(&crate::host::Linux, "runc", &path, None).unwrap();
        assert_eq!(facts.version, "runc version 9.9");
        assert_eq!(facts.sha256, Digest::of_file(&path).unwrap());
        probe_runtime(&crate::host::Linux, "runc", &path, Some(&facts.sha256)).unwrap();
        let wrong = Digest::of_bytes(b"other");
        assert!(matches!(
            probe_runtime(&crate::host::Linux, "runc", &path, Some(&wrong)),
            Err(IdentityError::RuntimePinMismatch { .. })
        ));
    }

    #[test]
    fn missing_or_failing_runtime_is_no_decision() {
        let dir = tempfile::tempdir().unwrap();
        let err = probe_runtime(
            &crate::host::Linux,
            "runc",
            &dir.path().join("absent"),
            None,
        )
        .unwrap_err();
        assert!(matches!(err, IdentityError::RuntimeMissing { .. }));
        assert_eq!(err.exit_class(), ExitCode::NoDecision);
        let path = fake_runtime(dir.path(), "exit 4");
        assert!(matches!(
            probe_runtime(&crate::host::Linux, "runc", &path, None),
            Err(IdentityError::RuntimeVersion { .. })
        ));
    }

    #[test]
    fn runtime_does_not_inherit_the_environment() {
        let dir = tempfile::tempdir().unwrap();
        let path = fake_runtime(dir.path(), "echo \"v ${HOME:-none}\"");
        assert_eq!(
            probe_runtime(&crate::host::Linux, "runc", &path, None)
                .unwrap()
                .version,
            "v none"
        );
    }

    #[test]
    fn every_component_moves_the_identity() {
        let base = AuthorityComponents {
            policy: Digest::of_bytes(b"p"),
            runtime: RuntimeFacts {
                kind: "runc".into(),
                path: "/usr/sbin/runc".into(),
                sha256: Digest::of_bytes(b"r"),
                version: "1".into(),
            },
            images: BTreeMap::from([("prebuild".into(), Digest::of_bytes(b"i"))]),
            binaries: BTreeMap::from([("cordon-policy".into(), Digest::of_bytes(b"b"))]),
        };
        let id = base.authority().unwrap();
        let mut v = base.clone();
        v.policy = Digest::of_bytes(b"p2");
        assert_ne!(v.authority().unwrap(), id);
        let mut v = base.clone();
        v.runtime.version = "2".into();
        assert_ne!(v.authority().unwrap(), id);
        let mut v = base.clone();
        v.images.insert("lane".into(), Digest::of_bytes(b"j"));
        assert_ne!(v.authority().unwrap(), id);
        let mut v = base.clone();
        v.binaries
            .insert("cordon-reap".into(), Digest::of_bytes(b"c"));
        assert_ne!(v.authority().unwrap(), id);
        assert_eq!(base.clone().authority().unwrap(), id);

        // What an operator changed is named part by part, and nothing else.
        assert!(base.differs(&base).is_empty());
        let mut v = base.clone();
        v.runtime.version = "2".into();
        v.images.insert("prebuild".into(), Digest::of_bytes(b"i2"));
        v.binaries.remove("cordon-policy");
        let differs = base.differs(&v);
        assert_eq!(differs.len(), 3, "{differs:?}");
        assert_eq!(differs[0], "the runtime's version: 1 → 2");
        assert!(
            differs[1].starts_with("the image prebuild: sha256:"),
            "{differs:?}"
        );
        assert!(
            differs[2].starts_with("the binary cordon-policy: sha256:")
                && differs[2].ends_with(" → (none)"),
            "{differs:?}"
        );
    }

    #[test]
    fn only_known_binaries_beside_exe_are_hashed() {
        let dir = tempfile::tempdir().unwrap();
        for name in CORDON_BINARIES {
            std::fs::write(dir.path().join(name), name).unwrap();
        }
        std::fs::write(dir.path().join("unrelated"), b"z").unwrap();
        let got = cordon_binaries(&crate::host::Linux, &dir.path().join("cordon-policy")).unwrap();
        assert_eq!(
            got.keys().map(String::as_str).collect::<Vec<_>>(),
            CORDON_BINARIES
        );
        assert_eq!(got["cordon-fetch"], Digest::of_bytes(b"cordon-fetch"));
        // A directory holding none of them (a test's, a tool's) counts none of them, but the
        // running executable itself.
        let empty = tempfile::tempdir().unwrap();
        std::fs::write(empty.path().join("a-test"), b"t").unwrap();
        let alone = cordon_binaries(&crate::host::Linux, &empty.path().join("a-test")).unwrap();
        assert_eq!(
            alone,
            BTreeMap::from([("(running) a-test".to_owned(), Digest::of_bytes(b"t"))])
        );
        // A renamed copy run beside a whole install is counted beside it: its bytes may be
        // anything.
        std::fs::write(dir.path().join("reap"), b"renamed").unwrap();
        let renamed = cordon_binaries(&crate::host::Linux, &dir.path().join("reap")).unwrap();
        assert_eq!(renamed.len(), CORDON_BINARIES.len() + 1);
        assert_eq!(renamed["(running) reap"], Digest::of_bytes(b"renamed"));
    }

    /// An install missing one binary computes no authority at all: it names what is missing.
    #[test]
    fn a_partial_install_is_refused_naming_what_is_missing() {
        let dir = tempfile::tempdir().unwrap();
        for name in CORDON_BINARIES.iter().filter(|n| **n != "cordon-surface") {
            std::fs::write(dir.path().join(name), name).unwrap();
        }
        let e = cordon_binaries(&crate::host::Linux, &dir.path().join("cordon-lane")).unwrap_err();
        assert!(
            matches!(&e, IdentityError::PartialInstall { missing, .. } if missing == "cordon-surface"),
            "{e}"
        );
        assert_eq!(e.exit_class(), ExitCode::NoDecision);
    }

    #[test]
    fn a_binary_that_is_there_but_unreadable_is_an_error_never_left_out() {
        let fake = crate::host::fake::Fake::new();
        fake.file("/opt/cordon/bin/cordon-policy", "x")
            .unreadable("/opt/cordon/bin/cordon-fetch");
        let e = cordon_binaries(&fake, Path::new("/opt/cordon/bin/cordon-policy")).unwrap_err();
        assert!(matches!(e, IdentityError::Binaries { .. }), "{e}");
        assert_eq!(e.exit_class(), ExitCode::NoDecision);
        // The runtime is read through the seam as well.
        fake.unreadable("/usr/sbin/runc");
        assert!(matches!(
            probe_runtime(&fake, "runc", Path::new("/usr/sbin/runc"), None),
            Err(IdentityError::RuntimeUnreadable { .. })
        ));
    }
}
