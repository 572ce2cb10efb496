//! The host's workload: what the engine is asked, in which order, and which requests are timed.
//! The engine sees only the requests the host sends; the file is identified by its digest.
//!
//! Format (JSON, unknown fields refused): `{"version": 1, "warmup": W, "conditioning": C,
//! "requests": [{"prompt": [ids…], "tokens": N}, …]}` — the first `W` requests warm up, the
//! next `C` condition, the rest are timed; at least one is timed.

use std::path::Path;

use cordon::canonical::Digest;
use cordon::receipt::LanePhase as Phase;
use serde::{Deserialize, Serialize};

/// The largest workload file read.
pub const MAX_BYTES: u64 = 64 << 20;

/// One request of the plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Item {
    /// The prompt's token ids.
    pub prompt: Vec<u32>,
    /// How many tokens the engine must produce.
    pub tokens: u32,
}

/// A workload file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    /// The format version (1).
    pub version: u32,
    /// Requests that warm the engine up (not timed).
    pub warmup: u32,
    /// Requests that condition it (measured separately, not timed).
    pub conditioning: u32,
    /// Every request, in order.
    pub requests: Vec<Item>,
}

/// Why a workload cannot be used (a usage error: the operator's input).
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum WorkloadError {
    /// It cannot be read.
    #[error("cannot read the workload {path}")]
    #[diagnostic(code(cordon::lane::workload))]
    Read {
        /// The file.
        path: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// It is not a workload.
    #[error("the workload {path} is not valid: {why}")]
    #[diagnostic(
        code(cordon::lane::workload),
        help(
            "{{\"version\": 1, \"warmup\": W, \"conditioning\": C, \"requests\": [{{\"prompt\": [1, 2], \"tokens\": 4}}]}}, with at least one timed request"
        )
    )]
    Invalid {
        /// The file.
        path: String,
        /// Why.
        why: String,
    },
}

impl Workload {
    /// Read and check a workload file; returns it with the sha256 of its bytes.
    ///
    /// # Errors
    /// The file cannot be read or is not a workload.
    pub fn load(path: &Path) -> Result<(Self, Digest), WorkloadError> {
        let shown = path.display().to_string();
        let read = |source| WorkloadError::Read {
            path: shown.clone(),
            source,
        };
        let invalid = |why: String| WorkloadError::Invalid {
            path: shown.clone(),
            why,
        };
        let file = std::fs::File::open(path).map_err(read)?;
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut std::io::Read::take(file, MAX_BYTES + 1), &mut bytes)
            .map_err(read)?;
        if bytes.len() as u64 > MAX_BYTES {
            return Err(invalid(format!("it is larger than {MAX_BYTES} bytes")));
        }
        let w: Self = serde_json::from_slice(&bytes).map_err(|e| invalid(e.to_string()))?;
        w.check().map_err(invalid)?;
        Ok((w, Digest::of_bytes(&bytes)))
    }

    fn check(&self) -> Result<(), String> {
        if self.version != 1 {
            return Err(format!("version {} is not 1", self.version));
        }
        let untimed = u64::from(self.warmup) + u64::from(self.conditioning);
        if untimed >= self.requests.len() as u64 {
            return Err("no request is timed".into());
        }
        if u32::try_from(self.requests.len()).is_err() {
            return Err("too many requests".into());
        }
        if let Some(i) = self.requests.iter().position(|r| r.tokens == 0) {
            return Err(format!("request {i} asks for no tokens"));
        }
        Ok(())
    }

    /// Whether every frame the plan implies fits the stage's frame bounds: the host's stream
    /// carries the posture, `ready`, one response per request and the worker's report; the
    /// largest request or response is two words and one per prompt or output token.
    ///
    /// # Errors
    /// What does not fit.
    pub fn fits(&self, max_bytes: u32, max_frames: u64) -> Result<(), String> {
        let frames = self.requests.len() as u64 + 3;
        if frames > max_frames {
            return Err(format!(
                "{} requests need {frames} frames, over the stage's max-frames {max_frames}",
                self.requests.len()
            ));
        }
        for (i, r) in self.requests.iter().enumerate() {
            let words = 2 + r.prompt.len().max(r.tokens as usize) as u64;
            if words * 4 > u64::from(max_bytes) {
                return Err(format!(
                    "request {i} needs frames of {} bytes, over the stage's max-bytes {max_bytes}",
                    words * 4
                ));
            }
        }
        Ok(())
    }

    /// The phase of request `index`.
    #[must_use]
    pub fn phase(&self, index: usize) -> Phase {
        let i = index as u64;
        if i < u64::from(self.warmup) {
            Phase::Warmup
        } else if i < u64::from(self.warmup) + u64::from(self.conditioning) {
            Phase::Conditioning
        } else {
            Phase::Timed
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> Result<Workload, WorkloadError> {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("w.json");
        std::fs::write(&p, text).unwrap();
        Workload::load(&p).map(|(w, _)| w)
    }

    #[test]
    fn phases_follow_the_counts_and_a_workload_needs_a_timed_request() {
        let w = load(r#"{"version":1,"warmup":1,"conditioning":1,"requests":[{"prompt":[1],"tokens":2},{"prompt":[],"tokens":1},{"prompt":[3],"tokens":1}]}"#).unwrap();
        assert_eq!(
            (0..3).map(|i| w.phase(i)).collect::<Vec<_>>(),
            [Phase::Warmup, Phase::Conditioning, Phase::Timed]
        );
        for bad in [
            r#"{"version":1,"warmup":1,"conditioning":0,"requests":[{"prompt":[1],"tokens":2}]}"#,
            r#"{"version":2,"warmup":0,"conditioning":0,"requests":[{"prompt":[1],"tokens":2}]}"#,
            r#"{"version":1,"warmup":0,"conditioning":0,"requests":[{"prompt":[1],"tokens":0}]}"#,
            r#"{"version":1,"warmup":0,"conditioning":0,"requests":[{"prompt":[-1],"tokens":2}]}"#,
            r#"{"version":1,"warmup":0,"conditioning":0,"requests":[],"timeout":1}"#,
        ] {
            assert!(
                matches!(load(bad), Err(WorkloadError::Invalid { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_workload_must_fit_the_stages_frame_bounds() {
        let w = load(r#"{"version":1,"warmup":0,"conditioning":0,"requests":[{"prompt":[1,2,3],"tokens":6},{"prompt":[1],"tokens":2}]}"#).unwrap();
        // Two requests: posture, ready, two responses, the report; the largest is 2 + 6 words.
        w.fits(32, 5).unwrap();
        assert!(w.fits(32, 4).unwrap_err().contains("max-frames"));
        assert!(w.fits(31, 5).unwrap_err().contains("max-bytes"));
    }
}
