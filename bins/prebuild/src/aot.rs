//! The sealed-direct-artifact tier's closed compile ABI (seed 001 §3), the host's side.
//!
//! It owns the rest of the ABI beside the compile request ([`cordon_stage::compile`], which the
//! host derives from the tree and gives the patcher on its standard input), and who reads it:
//! - the **result layout**: exactly [`ARTIFACT`] and [`PROFILE`] in staging, nothing else,
//!   the profile at most [`MAX_PROFILE_BYTES`] ([`layout`], on the inventory's metadata only);
//! - the **profile** ([`Profile`], schema [`PROFILE_SCHEMA`]): decoded only by the confined
//!   child [`PROFILE_CHILD`] ([`child_main`]), never by the root process; the parent checks the
//!   child's answer ([`accept`]) against what it knows itself: the request's factory and inputs,
//!   and the artifact's size as the store counted it (its digest is the publication's).
//!
//! It does not run the factory (the patcher's bounded child does) and never loads the artifact.

use cordon::text::printable;
use cordon_stage::compile::{Input, Request};
use serde::{Deserialize, Serialize};

/// The profile's schema.
pub const PROFILE_SCHEMA: &str = "cordon.compile-profile/1";
/// The artifact's path in staging.
pub const ARTIFACT: &str = "result/artifact.bin";
/// The profile's path in staging.
pub const PROFILE: &str = "result/profile.json";
/// The largest profile.
pub const MAX_PROFILE_BYTES: u64 = 64 * 1024;
/// The confined child that decodes a profile (`cordon-prebuild`'s own dispatch key).
pub const PROFILE_CHILD: &str = "aot-profile";
/// The element types an input may declare.
pub const DTYPES: [&str; 8] = [
    "bool", "int8", "int32", "int64", "uint8", "float16", "bfloat16", "float32",
];
/// The most inputs a request or profile names, and dimensions an input has.
const MAX_INPUTS: usize = 16;
const MAX_DIMS: usize = 8;
/// The longest identifier (an input's name, the artifact's entry point).
const MAX_NAME: usize = 64;

/// The artifact's facts a profile states (its digest is the host's to count, never the
/// factory's to state).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArtifactFacts {
    /// Its size.
    pub bytes: u64,
}

/// A profile ([`PROFILE_SCHEMA`]): what the factory says it built.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// [`PROFILE_SCHEMA`].
    pub schema: String,
    /// The request's factory.
    pub factory: String,
    /// The artifact's entry point, an identifier.
    pub entry: String,
    /// The artifact.
    pub artifact: ArtifactFacts,
    /// The inputs it was compiled for: the request's.
    pub inputs: Vec<Input>,
}

/// The confined child's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub enum Answer {
    /// The profile decoded and fits its schema.
    Profile(Profile),
    /// Why it does not.
    Refused(String),
}

/// What staging must hold: exactly the two result files, neither executable (the ABI's result
/// is data), the profile within its bound — from the inventory's paths, sizes and modes alone.
///
/// # Errors
/// What is missing, extra, executable or too large, as a sentence.
pub fn layout<'a>(files: impl IntoIterator<Item = (&'a str, u64, bool)>) -> Result<(), String> {
    let mut seen = Vec::new();
    for (path, size, executable) in files {
        if executable {
            return Err(format!(
                "{} is executable: the result is data",
                printable(path)
            ));
        }
        match path {
            ARTIFACT => {}
            PROFILE if size > MAX_PROFILE_BYTES => {
                return Err(format!(
                    "{PROFILE} is {size} bytes: more than {MAX_PROFILE_BYTES}"
                ));
            }
            PROFILE => {}
            other => {
                return Err(format!(
                    "{} is outside the result layout ({ARTIFACT} and {PROFILE} only)",
                    printable(other)
                ));
            }
        }
        seen.push(path);
    }
    for want in [ARTIFACT, PROFILE] {
        if !seen.contains(&want) {
            return Err(format!("the factory left no {want}"));
        }
    }
    Ok(())
}

fn identifier(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_NAME
        && !s.starts_with(|c: char| c.is_ascii_digit())
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Whether `p` fits its schema beyond its types.
fn fits(p: &Profile) -> Result<(), String> {
    if p.schema != PROFILE_SCHEMA {
        return Err(format!("its schema is not {PROFILE_SCHEMA}"));
    }
    if !identifier(&p.entry) {
        return Err("its entry is not an identifier of at most 64 characters".into());
    }
    if p.inputs.len() > MAX_INPUTS {
        return Err(format!("it names more than {MAX_INPUTS} inputs"));
    }
    for i in &p.inputs {
        if !identifier(&i.name) || !DTYPES.contains(&i.dtype.as_str()) {
            return Err("an input's name is not an identifier or its dtype is not known".into());
        }
        if i.shape.len() > MAX_DIMS || i.shape.iter().any(|d| *d < -1) {
            return Err(format!(
                "an input's shape has more than {MAX_DIMS} extents or one below -1"
            ));
        }
    }
    Ok(())
}

/// Decode `bytes` as a profile: the confined child's work.
#[must_use]
pub fn read(bytes: &[u8]) -> Answer {
    if bytes.len() as u64 > MAX_PROFILE_BYTES {
        return Answer::Refused(format!("it is more than {MAX_PROFILE_BYTES} bytes"));
    }
    match serde_json::from_slice::<Profile>(bytes) {
        Err(e) => Answer::Refused(format!("it is not a {PROFILE_SCHEMA} record: {e}")),
        Ok(p) => match fits(&p) {
            Ok(()) => Answer::Profile(p),
            Err(why) => Answer::Refused(why),
        },
    }
}

/// The confined child's work once it confined itself: answer the one profile on stdin.
#[must_use]
pub fn child_main() -> i32 {
    cordon::confine::answer(|bytes| serde_json::to_vec(&read(&bytes)).unwrap_or_default())
}

/// The child's `answer` checked against what the host knows: the profile fits its schema, names
/// the request's factory and inputs, and states the artifact's size as the store counted it.
///
/// # Errors
/// Why the profile is refused (the candidate's), escaped.
pub fn accept(answer: &[u8], request: &Request, artifact_bytes: u64) -> Result<Profile, String> {
    let p = match serde_json::from_slice::<Answer>(answer) {
        Err(e) => return Err(format!("the profile child's answer does not decode: {e}")),
        Ok(Answer::Refused(why)) => return Err(printable(&why).into_owned()),
        Ok(Answer::Profile(p)) => p,
    };
    // The child decoded candidate bytes: what it says is checked again, never trusted.
    fits(&p)?;
    if p.factory != request.factory {
        return Err(format!(
            "it names factory {}, not the request's {}",
            printable(&p.factory),
            printable(&request.factory)
        ));
    }
    if p.inputs != request.inputs {
        return Err("its inputs are not the request's".into());
    }
    if p.artifact.bytes != artifact_bytes {
        return Err(format!(
            "it states the artifact as {} bytes; the artifact is {artifact_bytes}",
            p.artifact.bytes
        ));
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn honest(artifact: &[u8]) -> (Vec<u8>, Request) {
        let request = Request::for_factory("cordon_c_0123456789ab.aot:build");
        let profile = serde_json::json!({
            "schema": PROFILE_SCHEMA,
            "factory": request.factory,
            "entry": "attend",
            "artifact": { "bytes": artifact.len() },
            "inputs": request.inputs,
        });
        (serde_json::to_vec(&profile).unwrap(), request)
    }

    fn checked(profile: &[u8], request: &Request, artifact_bytes: u64) -> Result<Profile, String> {
        accept(
            &serde_json::to_vec(&read(profile)).unwrap(),
            request,
            artifact_bytes,
        )
    }

    #[test]
    fn an_honest_profile_is_accepted_and_every_mismatch_refused() {
        let (profile, request) = honest(b"code");
        assert_eq!(checked(&profile, &request, 4).unwrap().entry, "attend");
        // Another artifact, another factory, other inputs, an extra field, a bad entry.
        assert!(checked(&profile, &request, 5).is_err());
        let other = Request::for_factory("cordon_c_0123456789ab.aot:other");
        assert!(checked(&profile, &other, 4).is_err());
        let text = String::from_utf8(profile).unwrap();
        for (from, to) in [
            ("\"query\"", "\"keys\""),
            ("\"entry\"", "\"extra\":1,\"entry\""),
            ("\"attend\"", "\"at tend\""),
            ("\"int64\"", "\"complex128\""),
            ("[-1]", "[-2]"),
            ("compile-profile/1", "compile-profile/2"),
        ] {
            let edited = text.replacen(from, to, 1);
            assert_ne!(edited, text);
            assert!(checked(edited.as_bytes(), &request, 4).is_err(), "{edited}");
        }
        // Not JSON, too large, and a lying child's answer.
        assert!(checked(b"\xff{", &request, 4).is_err());
        let big = vec![b' '; usize::try_from(MAX_PROFILE_BYTES).unwrap() + 1];
        assert!(matches!(read(&big), Answer::Refused(_)));
        let mut lie: Profile = serde_json::from_str(&text).unwrap();
        lie.entry = "\u{1b}[2J".into();
        let lie = serde_json::to_vec(&Answer::Profile(lie)).unwrap();
        assert!(accept(&lie, &request, 4).is_err());
    }

    #[test]
    fn the_layout_is_exactly_the_two_result_files() {
        assert!(layout([(ARTIFACT, 9, false), (PROFILE, 10, false)]).is_ok());
        assert!(layout([(ARTIFACT, 9, false)]).is_err());
        assert!(layout([(ARTIFACT, 9, true), (PROFILE, 10, false)]).is_err());
        let extra = [
            (ARTIFACT, 9, false),
            (PROFILE, 10, false),
            ("result/x", 1, false),
        ];
        assert!(layout(extra).is_err());
        assert!(
            layout([
                (ARTIFACT, 9, false),
                (PROFILE, MAX_PROFILE_BYTES + 1, false)
            ])
            .is_err()
        );
    }
}
