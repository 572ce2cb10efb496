//! The host's receipt signatures: one Ed25519 key per host, a detached signature over every
//! stored receipt's digest, and their check.
//!
//! The key is a 32-byte seed in `host.ed25519` under [`KEY_DIR`] — outside every store, so a
//! copy of a store (or an exported bundle) carries signatures but never the key. It is created
//! on first use: the directory 0700, the seed from the kernel's random source, written to a
//! scratch file and renamed into place without replacing, so two stages starting at once agree
//! on one key. It is then trusted only as a regular file of the running user's, mode 0600, 32
//! bytes. Its public key (`ed25519:<hex>`) is the host's published identity: an auditor checks
//! signatures against the key the host published, never against one a bundle brings.
//!
//! A signature is stored beside its receipt as `receipts/<hex>.sig`: JSON naming the public
//! key and the signature over the domain-separated message [`message`]. Ed25519 signatures are
//! deterministic, so storing a receipt twice stores the same signature.
//!
//! What it does not own: which receipts are signed (every receipt a stage stores:
//! `cordon-stage`'s `emit`), and the key's history — rotation, retirement, compromise and
//! verification under a key set ([`crate::keyset`]).

use std::fs::{self, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

use ed25519_dalek::{Signer, SigningKey, VerifyingKey};
use nix::fcntl::{OFlag, RenameFlags, renameat2};
use serde::{Deserialize, Serialize};

use crate::canonical::Digest;
use crate::receipt::{Receipt, ReceiptError};
use crate::store::{Store, StoreError};

/// Where the host's key lives: one fixed directory per host, outside every store.
pub const KEY_DIR: &str = "/var/lib/cordon-keys";

/// The key file's name in [`KEY_DIR`].
pub const KEY_FILE: &str = "host.ed25519";

/// The signature schema.
pub const SIGNATURE_SCHEMA: u32 = 1;

/// Why a key or a signature could not be used.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum SigningError {
    /// The key cannot be made or read.
    #[error("the host key {path}: {why}")]
    #[diagnostic(code(cordon::signing::key))]
    Key {
        /// The key file.
        path: String,
        /// What is wrong.
        why: String,
    },
    /// A public key or signature is not well formed.
    #[error("not a well-formed {what}: {text}")]
    #[diagnostic(code(cordon::signing::malformed))]
    Malformed {
        /// A public key or a signature.
        what: &'static str,
        /// What was given.
        text: String,
    },
    /// The signature does not verify.
    #[error("the signature over receipt {digest} does not verify under {key}")]
    #[diagnostic(code(cordon::signing::bad_signature))]
    Bad {
        /// The receipt.
        digest: Digest,
        /// The public key.
        key: String,
    },
    /// The signature could not be stored or read.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Store(#[from] StoreError),
    /// A key set is not usable ([`crate::keyset`]).
    #[error("key set: {why}")]
    #[diagnostic(
        code(cordon::signing::key_set),
        help("a key set is the host's published `cordon-verify --key-set` output")
    )]
    KeySet {
        /// What is wrong.
        why: String,
    },
    /// The signature is good but was made outside its key's validity window.
    #[error("the signature over receipt {digest} by {key} is not valid: {why}")]
    #[diagnostic(
        code(cordon::signing::window),
        help(
            "a retired key signs nothing after its retirement, a compromised one nothing after its compromise time"
        )
    )]
    Window {
        /// The receipt.
        digest: Digest,
        /// The key.
        key: String,
        /// Which bound, with the times.
        why: String,
    },
}

/// A stored detached signature.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Signature {
    /// [`SIGNATURE_SCHEMA`].
    pub schema: u32,
    /// The signer's public key, `ed25519:<hex>`.
    pub key: String,
    /// The signature over [`message`] of the receipt's digest, hex.
    pub signature: String,
}

/// The host's signing key.
pub struct HostKey {
    key: SigningKey,
}

impl std::fmt::Debug for HostKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the seed.
        f.debug_struct("HostKey")
            .field("public", &self.public())
            .finish()
    }
}

/// What is signed for receipt `digest`: a domain tag, then the digest's 32 bytes.
#[must_use]
pub fn message(digest: &Digest) -> Vec<u8> {
    let mut m = b"cordon.receipt-signature/1\0".to_vec();
    m.extend_from_slice(digest.bytes());
    m
}

fn key_error(path: &Path, why: impl std::fmt::Display) -> SigningError {
    SigningError::Key {
        path: path.display().to_string(),
        why: why.to_string(),
    }
}

impl HostKey {
    /// The key in `dir` (the host's: [`KEY_DIR`]), created on first use.
    ///
    /// # Errors
    /// It cannot be made, or what is there is not a key of this user's closed to others.
    pub fn load_or_create(dir: &Path) -> Result<Self, SigningError> {
        let path = dir.join(KEY_FILE);
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| key_error(dir, e))?;
        // Only an absent key is made; anything else there (a link, another mode) is read, and
        // refused by the read's checks.
        match fs::symlink_metadata(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            _ => return Self::read(&path),
        }
        let mut seed = [0u8; 32];
        getrandom::fill(&mut seed).map_err(|e| key_error(&path, e))?;
        let scratch = dir.join(format!(".{KEY_FILE}.{}", std::process::id()));
        let written = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags((OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC).bits())
            .open(&scratch)
            .and_then(|mut f| f.write_all(&seed).and_then(|()| f.sync_all()));
        if let Err(e) = written {
            let _ = fs::remove_file(&scratch);
            return Err(key_error(&scratch, e));
        }
        // Without replacing: a key another stage made meanwhile wins, and this seed is dropped.
        let renamed = renameat2(
            nix::fcntl::AT_FDCWD,
            &scratch,
            nix::fcntl::AT_FDCWD,
            &path,
            RenameFlags::RENAME_NOREPLACE,
        );
        let _ = fs::remove_file(&scratch);
        match renamed {
            Ok(()) | Err(nix::errno::Errno::EEXIST) => Self::read(&path),
            Err(e) => Err(key_error(&path, e)),
        }
    }

    /// The key in `dir`, which must exist already (a verifier never makes one).
    ///
    /// # Errors
    /// It is missing, or not a key of this user's closed to others.
    pub fn load(dir: &Path) -> Result<Self, SigningError> {
        Self::read(&dir.join(KEY_FILE))
    }

    pub(crate) fn read(path: &Path) -> Result<Self, SigningError> {
        let mut f = OpenOptions::new()
            .read(true)
            .custom_flags((OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK).bits())
            .open(path)
            .map_err(|e| key_error(path, e))?;
        let m = f.metadata().map_err(|e| key_error(path, e))?;
        if !m.is_file()
            || m.uid() != nix::unistd::geteuid().as_raw()
            || m.mode() & 0o7777 != 0o600
            || m.len() != 32
        {
            return Err(key_error(
                path,
                "not a 32-byte regular file of this user's with mode 0600",
            ));
        }
        let mut seed = [0u8; 32];
        f.read_exact(&mut seed).map_err(|e| key_error(path, e))?;
        Ok(Self::from_seed(seed))
    }

    /// The key of `seed`.
    #[must_use]
    pub fn from_seed(seed: [u8; 32]) -> Self {
        Self {
            key: SigningKey::from_bytes(&seed),
        }
    }

    /// The public key, `ed25519:<hex>`.
    #[must_use]
    pub fn public(&self) -> String {
        format!(
            "ed25519:{}",
            hex::encode(self.key.verifying_key().as_bytes())
        )
    }

    /// The signature over receipt `digest`.
    #[must_use]
    pub fn sign(&self, digest: &Digest) -> Signature {
        Signature {
            schema: SIGNATURE_SCHEMA,
            key: self.public(),
            signature: hex::encode(self.key.sign(&message(digest)).to_bytes()),
        }
    }

    /// Sign receipt `digest` and store the signature beside it.
    ///
    /// # Errors
    /// It cannot be stored.
    pub fn sign_stored(&self, store: &Store, digest: &Digest) -> Result<(), SigningError> {
        let sig = self.sign(digest);
        let bytes = serde_json::to_vec(&sig).map_err(|e| SigningError::Malformed {
            what: "signature",
            text: e.to_string(),
        })?;
        store.put_document("receipts", &signature_name(digest), &bytes)?;
        Ok(())
    }
}

impl HostKey {
    /// Store `receipt` as its canonical text under `receipts/<hex>.json` and sign it: the one
    /// path by which a receipt enters a store. Its digest and text.
    ///
    /// # Errors
    /// It cannot be encoded, stored or signed.
    pub fn store_receipt(
        &self,
        store: &Store,
        receipt: &Receipt,
    ) -> Result<(Digest, String), SigningError> {
        let malformed = |e: ReceiptError| SigningError::Malformed {
            what: "receipt",
            text: e.to_string(),
        };
        let text = receipt.to_canonical_json().map_err(malformed)?;
        let digest = receipt.digest().map_err(malformed)?;
        store.put_document(
            "receipts",
            &format!("{}.json", digest.hex()),
            text.as_bytes(),
        )?;
        self.sign_stored(store, &digest)?;
        Ok((digest, text))
    }
}

/// The name a receipt's signature is stored under in `receipts/`.
#[must_use]
pub fn signature_name(digest: &Digest) -> String {
    format!("{}.sig", digest.hex())
}

/// Check `sig` over receipt `digest` against the trusted public key `key` (`ed25519:<hex>`).
///
/// # Errors
/// The key or signature is malformed, names another key, or does not verify.
pub fn verify(key: &str, digest: &Digest, sig: &Signature) -> Result<(), SigningError> {
    let bad = || SigningError::Bad {
        digest: *digest,
        key: key.to_owned(),
    };
    if sig.schema != SIGNATURE_SCHEMA || sig.key != key {
        return Err(bad());
    }
    let public = public_key(key)?;
    let bytes: [u8; 64] = hex::decode(&sig.signature)
        .ok()
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| SigningError::Malformed {
            what: "signature",
            text: sig.signature.clone(),
        })?;
    public
        .verify_strict(
            &message(digest),
            &ed25519_dalek::Signature::from_bytes(&bytes),
        )
        .map_err(|_| bad())
}

/// The Ed25519 key of `key` (`ed25519:<hex>`).
///
/// # Errors
/// It is not a well-formed public key.
pub fn public_key(key: &str) -> Result<VerifyingKey, SigningError> {
    let malformed = || SigningError::Malformed {
        what: "public key",
        text: key.to_owned(),
    };
    let raw: [u8; 32] = key
        .strip_prefix("ed25519:")
        .and_then(|h| hex::decode(h).ok())
        .and_then(|b| b.try_into().ok())
        .ok_or_else(malformed)?;
    VerifyingKey::from_bytes(&raw).map_err(|_| malformed())
}

/// Read the stored signature of receipt `digest`.
///
/// # Errors
/// It is missing or not a signature.
pub fn stored(store: &Store, digest: &Digest) -> Result<Signature, SigningError> {
    let bytes = store.read_document("receipts", &signature_name(digest))?;
    serde_json::from_slice(&bytes).map_err(|e| SigningError::Malformed {
        what: "signature",
        text: e.to_string(),
    })
}

impl crate::exit::ExitClass for SigningError {
    /// A key or signature cordon cannot make or read is a no-decision (3); a receipt whose
    /// signature does not verify is judged by its reader (`cordon-verify`), not here.
    fn exit_class(&self) -> crate::ExitCode {
        crate::ExitCode::NoDecision
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_made_once_and_trusted_only_as_the_users_own_closed_file() {
        let dir = tempfile::tempdir().unwrap();
        let keys = dir.path().join("keys");
        let a = HostKey::load_or_create(&keys).unwrap();
        let b = HostKey::load_or_create(&keys).unwrap();
        assert_eq!(a.public(), b.public(), "the second use reads the first key");
        let path = keys.join(KEY_FILE);
        let meta = fs::metadata(&path).unwrap();
        assert_eq!(meta.mode() & 0o7777, 0o600);
        assert_eq!(fs::metadata(&keys).unwrap().mode() & 0o7777, 0o700);
        // Opened to others, or a link: refused, never used.
        let refused = |dir: &Path| match HostKey::load_or_create(dir) {
            Err(SigningError::Key { why, .. }) => why,
            other => panic!("not refused: {:?}", other.map(|k| k.public())),
        };
        let shape = "not a 32-byte regular file of this user's with mode 0600";
        fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
        assert_eq!(refused(&keys), shape);
        fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        let linked = dir.path().join("linked");
        fs::create_dir(&linked).unwrap();
        std::os::unix::fs::symlink(&path, linked.join(KEY_FILE)).unwrap();
        // O_NOFOLLOW: the open itself fails on the link.
        let loop_error = std::io::Error::from_raw_os_error(nix::libc::ELOOP).to_string();
        assert_eq!(refused(&linked), loop_error);
        // A key of the wrong length.
        let short = dir.path().join("short");
        fs::create_dir(&short).unwrap();
        fs::write(short.join(KEY_FILE), [0u8; 31]).unwrap();
        fs::set_permissions(
            short.join(KEY_FILE),
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )
        .unwrap();
        assert_eq!(refused(&short), shape);
    }

    #[test]
    fn a_signature_verifies_for_its_receipt_and_key_only() {
        let dir = tempfile::tempdir().unwrap();
        let key = HostKey::load_or_create(&dir.path().join("a")).unwrap();
        let other = HostKey::load_or_create(&dir.path().join("b")).unwrap();
        let d = Digest::of_bytes(b"receipt");
        let sig = key.sign(&d);
        verify(&key.public(), &d, &sig).unwrap();
        assert_eq!(sig, key.sign(&d), "deterministic");
        // Another receipt, another trusted key, a key swapped into the file, a flipped bit:
        // each a bad signature, named with the receipt and key it was checked against.
        let bad = |r: Result<(), SigningError>, digest: Digest, under: &str| match r {
            Err(SigningError::Bad { digest: got, key }) => {
                assert_eq!((got, key.as_str()), (digest, under));
            }
            other => panic!("not a bad signature: {other:?}"),
        };
        let elsewhere = Digest::of_bytes(b"other");
        bad(
            verify(&key.public(), &elsewhere, &sig),
            elsewhere,
            &key.public(),
        );
        bad(verify(&other.public(), &d, &sig), d, &other.public());
        let swapped = Signature {
            key: other.public(),
            ..sig.clone()
        };
        bad(verify(&other.public(), &d, &swapped), d, &other.public());
        let mut flipped = sig.clone();
        flipped
            .signature
            .replace_range(0..1, if &sig.signature[..1] == "0" { "1" } else { "0" });
        bad(verify(&key.public(), &d, &flipped), d, &key.public());
        // A key that is not one, named as the signature's key too (so the key check, not the
        // mismatch, refuses it).
        let garbled = Signature {
            key: "ed25519:zz".into(),
            ..sig.clone()
        };
        assert!(matches!(
            verify("ed25519:zz", &d, &garbled),
            Err(SigningError::Malformed {
                what: "public key",
                ..
            })
        ));
    }
}
