//! Key rotation (seed 001's incident checklist, step 6): the host's key history as a key set
//! with validity windows, its rotation, a key declared compromised, and a signature's check
//! under the set.
//!
//! The set lives beside the host key as `keys.json` in [`KEY_DIR`] (0600, the running user's):
//! every key the host has signed with, each with the window in which it signed (`valid_from`
//! inclusive, `valid_until` exclusive; absent = unbounded) and, once declared,
//! `compromised_at`. A host that never rotated has no file; its set is its one key, unbounded.
//! The set is public: the host publishes it (`cordon-verify --key-set`) as it published its key,
//! and an auditor verifies against the published set, never one a bundle brings.
//!
//! A signature verifies under the set when its key is in the set, the signature is good, and
//! the receipt's signing time (its `finished_at`, stamped right before the host signs) is
//! inside the key's window and before its compromise time. That time is the signer's own
//! statement: whoever holds a stolen key can backdate a receipt, so a key declared compromised
//! invalidates what it signed after the declared time, and what it signed before stands only as
//! far as its digest was known (published, exported, chained into a later receipt) before the
//! compromise — `cordon-verify` says so when it accepts such a signature.
//!
//! Rotation (under the key directory's lock) makes a fresh key, stages its seed, writes the set
//! that ends the current key's window now and opens the new one's, then moves the staged seed
//! into place. A crash before the set is written leaves the old key current (the staged seed is
//! dropped by the next rotation); after it, the old seed is outside its window, so what it signs
//! does not verify (fail closed), and the next `--rotate-key` installs the staged seed instead of
//! rotating again. The retired seed is unlinked (not wiped from the disk). Rotate while no stage
//! runs: a stage that loaded the old key signs receipts that fall outside its window.

use std::fs::{self, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::time::SystemTime;

use nix::fcntl::OFlag;
use serde::{Deserialize, Serialize};

use crate::canonical::Digest;
use crate::signing::{self, HostKey, KEY_FILE, Signature, SigningError};

pub use crate::signing::KEY_DIR;

/// The key set's file name in [`KEY_DIR`].
pub const KEY_SET_FILE: &str = "keys.json";

/// A rotation's staged seed in [`KEY_DIR`], until it is moved into place.
pub const NEXT_KEY_FILE: &str = "host.ed25519.next";

/// The lock one key operation holds in [`KEY_DIR`].
pub const KEY_LOCK_FILE: &str = "keys.lock";

/// The key set schema.
pub const KEY_SET_SCHEMA: u32 = 1;

/// One key of the set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyEntry {
    /// The public key, `ed25519:<hex>`.
    pub key: String,
    /// From when it signed (RFC 3339; absent: from the start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub valid_from: Option<String>,
    /// Until when (exclusive; absent: it is the current key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub valid_until: Option<String>,
    /// From when it is held compromised: nothing it signed from then on verifies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compromised_at: Option<String>,
}

/// A key set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeySet {
    /// [`KEY_SET_SCHEMA`].
    pub schema: u32,
    /// The keys, oldest first.
    pub keys: Vec<KeyEntry>,
}

fn set_error(why: impl std::fmt::Display) -> SigningError {
    SigningError::KeySet {
        why: why.to_string(),
    }
}

/// An RFC 3339 time (`what` names it in the error).
///
/// # Errors
/// [`SigningError::KeySet`]: it does not parse.
pub fn time(what: &str, text: &str) -> Result<SystemTime, SigningError> {
    humantime::parse_rfc3339(text).map_err(|e| set_error(format!("{what} {text:?}: {e}")))
}

impl KeySet {
    /// One key, unbounded: what `--key` gives, and a host that never rotated.
    #[must_use]
    pub fn single(key: &str) -> Self {
        Self {
            schema: KEY_SET_SCHEMA,
            keys: vec![KeyEntry {
                key: key.to_owned(),
                valid_from: None,
                valid_until: None,
                compromised_at: None,
            }],
        }
    }

    /// Parse and check a key set: the schema, well-formed distinct keys, times that parse,
    /// windows that are not empty, compromise times inside or after their window's start.
    ///
    /// # Errors
    /// [`SigningError::KeySet`] naming what is wrong.
    pub fn parse(text: &str) -> Result<Self, SigningError> {
        let set: Self = serde_json::from_str(text).map_err(set_error)?;
        if set.schema != KEY_SET_SCHEMA {
            return Err(set_error(format!(
                "schema {} is not {KEY_SET_SCHEMA}",
                set.schema
            )));
        }
        if set.keys.is_empty() {
            return Err(set_error("no keys"));
        }
        let mut seen = std::collections::BTreeSet::new();
        for k in &set.keys {
            signing::public_key(&k.key)?;
            if !seen.insert(&k.key) {
                return Err(set_error(format!("{} is listed twice", k.key)));
            }
            let from = k
                .valid_from
                .as_deref()
                .map(|t| time("valid_from", t))
                .transpose()?;
            let until = k
                .valid_until
                .as_deref()
                .map(|t| time("valid_until", t))
                .transpose()?;
            let compromised = k
                .compromised_at
                .as_deref()
                .map(|t| time("compromised_at", t))
                .transpose()?;
            if let (Some(f), Some(u)) = (from, until)
                && u <= f
            {
                return Err(set_error(format!("{}: its window is empty", k.key)));
            }
            if let (Some(f), Some(c)) = (from, compromised)
                && c < f
            {
                return Err(set_error(format!(
                    "{}: compromised before its window opens",
                    k.key
                )));
            }
        }
        Ok(set)
    }

    /// Check `sig` over receipt `digest`, signed at `signed_at` (the receipt's `finished_at`),
    /// under this set. The entry it verified under.
    ///
    /// # Errors
    /// The key is not in the set, the signature does not verify, or the time is outside the
    /// key's window or at or after its compromise.
    pub fn verify(
        &self,
        digest: &Digest,
        sig: &Signature,
        signed_at: &str,
    ) -> Result<&KeyEntry, SigningError> {
        let entry =
            self.keys
                .iter()
                .find(|k| k.key == sig.key)
                .ok_or_else(|| SigningError::Bad {
                    digest: *digest,
                    key: format!("the key set (it names {}, which the set lacks)", sig.key),
                })?;
        signing::verify(&entry.key, digest, sig)?;
        let outside = |why: String| SigningError::Window {
            digest: *digest,
            key: entry.key.clone(),
            why,
        };
        let at = time("the receipt's signing time", signed_at)?;
        if let Some(from) = &entry.valid_from
            && at < time("valid_from", from)?
        {
            return Err(outside(format!(
                "signed at {signed_at}, before the key's window opens at {from}"
            )));
        }
        if let Some(until) = &entry.valid_until
            && at >= time("valid_until", until)?
        {
            return Err(outside(format!(
                "signed at {signed_at}, after the key was retired at {until}"
            )));
        }
        if let Some(c) = &entry.compromised_at
            && at >= time("compromised_at", c)?
        {
            return Err(outside(format!(
                "signed at {signed_at}, after the key was declared compromised at {c}"
            )));
        }
        Ok(entry)
    }

    /// The current (unretired) key's entry.
    fn current_mut(&mut self) -> Option<&mut KeyEntry> {
        self.keys.iter_mut().find(|k| k.valid_until.is_none())
    }
}

/// The host's key set in `dir`: its `keys.json`, or its one key unbounded when it never rotated.
///
/// # Errors
/// The set or the key cannot be read, or the set does not name the current key as current.
pub fn host_set(dir: &Path) -> Result<KeySet, SigningError> {
    let current = HostKey::load(dir)?.public();
    let path = dir.join(KEY_SET_FILE);
    let set = match fs::symlink_metadata(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(KeySet::single(&current)),
        _ => KeySet::parse(&read_private(&path)?)?,
    };
    // The set and the seed agree, or signing and verification would disagree.
    match set.keys.iter().find(|k| k.valid_until.is_none()) {
        Some(k) if k.key == current => Ok(set),
        _ => Err(set_error(format!(
            "{} does not name the host's key {current} as its current key (an interrupted rotation: `cordon-verify --rotate-key` finishes it)",
            path.display()
        ))),
    }
}

/// Read a file of this user's, not writable by others, without following a link.
fn read_private(path: &Path) -> Result<String, SigningError> {
    let mut f = OpenOptions::new()
        .read(true)
        .custom_flags((OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK).bits())
        .open(path)
        .map_err(|e| set_error(format!("{}: {e}", path.display())))?;
    let m = f
        .metadata()
        .map_err(|e| set_error(format!("{}: {e}", path.display())))?;
    if !m.is_file() || m.uid() != nix::unistd::geteuid().as_raw() || m.mode() & 0o022 != 0 {
        return Err(set_error(format!(
            "{}: not a regular file of this user's closed to others' writes",
            path.display()
        )));
    }
    let mut text = String::new();
    f.read_to_string(&mut text)
        .map_err(|e| set_error(format!("{}: {e}", path.display())))?;
    Ok(text)
}

/// Write `bytes` at `dir/name` (mode `mode`) by scratch file, fsync and rename over.
fn replace(dir: &Path, name: &str, bytes: &[u8], mode: u32) -> Result<(), SigningError> {
    let path = dir.join(name);
    let scratch = dir.join(format!(".{name}.{}", std::process::id()));
    let written = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags((OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC).bits())
        .open(&scratch)
        .and_then(|mut f| f.write_all(bytes).and_then(|()| f.sync_all()))
        .and_then(|()| fs::rename(&scratch, &path))
        .and_then(|()| fs::File::open(dir)?.sync_all());
    if let Err(e) = written {
        let _ = fs::remove_file(&scratch);
        return Err(set_error(format!("{}: {e}", path.display())));
    }
    Ok(())
}

fn write_set(dir: &Path, set: &KeySet) -> Result<(), SigningError> {
    let text = crate::canonical::to_canonical_json(set).map_err(set_error)?;
    replace(dir, KEY_SET_FILE, text.as_bytes(), 0o600)
}

/// Hold the key directory's lock: one key operation at a time, so a rotation and a
/// declaration never write over each other's set.
fn lock(dir: &Path) -> Result<nix::fcntl::Flock<fs::File>, SigningError> {
    let path = dir.join(KEY_LOCK_FILE);
    let f = crate::lease::open_lock_file(&path)
        .map_err(|e| set_error(format!("{}: {e}", path.display())))?;
    nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| set_error(format!("{}: {e}", path.display())))
}

/// Move `dir`'s staged seed into place, durably.
fn install_staged(dir: &Path) -> Result<(), SigningError> {
    let (next, path) = (dir.join(NEXT_KEY_FILE), dir.join(KEY_FILE));
    fs::rename(&next, &path)
        .and_then(|()| fs::File::open(dir)?.sync_all())
        .map_err(|e| set_error(format!("{}: {e}", path.display())))
}

/// Finish a rotation that stopped part-way: a staged seed that the set names as current is
/// moved into place (the set is then the one returned); one the set does not name was never
/// published and is dropped (`None`: rotate afresh).
fn finish_rotation(dir: &Path) -> Result<Option<KeySet>, SigningError> {
    let next = dir.join(NEXT_KEY_FILE);
    match fs::symlink_metadata(&next) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        _ => {}
    }
    let staged = HostKey::read(&next)?.public();
    let path = dir.join(KEY_SET_FILE);
    let set = match fs::symlink_metadata(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        _ => Some(KeySet::parse(&read_private(&path)?)?),
    };
    match set {
        Some(set)
            if set
                .keys
                .iter()
                .any(|k| k.valid_until.is_none() && k.key == staged) =>
        {
            install_staged(dir)?;
            Ok(Some(set))
        }
        _ => {
            fs::remove_file(&next).map_err(|e| set_error(format!("{}: {e}", next.display())))?;
            Ok(None)
        }
    }
}

/// Rotate the host key in `dir`: a fresh key becomes current from now, the current one is
/// retired now. A rotation that stopped part-way is finished instead. The new set.
///
/// # Errors
/// The key or set cannot be read or written, or the new set would not be valid (a clock
/// stepped back to before the current key's window).
pub fn rotate(dir: &Path) -> Result<KeySet, SigningError> {
    let _held = lock(dir)?;
    if let Some(set) = finish_rotation(dir)? {
        return Ok(set);
    }
    let mut set = host_set(dir)?;
    let now = crate::receipt::now_rfc3339();
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed).map_err(set_error)?;
    let fresh = HostKey::from_seed(seed).public();
    if let Some(current) = set.current_mut() {
        current.valid_until = Some(now.clone());
    }
    set.keys.push(KeyEntry {
        key: fresh,
        valid_from: Some(now),
        valid_until: None,
        compromised_at: None,
    });
    let set = KeySet::parse(&serde_json::to_string(&set).map_err(set_error)?)?;
    // The seed staged, then the set naming it, then the seed in place: a crash at any point
    // leaves either the old key current or a staged seed the next rotation installs.
    replace(dir, NEXT_KEY_FILE, &seed, 0o600)?;
    write_set(dir, &set)?;
    install_staged(dir)?;
    Ok(set)
}

/// Declare `key` compromised from `at` (RFC 3339). A key compromised earlier keeps its earlier
/// time. The current key is refused: rotate first, so nothing signs with it again.
///
/// # Errors
/// The key is not in the set, is the current key, or the time does not parse; the set cannot
/// be read or written.
pub fn declare_compromised(dir: &Path, key: &str, at: &str) -> Result<KeySet, SigningError> {
    let when = time("the compromise time", at)?;
    let _held = lock(dir)?;
    let mut set = host_set(dir)?;
    let entry = set
        .keys
        .iter_mut()
        .find(|k| k.key == key)
        .ok_or_else(|| set_error(format!("{key} is not in the host's key set")))?;
    if entry.valid_until.is_none() {
        return Err(set_error(format!(
            "{key} is the current key: rotate it first (cordon-verify --rotate-key), then declare it"
        )));
    }
    let earlier = match &entry.compromised_at {
        Some(c) => time("compromised_at", c)? <= when,
        None => false,
    };
    if !earlier {
        // A compromise before the key's window opened invalidates all it ever signed.
        entry.compromised_at = Some(match &entry.valid_from {
            Some(from) if when < time("valid_from", from)? => from.clone(),
            _ => at.to_owned(),
        });
    }
    let set = KeySet::parse(&serde_json::to_string(&set).map_err(set_error)?)?;
    write_set(dir, &set)?;
    Ok(set)
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: &str = "2026-01-01T00:00:00.000Z";
    const T2: &str = "2099-01-01T00:00:00.000Z";

    fn is_window(e: &SigningError, what: &str) -> bool {
        matches!(e, SigningError::Window { why, .. } if why.contains(what))
    }

    #[test]
    fn a_rotated_key_verifies_only_inside_its_window_and_the_new_key_only_after() {
        let dir = tempfile::tempdir().unwrap();
        let keys = dir.path().join("keys");
        let old = HostKey::load_or_create(&keys).unwrap();
        // A host that never rotated: its one key, unbounded.
        assert_eq!(host_set(&keys).unwrap(), KeySet::single(&old.public()));
        let set = rotate(&keys).unwrap();
        let new = HostKey::load(&keys).unwrap();
        assert_ne!(new.public(), old.public(), "a fresh key is current");
        assert_eq!(
            host_set(&keys).unwrap(),
            set,
            "the set is kept beside the key"
        );
        let retired_at = set.keys[0].valid_until.clone().unwrap();
        assert_eq!(set.keys[0].key, old.public());
        assert_eq!(set.keys[1].valid_from.as_deref(), Some(retired_at.as_str()));
        let d = Digest::of_bytes(b"receipt");
        // The old key before its retirement; the new one after its start.
        set.verify(&d, &old.sign(&d), T0).unwrap();
        set.verify(&d, &new.sign(&d), T2).unwrap();
        let e = set.verify(&d, &old.sign(&d), T2).unwrap_err();
        assert!(is_window(&e, "retired"), "{e}");
        let e = set.verify(&d, &new.sign(&d), T0).unwrap_err();
        assert!(is_window(&e, "before the key's window opens"), "{e}");
        // A key the set lacks, a bad signature under a listed key.
        let stranger = HostKey::from_seed([7; 32]);
        assert!(matches!(
            set.verify(&d, &stranger.sign(&d), T2),
            Err(SigningError::Bad { .. })
        ));
        assert!(matches!(
            set.verify(&Digest::of_bytes(b"other"), &new.sign(&d), T2),
            Err(SigningError::Bad { .. })
        ));
        // A second rotation keeps the history.
        let again = rotate(&keys).unwrap();
        assert_eq!(again.keys.len(), 3);
        assert!(again.keys[..2].iter().all(|k| k.valid_until.is_some()));
    }

    #[test]
    fn a_compromised_key_invalidates_what_it_signed_from_its_compromise_on() {
        let dir = tempfile::tempdir().unwrap();
        let keys = dir.path().join("keys");
        let signer = HostKey::load_or_create(&keys).unwrap();
        let old = signer.public();
        // The current key cannot be declared: nothing would stop it signing.
        let e = declare_compromised(&keys, &old, T0).unwrap_err();
        assert!(e.to_string().contains("rotate it first"), "{e}");
        rotate(&keys).unwrap();
        let set = declare_compromised(&keys, &old, "2026-06-01T00:00:00Z").unwrap();
        // A later declaration leaves the earlier time; an earlier one replaces it.
        assert_eq!(
            declare_compromised(&keys, &old, "2026-07-01T00:00:00Z").unwrap(),
            set
        );
        let set = declare_compromised(&keys, &old, "2026-05-01T00:00:00Z").unwrap();
        assert_eq!(
            set.keys[0].compromised_at.as_deref(),
            Some("2026-05-01T00:00:00Z")
        );
        assert_eq!(host_set(&keys).unwrap(), set, "kept");
        // Signed before the compromise: verifies, and the entry says it is compromised; from
        // the compromise on (though inside the key's window): does not.
        let d = Digest::of_bytes(b"receipt");
        let entry = set.verify(&d, &signer.sign(&d), T0).unwrap();
        assert!(entry.compromised_at.is_some());
        let e = set
            .verify(&d, &signer.sign(&d), "2026-05-01T00:00:00Z")
            .unwrap_err();
        assert!(is_window(&e, "declared compromised"), "{e}");
        // Compromised before its window opened: all it ever signed.
        let newer = HostKey::load(&keys).unwrap().public();
        rotate(&keys).unwrap();
        let set = declare_compromised(&keys, &newer, "2000-01-01T00:00:00Z").unwrap();
        let entry = set.keys.iter().find(|k| k.key == newer).unwrap();
        assert_eq!(entry.compromised_at, entry.valid_from);
        let e = declare_compromised(&keys, "ed25519:00", T0).unwrap_err();
        assert!(e.to_string().contains("not in the host's key set"), "{e}");
        let e = declare_compromised(&keys, &old, "yesterday")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("the compromise time \"yesterday\": timestamp format is invalid"),
            "{e}"
        );
    }

    #[test]
    fn a_key_set_that_is_not_well_formed_is_refused_with_its_reason() {
        let key = HostKey::from_seed([1; 32]).public();
        let entry = |extra: &str| format!(r#"{{"schema":1,"keys":[{{"key":"{key}"{extra}}}]}}"#);
        KeySet::parse(&entry("")).unwrap();
        for (text, why) in [
            (
                entry(
                    r#","valid_from":"2026-02-01T00:00:00Z","valid_until":"2026-01-01T00:00:00Z""#,
                ),
                "window is empty",
            ),
            (
                entry(
                    r#","valid_from":"2026-02-01T00:00:00Z","compromised_at":"2026-01-01T00:00:00Z""#,
                ),
                "compromised before",
            ),
            (entry(r#","valid_from":"soon""#), "valid_from"),
            (entry(r#","trusted":true"#), "unknown field"),
            (r#"{"schema":2,"keys":[]}"#.to_owned(), "schema 2"),
            (r#"{"schema":1,"keys":[]}"#.to_owned(), "no keys"),
            (
                r#"{"schema":1,"keys":[{"key":"ed25519:zz"}]}"#.to_owned(),
                "public key",
            ),
            (
                format!(r#"{{"schema":1,"keys":[{{"key":"{key}"}},{{"key":"{key}"}}]}}"#),
                "twice",
            ),
        ] {
            let e = KeySet::parse(&text).unwrap_err();
            assert!(e.to_string().contains(why), "{text}: {e}");
        }
    }

    #[test]
    fn an_interrupted_rotation_fails_closed_and_the_next_rotation_finishes_it() {
        let dir = tempfile::tempdir().unwrap();
        let keys = dir.path().join("keys");
        HostKey::load_or_create(&keys).unwrap();
        let mut set = rotate(&keys).unwrap();
        let seed = HostKey::load(&keys).unwrap().public();
        // Stopped after the set was written, before the staged seed moved into place.
        let staged = HostKey::from_seed([9; 32]);
        replace(&keys, NEXT_KEY_FILE, &[9; 32], 0o600).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(5));
        let at = crate::receipt::now_rfc3339();
        set.current_mut().unwrap().valid_until = Some(at.clone());
        set.keys.push(KeyEntry {
            key: staged.public(),
            valid_from: Some(at),
            valid_until: None,
            compromised_at: None,
        });
        write_set(&keys, &set).unwrap();
        // The seed in place is not the set's current key: refused, never signed past.
        let e = host_set(&keys).unwrap_err();
        assert!(e.to_string().contains("interrupted rotation"), "{e}");
        assert!(e.to_string().contains(&seed), "{e}");
        // The next rotation finishes it rather than rotating again.
        assert_eq!(rotate(&keys).unwrap(), set);
        assert_eq!(HostKey::load(&keys).unwrap().public(), staged.public());
        assert_eq!(host_set(&keys).unwrap(), set);
        assert!(!keys.join(NEXT_KEY_FILE).exists());
        // Stopped before its set was written: the staged seed was never published; the next
        // rotation drops it and rotates afresh.
        replace(&keys, NEXT_KEY_FILE, &[5; 32], 0o600).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(5));
        let again = rotate(&keys).unwrap();
        let current = HostKey::load(&keys).unwrap().public();
        assert_ne!(current, HostKey::from_seed([5; 32]).public());
        assert_eq!(again.keys.last().unwrap().key, current);
        // Writable by others: refused.
        fs::set_permissions(
            keys.join(KEY_SET_FILE),
            std::os::unix::fs::PermissionsExt::from_mode(0o666),
        )
        .unwrap();
        let e = host_set(&keys).unwrap_err().to_string();
        assert!(
            e.contains("not a regular file of this user's closed to others' writes"),
            "{e}"
        );
    }
}
