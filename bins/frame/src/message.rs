//! The messages frames carry: the engine's (`ready`, `request`, `response`) as fixed binary
//! integers, cordon's own (`posture`, `ended`, `fault`) as JSON with unknown fields refused.
//! What a field means is fixed here, once, for the host, the worker and the example engine.
//!
//! Nothing here is a time: the host stamps frames itself. Token ids are integers; no float is
//! ever part of a message.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize, de::DeserializeOwned};

/// The lane protocol version a posture and a ready frame name.
pub const PROTOCOL: u32 = 1;

/// What the worker established from inside the container before anything of the candidate ran.
/// Facts only: the host decides what they must be.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Posture {
    /// The protocol version the worker speaks.
    pub protocol: u32,
    /// The sha256 of the worker's own installed bytes (`/proc/self/exe`), hex.
    pub worker_sha256: String,
    /// The digest the host sealed into the environment equals `worker_sha256`.
    pub sealed_matches: bool,
    /// Real and effective uid and gid.
    pub uid: u32,
    /// The gid.
    pub gid: u32,
    /// `CapEff` of `/proc/self/status`.
    pub cap_eff: u64,
    /// `CapPrm`.
    pub cap_prm: u64,
    /// `CapBnd`.
    pub cap_bnd: u64,
    /// `CapAmb`.
    pub cap_amb: u64,
    /// `NoNewPrivs`.
    pub no_new_privs: bool,
    /// `Seccomp` (2 = filter mode).
    pub seccomp_mode: u32,
    /// `Seccomp_filters`.
    pub seccomp_filters: u32,
    /// Network interfaces (`/proc/net/dev`).
    pub interfaces: Vec<String>,
    /// Routes in the main IPv4 table (`/proc/net/route`), header excluded.
    pub routes: u32,
    /// The errno of a TCP connect to a documentation address; `None` if it connected.
    pub connect_errno: Option<i32>,
    /// Path → whether it is mounted read-only (statvfs), for every path the host asked about
    /// (`/` among them); a path the worker could not look at is absent.
    pub read_only: BTreeMap<String, bool>,
    /// Cache directory → `ok`, or what failed: made by the worker as the run account, mode
    /// 0700, on the cache mount, a file written, renamed and deleted, a program run from it.
    pub caches: BTreeMap<String, String>,
    /// In the pristine reference session only: the tree and publication as seen from inside.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seen: Option<Seen>,
}

/// What the worker of the pristine reference session sees of its inputs from inside.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Seen {
    /// The tree digest of the tree mount, recomputed from every file (`sha256:…`).
    pub tree: String,
    /// Every name in the publication mount (a control-only publication has none).
    pub publication: Vec<String>,
}

/// One request of the host's workload. Binary on the wire (the engine's hot path, and no
/// parser an engine needs beyond integer decoding): `index`, `tokens`, then each prompt token,
/// every one a big-endian `u32`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// The request's index in the plan.
    pub index: u32,
    /// How many tokens the engine must produce.
    pub tokens: u32,
    /// The prompt, as token ids.
    pub prompt: Vec<u32>,
}

/// The engine's answer to one request, binary like [`Request`]: `index`, `tokens`, then each
/// output token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Response {
    /// The request it answers.
    pub index: u32,
    /// How many tokens the engine says it produced (must equal the plan's and the output's).
    pub tokens: u32,
    /// The tokens.
    pub output: Vec<u32>,
}

/// Why a binary payload is not the message it should be.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PayloadError {
    /// Not a whole number of `u32`s, or fewer than the fixed fields.
    #[error("a {what} payload of {len} bytes is not {fixed} fixed bytes plus whole u32 tokens")]
    Shape {
        /// The message.
        what: &'static str,
        /// The payload's length.
        len: usize,
        /// Its fixed part.
        fixed: usize,
    },
}

fn words(what: &'static str, payload: &[u8], fixed: usize) -> Result<Vec<u32>, PayloadError> {
    if payload.len() < fixed * 4 || !payload.len().is_multiple_of(4) {
        return Err(PayloadError::Shape {
            what,
            len: payload.len(),
            fixed: fixed * 4,
        });
    }
    Ok(payload
        .chunks_exact(4)
        .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

fn put(words: impl IntoIterator<Item = u32>) -> Vec<u8> {
    words.into_iter().flat_map(u32::to_be_bytes).collect()
}

impl Request {
    /// The wire form.
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        put([self.index, self.tokens]
            .into_iter()
            .chain(self.prompt.iter().copied()))
    }

    /// Decode the wire form.
    ///
    /// # Errors
    /// The payload's shape is wrong.
    pub fn decode(payload: &[u8]) -> Result<Self, PayloadError> {
        let w = words("request", payload, 2)?;
        Ok(Self {
            index: w[0],
            tokens: w[1],
            prompt: w[2..].to_vec(),
        })
    }
}

impl Response {
    /// The wire form.
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        put([self.index, self.tokens]
            .into_iter()
            .chain(self.output.iter().copied()))
    }

    /// Decode the wire form.
    ///
    /// # Errors
    /// The payload's shape is wrong.
    pub fn decode(payload: &[u8]) -> Result<Self, PayloadError> {
        let w = words("response", payload, 2)?;
        Ok(Self {
            index: w[0],
            tokens: w[1],
            output: w[2..].to_vec(),
        })
    }
}

/// The engine is initialised: its `ready` payload is the protocol version it speaks, one
/// big-endian `u32`.
///
/// # Errors
/// The payload is not one `u32`.
pub fn ready_protocol(payload: &[u8]) -> Result<u32, PayloadError> {
    match words("ready", payload, 1)?.as_slice() {
        [v] => Ok(*v),
        _ => Err(PayloadError::Shape {
            what: "ready",
            len: payload.len(),
            fixed: 4,
        }),
    }
}

/// The `ready` payload of [`PROTOCOL`].
#[must_use]
pub fn ready_payload() -> Vec<u8> {
    PROTOCOL.to_be_bytes().to_vec()
}

/// How the engine ended, or how it broke the wire, as the worker saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ended {
    /// Its exit code, if it exited.
    pub code: Option<i32>,
    /// The signal that ended it, if one did.
    pub signal: Option<i32>,
    /// The wire violation the worker saw on the engine's stream, if any.
    pub violation: Option<String>,
    /// The registered engine process ended while the host's workload was still open (before the
    /// host closed its stream): whatever answered after that was not it.
    pub early: bool,
    /// The member reports the engine's processes made, in arrival order ([`Member`]).
    pub members: Vec<Member>,
    /// Why the member reports could not all be read (a report that is not one, too many).
    pub member_fault: Option<String>,
}

/// One engine process's member report: the role and rank its validator-owned entry announced
/// before it loaded anything of the candidate (`ROLE RANK` on the worker's member socket, one
/// datagram), with the pid the kernel attached (`SO_PASSCRED`: a process can report only
/// itself). A scheduler rank reports before it loads the engine tree; any other role reports
/// only when something tried to load candidate code in it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Member {
    /// The reporting process, in the container's pid namespace.
    pub pid: u32,
    /// Its role (`scheduler`, or a role that must not load candidate code).
    pub role: String,
    /// Its rank.
    pub rank: u32,
}

/// The most member reports the worker reads.
pub const MAX_MEMBERS: usize = 256;

/// The scheduler role: the one process role that loads candidate code.
pub const SCHEDULER: &str = "scheduler";

/// Parse one member report datagram (`ROLE RANK`: a role of 1 to 32 lowercase letters or
/// hyphens, a rank of at most 4 digits).
///
/// # Errors
/// It is not one, described safely (candidate bytes are never echoed).
pub fn member_report(bytes: &[u8]) -> Result<(String, u32), String> {
    let bad = || {
        format!(
            "a member report of {} bytes that is not `ROLE RANK`",
            bytes.len()
        )
    };
    let text = std::str::from_utf8(bytes).map_err(|_| bad())?;
    let (role, rank) = text.split_once(' ').ok_or_else(bad)?;
    let role_ok =
        (1..=32).contains(&role.len()) && role.bytes().all(|b| b.is_ascii_lowercase() || b == b'-');
    let rank_ok = (1..=4).contains(&rank.len()) && rank.bytes().all(|b| b.is_ascii_digit());
    if !role_ok || !rank_ok {
        return Err(bad());
    }
    Ok((role.to_owned(), rank.parse().map_err(|_| bad())?))
}

/// Why the member reports are not exactly `ranks` scheduler ranks (`None`: they are): every
/// report a scheduler's, ranks `0..ranks` each once, no process twice, no fault reading them.
/// Candidate code loaded in a role that must not load it, a rank missing or doubled, and a
/// process reporting twice are the engine's doing.
#[must_use]
pub fn coverage(members: &[Member], fault: Option<&str>, ranks: u32) -> Option<String> {
    if let Some(f) = fault {
        return Some(format!("the member reports: {f}"));
    }
    if let Some(m) = members.iter().find(|m| m.role != SCHEDULER) {
        return Some(format!(
            "candidate code was loaded in process {} of role {}, which must not load it",
            m.pid, m.role
        ));
    }
    let mut pids: Vec<u32> = members.iter().map(|m| m.pid).collect();
    pids.sort_unstable();
    if let Some(p) = pids.windows(2).find(|w| w[0] == w[1]) {
        return Some(format!("process {} reported twice", p[0]));
    }
    let mut seen: Vec<u32> = members.iter().map(|m| m.rank).collect();
    seen.sort_unstable();
    if seen != (0..ranks).collect::<Vec<_>>() {
        return Some(format!(
            "the scheduler ranks that loaded candidate code are {seen:?}, not each of 0 to {} once",
            ranks.saturating_sub(1)
        ));
    }
    None
}

/// The worker could not do its job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fault {
    /// What failed.
    pub what: String,
}

/// Encode a message as a payload.
///
/// # Errors
/// Serialization failed (never for these types).
pub fn to_payload<T: Serialize>(m: &T) -> Result<Vec<u8>, serde_json::Error> {
    serde_json::to_vec(m)
}

/// Decode a payload as a message (hostile input: unknown fields and wrong types refused).
///
/// # Errors
/// The payload is not that message.
pub fn from_payload<T: DeserializeOwned>(payload: &[u8]) -> Result<T, serde_json::Error> {
    serde_json::from_slice(payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_report_is_role_and_rank_and_nothing_else() {
        assert_eq!(
            member_report(b"scheduler 0").unwrap(),
            ("scheduler".into(), 0)
        );
        assert_eq!(
            member_report(b"detokenizer 12").unwrap(),
            ("detokenizer".into(), 12)
        );
        for bad in [
            &b""[..],
            b"scheduler",
            b"scheduler  0",
            b"scheduler 0 ",
            b"Scheduler 0",
            b"sched\x1b[2J 0",
            b"scheduler -1",
            b"scheduler 12345",
            b"\xff 0",
            b"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa 0",
        ] {
            let e = member_report(bad).unwrap_err();
            // Never echoed: only its length.
            assert!(e.starts_with("a member report of "), "{e}");
            assert!(!e.contains('\x1b'), "{e}");
        }
    }

    #[test]
    fn coverage_is_exactly_each_scheduler_rank_once_by_distinct_processes() {
        let m = |pid, role: &str, rank| Member {
            pid,
            role: role.into(),
            rank,
        };
        let two = [m(7, SCHEDULER, 1), m(5, SCHEDULER, 0)];
        assert_eq!(coverage(&two, None, 2), None);
        assert_eq!(coverage(&[m(5, SCHEDULER, 0)], None, 1), None);
        for (members, fault, ranks, why) in [
            (
                vec![m(5, SCHEDULER, 0)],
                None,
                2,
                "are [0], not each of 0 to 1 once",
            ),
            (two.to_vec(), None, 1, "are [0, 1], not each of 0 to 0 once"),
            (vec![], None, 1, "are [], not each of 0 to 0 once"),
            (
                vec![m(5, SCHEDULER, 0), m(6, SCHEDULER, 0)],
                None,
                2,
                "are [0, 0]",
            ),
            (
                vec![m(5, SCHEDULER, 0), m(5, SCHEDULER, 1)],
                None,
                2,
                "process 5 reported twice",
            ),
            (
                vec![m(5, SCHEDULER, 0), m(9, "detokenizer", 0)],
                None,
                1,
                "process 9 of role detokenizer, which must not load it",
            ),
            (
                two.to_vec(),
                Some("too many"),
                2,
                "the member reports: too many",
            ),
        ] {
            let got = coverage(&members, fault, ranks).unwrap_or_default();
            assert!(got.contains(why), "{members:?}: {got}");
        }
    }

    #[test]
    fn binary_messages_round_trip_and_refuse_ragged_payloads() {
        let r = Response {
            index: 3,
            tokens: 2,
            output: vec![7, 8],
        };
        assert_eq!(Response::decode(&r.encode()).unwrap(), r);
        let q = Request {
            index: 1,
            tokens: 4,
            prompt: vec![],
        };
        assert_eq!(Request::decode(&q.encode()).unwrap(), q);
        assert!(Response::decode(&[0; 7]).is_err(), "too short");
        assert!(Response::decode(&[0; 13]).is_err(), "not whole tokens");
        assert_eq!(ready_protocol(&ready_payload()).unwrap(), PROTOCOL);
        let e = ready_protocol(&[0; 8]).unwrap_err().to_string();
        assert!(
            e.contains("is not 4 fixed bytes plus whole u32 tokens"),
            "{e}"
        );
    }

    #[test]
    fn json_messages_refuse_unknown_fields() {
        assert!(
            from_payload::<Fault>(br#"{"what":"x","elapsed_ms":1}"#).is_err(),
            "nothing can slip a field of its own into a message"
        );
        let e = from_payload::<Ended>(br#"{"code":1.5,"signal":null,"violation":null}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("expected i32"), "{e}");
    }
}
