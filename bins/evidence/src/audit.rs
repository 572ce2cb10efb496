//! The audit role (seed 001 §4: "When a qualification plan requires sampled slot audit, the
//! candidate also runs in a separate eager, untimed role. Its bounded facts are host-regraded
//! and cannot be mixed into the charged speed evidence.").
//!
//! When the policy's `audit` section asks for it, `cordon-reference` runs the candidate's build
//! once more, after its qualification and before T, in a session of its own (role A, its own
//! lease): the host draws the sampled requests from the qualification's workload (not the
//! candidate, and not predictable from the workload: drawn from the operating system's
//! randomness at audit time, in a shuffled order), sends them one at a time with no warm-up and
//! no conditioning, and keeps no timing at all. Its receipt is its own stage, `audit`, whose
//! outputs have no windows and no rates: no speed computation can read it (a qualify receipt or
//! session that names one is refused, by stage, wherever one is read).
//!
//! The host regrades the audited outputs against T's outputs for the same workload requests
//! ([`regrade`]) under the policy's quality rule; a mismatch is the candidate's FAIL.
//!
//! What it does not own: the draw and the session (the referee's), the final rule
//! ([`crate::verdict::decide`]).

use std::path::PathBuf;

use cordon_canon::canonical::Digest;
use serde::{Deserialize, Serialize};

use crate::quality::{Quality, QualityRecord, grade};
use crate::receipt::{DeviceReceipts, Meta, StageName, StageOutputs};

/// The reviewed audit plan (the policy's `audit` section).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Audit {
    /// How many of the workload's requests the host samples (distinct, at least one).
    pub requests: u64,
}

/// What the audit session was given.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AuditInputs {
    /// The qualification whose candidate is audited (the receipt's `prev` too).
    pub qualify: Digest,
    /// The candidate's tree.
    pub tree: Digest,
    /// The candidate's publication.
    pub publication: Digest,
    /// The qualification's workload file the sample is drawn from.
    pub workload: PathBuf,
    /// The model directory (the qualification's).
    pub model: PathBuf,
    /// The workload requests sampled, in the order sent (the audit's request `i` is the
    /// workload's request `sample[i]`).
    pub sample: Vec<u32>,
    /// The audit's own workload (the sampled requests), stored as an object by digest.
    pub plan: Digest,
}

/// What the audit session established: its launch and its outputs, no timing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AuditOutputs {
    /// The candidate's tree it mounted.
    pub tree: Digest,
    /// The candidate's publication it mounted.
    pub publication: Digest,
    /// The model.
    pub model: Digest,
    /// The audit's workload, as the session read it.
    pub plan: Digest,
    /// The worker's installed bytes.
    pub worker: Digest,
    /// The posture frame's payload as received.
    pub posture: Digest,
    /// The registered engine step.
    pub step: String,
    /// The workload requests sampled, in the order sent.
    pub sample: Vec<u32>,
    /// The outputs object: every audited request's tokens.
    pub outputs: Digest,
    /// The container's meta record.
    pub meta: Meta,
    /// The lease it ran under.
    pub lease: String,
    /// Its launch digest.
    pub launch: Digest,
    /// What the host observed of the devices.
    pub devices: DeviceReceipts,
}

impl StageOutputs for AuditOutputs {
    const STAGE: StageName = StageName::Audit;
}

impl crate::inputs::StageInputs for AuditInputs {
    const STAGE: StageName = StageName::Audit;
}

/// How the audit ended, as the final verdict records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub enum AuditOutcome {
    /// The candidate answered; its outputs regraded against T's.
    Served {
        /// The audit's outputs object.
        outputs: Digest,
        /// The regrade.
        graded: QualityRecord,
    },
    /// The candidate broke its audit session (its own failure).
    Rejected {
        /// The session's reason code.
        code: String,
        /// For people.
        reason: String,
    },
}

/// The audit as the final verdict rests on it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AuditRecord {
    /// The audit receipt.
    pub receipt: Digest,
    /// The workload requests sampled, in the order sent.
    pub sample: Vec<u32>,
    /// How it ended.
    pub outcome: AuditOutcome,
}

/// The audited outputs graded against T's outputs for the same workload requests: the audit's
/// request `i` against T's request `sample[i]`. The record's request numbers are the audit's
/// positions.
///
/// # Errors
/// The sample names a request T did not answer, or names one twice (the host's own record is
/// broken: no verdict).
pub fn regrade(
    rule: &Quality,
    reference: &[Vec<u32>],
    sample: &[u32],
    audited: &[Vec<u32>],
) -> Result<QualityRecord, String> {
    let mut seen = std::collections::BTreeSet::new();
    let expected = sample
        .iter()
        .map(|&i| {
            if !seen.insert(i) {
                return Err(format!("the audit samples workload request {i} twice"));
            }
            reference.get(i as usize).cloned().ok_or_else(|| {
                format!(
                    "the audit samples workload request {i}; the reference answered {}",
                    reference.len()
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(grade(rule, &expected, audited))
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXACT: Quality = Quality {
        min_exact_bp: 10_000,
        min_prefix_bp: 10_000,
    };

    #[test]
    fn the_audit_is_graded_against_the_sampled_requests_of_t_in_the_order_sent() {
        let t = vec![vec![0, 0], vec![1, 1], vec![2, 2], vec![3, 3]];
        let g = regrade(&EXACT, &t, &[2, 0], &[vec![2, 2], vec![0, 0]]).unwrap();
        assert_eq!((g.exact, g.code.as_str()), (2, "quality.pass"));
        // The right tokens in the workload's order are wrong for the order the host sent.
        let g = regrade(&EXACT, &t, &[2, 0], &[vec![0, 0], vec![2, 2]]).unwrap();
        assert_eq!(
            (g.first_mismatch, g.code.as_str()),
            (Some(0), "quality.exact")
        );
        // Fewer answers than sampled requests: the audit was not answered.
        let g = regrade(&EXACT, &t, &[2, 0], &[vec![2, 2]]).unwrap();
        assert_eq!(g.code, "quality.requests");
        // The host's record naming a request T never answered, or one twice, is no grade.
        assert!(
            regrade(&EXACT, &t, &[4], &[vec![4, 4]])
                .unwrap_err()
                .contains("request 4")
        );
        assert!(
            regrade(&EXACT, &t, &[1, 1], &[vec![1, 1], vec![1, 1]])
                .unwrap_err()
                .contains("twice")
        );
    }
}
