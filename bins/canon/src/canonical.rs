//! Canonical JSON and domain-separated digests: the one encoder every hash in cordon goes
//! through.
//!
//! Canonical JSON here means: object keys sorted by their UTF-8 bytes, no insignificant
//! whitespace, UTF-8 output, and no floating-point numbers anywhere (durations are integer
//! milliseconds, sizes integer bytes). Sorting is done by this module itself, so the result does
//! not depend on whether some crate in the build turned on `serde_json/preserve_order`.
//!
//! A digest is always domain-separated: `sha256(canonical({"domain", "schema", "payload"}))`,
//! printed `sha256:<hex>`, so a digest of one kind of object can never be replayed as another.

use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;
use sha2::{Digest as _, Sha256};

/// Why a value could not be put in canonical form, or a digest read.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum CanonicalError {
    /// The value did not serialize to JSON at all.
    #[error("value does not serialize to json")]
    #[diagnostic(code(cordon::canonical::serialize))]
    Serialize {
        /// What serde said.
        #[source]
        source: serde_json::Error,
    },
    /// A float was found where only integers are allowed.
    #[error("floating-point number at {path} cannot be hashed")]
    #[diagnostic(
        code(cordon::canonical::float),
        help("store durations as integer milliseconds and sizes as integer bytes")
    )]
    Float {
        /// JSON-pointer-like location of the float.
        path: String,
    },
    /// A digest string was not `sha256:` followed by 64 lowercase hex digits.
    #[error("malformed digest {text:?}")]
    #[diagnostic(
        code(cordon::canonical::digest),
        help("a digest is written sha256:<64 lowercase hex digits>")
    )]
    ParseDigest {
        /// The text that was given.
        text: String,
    },
    /// A file could not be read while hashing it.
    #[error("cannot read {path} to hash it")]
    #[diagnostic(code(cordon::canonical::read))]
    ReadFile {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// A SHA-256 digest, printed and parsed as `sha256:<hex>`.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Digest([u8; 32]);

impl Digest {
    /// The digest of raw bytes, without a domain (for file contents and archives, whose
    /// identity is their bytes).
    #[must_use]
    pub fn of_bytes(bytes: &[u8]) -> Self {
        Self(Sha256::digest(bytes).into())
    }

    /// The digest of a file's bytes, streamed.
    ///
    /// # Errors
    /// [`CanonicalError::ReadFile`] when the file cannot be opened or read.
    pub fn of_file(path: &Path) -> Result<Self, CanonicalError> {
        let read_err = |source| CanonicalError::ReadFile {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::open(path).map_err(read_err)?;
        Self::of_reader(file).map(|(d, _)| d).map_err(read_err)
    }

    /// The digest of everything a reader yields, and how many bytes that was.
    ///
    /// # Errors
    /// The reader's error.
    pub fn of_reader(mut reader: impl Read) -> std::io::Result<(Self, u64)> {
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 256 * 1024];
        let mut total = 0u64;
        loop {
            let n = reader.read(&mut buf)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            total += n as u64;
        }
        Ok((Self(hasher.finalize().into()), total))
    }

    /// A digest from a finished SHA-256 state (for hashes computed while streaming).
    #[must_use]
    pub fn from_hasher(hasher: Sha256) -> Self {
        Self(hasher.finalize().into())
    }

    /// The 32 bytes.
    #[must_use]
    pub fn bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The lowercase hex digits, without the `sha256:` prefix.
    #[must_use]
    pub fn hex(&self) -> String {
        hex::encode(self.0)
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", self.hex())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FromStr for Digest {
    type Err = CanonicalError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = || CanonicalError::ParseDigest {
            text: text.to_owned(),
        };
        let hex_part = text.strip_prefix("sha256:").ok_or_else(bad)?;
        // Uppercase hex would give two spellings of one digest; only one is accepted.
        if hex_part.len() != 64
            || !hex_part
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        {
            return Err(bad());
        }
        let mut out = [0u8; 32];
        hex::decode_to_slice(hex_part, &mut out).map_err(|_| bad())?;
        Ok(Self(out))
    }
}

impl Serialize for Digest {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Digest {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// Serialize `value` to canonical JSON text.
///
/// # Errors
/// [`CanonicalError::Serialize`] when serde fails, [`CanonicalError::Float`] when the value
/// holds a floating-point number.
pub fn to_canonical_json<T: Serialize + ?Sized>(value: &T) -> Result<String, CanonicalError> {
    let value =
        serde_json::to_value(value).map_err(|source| CanonicalError::Serialize { source })?;
    let mut out = String::new();
    write_canonical(&value, &mut String::new(), &mut out)?;
    Ok(out)
}

fn write_canonical(
    value: &Value,
    path: &mut String,
    out: &mut String,
) -> Result<(), CanonicalError> {
    match value {
        Value::Null | Value::Bool(_) => out.push_str(&value.to_string()),
        // Strings carry candidate text: nothing in one may drive the terminal a receipt is
        // printed on (`\uXXXX` escapes: the same JSON value).
        Value::String(_) => out.push_str(&crate::text::json(&value.to_string())),
        Value::Number(n) => {
            if n.is_f64() {
                return Err(CanonicalError::Float { path: path.clone() });
            }
            out.push_str(&n.to_string());
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                let len = path.len();
                path.push_str(&format!("/{i}"));
                write_canonical(item, path, out)?;
                path.truncate(len);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort_unstable();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&crate::text::json(&Value::String(key.clone()).to_string()));
                out.push(':');
                let len = path.len();
                path.push('/');
                path.push_str(key);
                write_canonical(&map[key], path, out)?;
                path.truncate(len);
            }
            out.push('}');
        }
    }
    Ok(())
}

#[derive(Serialize)]
struct Envelope<'a, T: ?Sized> {
    domain: &'a str,
    schema: u32,
    payload: &'a T,
}

/// The domain-separated digest `sha256(canonical({"domain", "schema", "payload"}))`.
///
/// # Errors
/// As [`to_canonical_json`].
pub fn domain_digest<T: Serialize + ?Sized>(
    domain: &str,
    schema: u32,
    payload: &T,
) -> Result<Digest, CanonicalError> {
    let text = to_canonical_json(&Envelope {
        domain,
        schema,
        payload,
    })?;
    Ok(Digest::of_bytes(text.as_bytes()))
}

/// A digest in JSON is its text, `sha256:` and 64 lowercase hex digits.
#[cfg(feature = "schema")]
impl schemars::JsonSchema for Digest {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Digest".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "pattern": "^sha256:[0-9a-f]{64}$"
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keys_are_sorted_and_whitespace_dropped() {
        let v = json!({"b": 1, "a": {"d": [1, 2], "c": "x"}});
        assert_eq!(
            to_canonical_json(&v).unwrap(),
            r#"{"a":{"c":"x","d":[1,2]},"b":1}"#
        );
    }

    #[test]
    fn floats_are_refused_with_their_path() {
        let v = json!({"a": [1, {"b": 1.5}]});
        let err = to_canonical_json(&v).unwrap_err();
        assert!(
            matches!(err, CanonicalError::Float { ref path } if path == "/a/1/b"),
            "{err:?}"
        );
    }

    #[test]
    fn domains_separate_equal_payloads() {
        let a = domain_digest("cordon.a", 1, &json!({"x": 1})).unwrap();
        let b = domain_digest("cordon.b", 1, &json!({"x": 1})).unwrap();
        let a2 = domain_digest("cordon.a", 2, &json!({"x": 1})).unwrap();
        assert_ne!(a, b);
        assert_ne!(a, a2);
    }

    #[test]
    fn digest_round_trips_and_rejects_other_spellings() {
        let d = Digest::of_bytes(b"abc");
        assert_eq!(
            d.to_string(),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(d.to_string().parse::<Digest>().unwrap(), d);
        for bad in [
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
            "sha256:BA7816BF8F01CFEA414140DE5DAE2223B00361A396177A9CB410FF61F20015AD",
            "sha256:ba78",
            "sha512:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
        ] {
            assert!(bad.parse::<Digest>().is_err(), "{bad} was accepted");
        }
    }

    #[test]
    fn file_digest_matches_byte_digest() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let bytes = vec![7u8; 200_000];
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(Digest::of_file(&path).unwrap(), Digest::of_bytes(&bytes));
    }
}
