//! The referee's records (seed 001 §5): what the pristine reference session T established, the
//! quiescence it started after, and the final verdict that combines speed, quality and
//! quiescence — with [`decide`], the pure rule `cordon-reference` applies and `cordon-verify`
//! recomputes.
//!
//! T returns primitive evidence only (its output tokens, stored as an object named by digest)
//! and no verdict. The final verdict grades the candidate's outputs (C) and the incumbent's (B
//! and B′) against T's under the policy's quality rule:
//! - the incumbent disagreeing with T beyond the rule makes the whole qualification a
//!   no-decision: the reference or the baseline is broken, not the candidate;
//! - otherwise the candidate's speed FAIL or quality FAIL is a FAIL (proven and its own), and
//!   so is an audit (when the policy asks for one, [`crate::audit`]) that the candidate broke
//!   or whose outputs regrade below the rule;
//! - a policy that requires a reproduction (`reproduction "required"`) gets a PASS only over a
//!   reproduction and its primary attempt, both graded and both weighed, whose pair settles:
//!   either attempt's proven failure is a FAIL (one attempt given alone included); a single
//!   attempt that would pass, or a pair that does not settle, is a no-decision;
//! - otherwise PASS.
//!
//! A final verdict that could not be established (T did not serve, quiescence was not proven,
//! an output object is missing or edited) is a no-decision receipt, with no outputs of this
//! shape at all.

use std::path::PathBuf;

use cordon_canon::canonical::{CanonicalError, Digest, domain_digest};
use serde::{Deserialize, Serialize};

use crate::audit::{Audit, AuditOutcome, AuditRecord};
use crate::qualify::{Reads, Settlement};
use crate::quality::{Quality, QualityRecord, QualityVerdict};
use crate::receipt::{DeviceReceipts, StageName, StageOutputs};
use crate::speed::{SpeedRecord, Verdict};

/// One of the qualification's reads that the quiescence receipt names as gone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Gone {
    /// The read (`B`, `C`, `B′`; `primary B`… for a reproduction's primary attempt; `A`).
    pub read: String,
    /// Its lease.
    pub lease: String,
    /// The digest of its post device receipt, as its session receipt holds it.
    pub post: Digest,
}

/// What `cordon-reference` was given.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReferenceInputs {
    /// The pristine tree's registration receipt.
    pub pristine: Digest,
    /// The pristine tree (the policy's pin).
    pub tree: Digest,
    /// The control-only publication.
    pub publication: Digest,
    /// The workload file (the qualification's).
    pub workload: PathBuf,
    /// The model directory (the qualification's).
    pub model: PathBuf,
    /// The quiescence receipt T started after.
    pub quiescence: Digest,
}

/// What the pristine reference session established: its launch and its outputs, no verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReferenceOutputs {
    /// The pristine tree it mounted.
    pub tree: Digest,
    /// The control-only publication it mounted.
    pub publication: Digest,
    /// The model.
    pub model: Digest,
    /// The workload.
    pub workload: Digest,
    /// The worker's installed bytes.
    pub worker: Digest,
    /// The posture frame's payload as received (it holds what the worker saw from inside).
    pub posture: Digest,
    /// The registered engine step.
    pub step: String,
    /// Requests answered.
    pub requests: u64,
    /// The outputs object: every request's tokens.
    pub outputs: Digest,
    /// The container's meta record.
    pub meta: crate::receipt::Meta,
    /// The lease it ran under.
    pub lease: String,
    /// Its launch digest.
    pub launch: Digest,
    /// What the host observed of the devices.
    pub devices: DeviceReceipts,
    /// The quiescence receipt it started after.
    pub quiescence: Digest,
}

impl StageOutputs for ReferenceOutputs {
    const STAGE: StageName = StageName::Reference;
}

/// What the final verdict was given.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct VerdictInputs {
    /// The qualification (its `prev` too).
    pub qualify: Digest,
    /// The pristine tree's registration receipt.
    pub pristine: Digest,
    /// The audit receipt, once stored (when the policy asks for an audit).
    pub audit: Option<Digest>,
    /// The quiescence receipt, once stored.
    pub quiescence: Option<Digest>,
    /// The reference session's receipt, once stored.
    pub reference: Option<Digest>,
}

/// The final verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Final {
    /// Speed and quality pass.
    Pass,
    /// A candidate-attributable failure is proven.
    Fail,
}

/// Every number the final verdict rests on, and the verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct VerdictOutputs {
    /// The qualification.
    pub qualify: Digest,
    /// The reference session.
    pub reference: Digest,
    /// The quiescence receipt T started after.
    pub quiescence: Digest,
    /// The qualification's speed record.
    pub speed: SpeedRecord,
    /// The quality rule's digest (what the authority reviewed).
    pub quality_policy: Digest,
    /// The quality rule itself.
    pub quality_section: Quality,
    /// T's outputs object.
    pub reference_outputs: Digest,
    /// The graded reads' outputs objects.
    pub outputs: Reads<Digest>,
    /// B, C and B′ graded against T.
    pub graded: Reads<QualityRecord>,
    /// The audit plan the policy asked for (none: no audit).
    pub audit_section: Option<Audit>,
    /// The audit, when the policy asked for one.
    pub audit: Option<AuditRecord>,
    /// The policy requires a reproduction (`reproduction "required"`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reproduction_required: bool,
    /// The primary attempt, graded, when the qualification is its reproduction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary: Option<Primary>,
    /// Whether the qualification settles (a CPU rehearsal never does).
    pub settling: bool,
    /// Why not, when it does not.
    pub non_settling: Option<String>,
    /// The verdict.
    pub verdict: Final,
    /// Its reason code.
    pub code: String,
    /// For people.
    pub reason: String,
}

/// A reproduction's primary attempt as the final verdict weighs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Primary {
    /// Its qualify receipt (the reproduction's `reproduces`).
    pub qualify: Digest,
    /// Its speed record.
    pub speed: SpeedRecord,
    /// Its reads' outputs objects.
    pub outputs: Reads<Digest>,
    /// Its reads graded against T.
    pub graded: Reads<QualityRecord>,
    /// How the pair settles, as the reproduction recorded it.
    pub settlement: Settlement,
}

/// The reproduction a final verdict weighs: whether the policy requires one, and the primary
/// attempt when the qualification is a reproduction.
#[derive(Debug, Clone, Copy, Default)]
pub struct Pairing<'a> {
    /// `reproduction "required"`.
    pub required: bool,
    /// The primary attempt.
    pub primary: Option<&'a Primary>,
}

impl StageOutputs for VerdictOutputs {
    const STAGE: StageName = StageName::Verdict;
}

/// The digest of a quality rule, as the final verdict names it.
///
/// # Errors
/// Encoding failed.
pub fn quality_policy_digest(rule: &Quality) -> Result<Digest, CanonicalError> {
    domain_digest("cordon.quality-policy", 1, rule)
}

/// The final verdict's rule: `Ok((verdict, code, reason))`, or `Err(reason)` for a
/// no-decision.
///
/// # Errors
/// The incumbent disagrees with the reference (in either attempt): no valid authority for this
/// qualification; or the policy requires a reproduction and there is none, or it does not
/// settle.
pub fn decide(
    speed: &SpeedRecord,
    graded: &Reads<QualityRecord>,
    audit: Option<&AuditOutcome>,
    pairing: Pairing<'_>,
) -> Result<(Final, String, String), String> {
    // Every attempt the verdict rests on, the primary first, each with how a reason names it.
    let attempts: Vec<(&str, &SpeedRecord, &Reads<QualityRecord>)> = match pairing.primary {
        Some(p) => vec![
            ("the primary attempt: ", &p.speed, &p.graded),
            ("the reproduction: ", speed, graded),
        ],
        None => vec![("", speed, graded)],
    };
    for (which, _, g) in &attempts {
        for (read, g) in [("B", &g.b), ("B′", &g.b2)] {
            if g.verdict != QualityVerdict::Pass {
                return Err(format!(
                    "quality.baseline: {which}the incumbent's read {read} disagrees with the pristine reference ({}: {}): the reference or the baseline is broken, not the candidate",
                    g.code, g.reason
                ));
            }
        }
    }
    for (which, s, _) in &attempts {
        match s.verdict {
            Verdict::Pass => {}
            Verdict::Fail => {
                return Ok((Final::Fail, s.code.clone(), format!("{which}{}", s.reason)));
            }
            // The host could not measure: never the candidate's failure.
            Verdict::NoDecision => return Err(format!("{}: {which}{}", s.code, s.reason)),
        }
    }
    for (which, _, g) in &attempts {
        if g.c.verdict != QualityVerdict::Pass {
            return Ok((
                Final::Fail,
                g.c.code.clone(),
                format!("{which}{}", g.c.reason),
            ));
        }
    }
    match audit {
        Some(AuditOutcome::Served { graded: g, .. }) if g.verdict != QualityVerdict::Pass => {
            return Ok((
                Final::Fail,
                "audit.mismatch".to_owned(),
                format!(
                    "the audited outputs disagree with the reference ({}: {}; audit requests in the order sent)",
                    g.code, g.reason
                ),
            ));
        }
        Some(AuditOutcome::Rejected { code, reason }) => {
            return Ok((
                Final::Fail,
                "audit.rejected".to_owned(),
                format!("the candidate broke its audit session ({code}: {reason})"),
            ));
        }
        Some(AuditOutcome::Served { .. }) | None => {}
    }
    // What a PASS needs beyond one attempt; a proven failure above needs none of it.
    match pairing.primary {
        None if pairing.required => Err(
            "verdict.reproduction: the policy requires a reproduction and this qualification is a primary attempt: qualify again with --reproduce and give the reproduction's receipt"
                .to_owned(),
        ),
        Some(p) if pairing.required && !p.settlement.settles => Err(format!(
            "verdict.unsettled: the policy requires a settled reproduction and the pair with primary attempt {} does not settle (both attempts must pass on settling reads)",
            p.qualify
        )),
        Some(_) => Ok((
            Final::Pass,
            "verdict.pass".to_owned(),
            format!(
                "faster ({}) and every output within the quality rule ({}), in the primary attempt and its reproduction",
                speed.code, graded.c.code
            ),
        )),
        None => Ok((
            Final::Pass,
            "verdict.pass".to_owned(),
            format!(
                "faster ({}) and every output within the quality rule ({})",
                speed.code, graded.c.code
            ),
        )),
    }
}

impl crate::inputs::StageInputs for ReferenceInputs {
    const STAGE: StageName = StageName::Reference;
}

impl crate::inputs::StageInputs for VerdictInputs {
    const STAGE: StageName = StageName::Verdict;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quality::grade;

    /// One attempt, under a policy that requires no reproduction.
    fn one() -> Pairing<'static> {
        Pairing::default()
    }

    fn speed(verdict: Verdict) -> SpeedRecord {
        let mut s = crate::examples::qualification(
            &Reads {
                b: crate::examples::session(
                    crate::receipt::Role::B,
                    Digest::of_bytes(b"b"),
                    Digest::of_bytes(b"p"),
                    40,
                ),
                c: crate::examples::session(
                    crate::receipt::Role::C,
                    Digest::of_bytes(b"c"),
                    Digest::of_bytes(b"p"),
                    20,
                ),
                b2: crate::examples::session(
                    crate::receipt::Role::B,
                    Digest::of_bytes(b"b"),
                    Digest::of_bytes(b"p"),
                    40,
                ),
            },
            Reads {
                b: Digest::of_bytes(b"1"),
                c: Digest::of_bytes(b"2"),
                b2: Digest::of_bytes(b"3"),
            },
        )
        .speed;
        s.verdict = verdict;
        s
    }

    #[test]
    fn the_incumbent_disagreeing_with_t_is_a_no_decision_whatever_the_candidate_did() {
        let rule = Quality {
            min_exact_bp: 10_000,
            min_prefix_bp: 10_000,
        };
        let t = vec![vec![1, 2], vec![3, 4]];
        let wrong = vec![vec![1, 2], vec![3, 5]];
        let g = |b: &[Vec<u32>], c: &[Vec<u32>], b2: &[Vec<u32>]| Reads {
            b: grade(&rule, &t, b),
            c: grade(&rule, &t, c),
            b2: grade(&rule, &t, b2),
        };
        let pass = speed(Verdict::Pass);
        assert_eq!(
            decide(&pass, &g(&t, &t, &t), None, one()).unwrap().0,
            Final::Pass
        );
        let (v, code, reason) = decide(&pass, &g(&t, &wrong, &t), None, one()).unwrap();
        assert_eq!((v, code.as_str()), (Final::Fail, "quality.exact"));
        assert!(reason.contains("request 1"), "{reason}");
        // Slower and wrong: the speed FAIL is named first; both are the candidate's.
        let slow = speed(Verdict::Fail);
        assert_eq!(
            decide(&slow, &g(&t, &wrong, &t), None, one()).unwrap().0,
            Final::Fail
        );
        assert_eq!(
            decide(&slow, &g(&t, &t, &t), None, one()).unwrap().0,
            Final::Fail
        );
        for (b, b2) in [(&wrong, &t), (&t, &wrong)] {
            let why = decide(&pass, &g(b, &t, b2), None, one()).unwrap_err();
            assert!(why.starts_with("quality.baseline"), "{why}");
        }
    }

    #[test]
    fn an_audit_the_candidate_broke_or_that_regrades_below_the_rule_is_its_fail() {
        let rule = Quality {
            min_exact_bp: 10_000,
            min_prefix_bp: 10_000,
        };
        let t = vec![vec![1, 2], vec![3, 4]];
        let graded = Reads {
            b: grade(&rule, &t, &t),
            c: grade(&rule, &t, &t),
            b2: grade(&rule, &t, &t),
        };
        let served = |tokens: Vec<Vec<u32>>| AuditOutcome::Served {
            outputs: Digest::of_bytes(b"a"),
            graded: crate::audit::regrade(&rule, &t, &[1, 0], &tokens).unwrap(),
        };
        let pass = speed(Verdict::Pass);
        let right = served(vec![vec![3, 4], vec![1, 2]]);
        assert_eq!(
            decide(&pass, &graded, Some(&right), one()).unwrap().0,
            Final::Pass
        );
        // Right on every timed read, wrong where the host audited it.
        let (v, code, reason) = decide(
            &pass,
            &graded,
            Some(&served(vec![vec![3, 4], vec![1, 9]])),
            one(),
        )
        .unwrap();
        assert_eq!((v, code.as_str()), (Final::Fail, "audit.mismatch"));
        assert!(reason.contains("request 1"), "{reason}");
        let broke = AuditOutcome::Rejected {
            code: "lane.exit".into(),
            reason: "the engine exited".into(),
        };
        let (v, code, _) = decide(&pass, &graded, Some(&broke), one()).unwrap();
        assert_eq!((v, code.as_str()), (Final::Fail, "audit.rejected"));
        // The incumbent disagreeing with T still makes the audit moot: no valid authority.
        let broken_baseline = Reads {
            b: grade(&rule, &t, &[vec![1, 2], vec![3, 5]]),
            ..graded
        };
        let e = decide(&pass, &broken_baseline, Some(&broke), one())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(
                "quality.baseline: the incumbent's read B disagrees with the pristine reference"
            ),
            "{e}"
        );
    }

    #[test]
    fn a_required_reproduction_weighs_both_attempts_and_only_a_settled_pair_passes() {
        let rule = Quality {
            min_exact_bp: 10_000,
            min_prefix_bp: 10_000,
        };
        let t = vec![vec![1, 2], vec![3, 4]];
        let wrong = vec![vec![1, 2], vec![3, 5]];
        let g = |b: &[Vec<u32>], c: &[Vec<u32>]| Reads {
            b: grade(&rule, &t, b),
            c: grade(&rule, &t, c),
            b2: grade(&rule, &t, &t),
        };
        let primary = |speed: SpeedRecord, graded: Reads<QualityRecord>, settles: bool| Primary {
            qualify: Digest::of_bytes(b"primary"),
            speed,
            outputs: Reads {
                b: Digest::of_bytes(b"1"),
                c: Digest::of_bytes(b"2"),
                b2: Digest::of_bytes(b"3"),
            },
            graded,
            settlement: Settlement {
                primary: Digest::of_bytes(b"primary"),
                speedups_bp: [20_000, 19_000],
                speedup_bp: 19_000,
                settles,
            },
        };
        let pass = speed(Verdict::Pass);
        fn required(p: Option<&Primary>) -> Pairing<'_> {
            Pairing {
                required: true,
                primary: p,
            }
        }
        // One attempt where the policy requires two: no authority for a PASS…
        let why = decide(&pass, &g(&t, &t), None, required(None)).unwrap_err();
        assert!(why.starts_with("verdict.reproduction"), "{why}");
        // …while a failure proven in it is the candidate's all the same.
        let (v, code, _) = decide(&pass, &g(&t, &wrong), None, required(None)).unwrap();
        assert_eq!((v, code.as_str()), (Final::Fail, "quality.exact"));
        // A speed record the host could not decide is never the candidate's FAIL.
        let mut undecided = speed(Verdict::NoDecision);
        undecided.code = "speed.noise".into();
        let why = decide(&undecided, &g(&t, &wrong), None, one()).unwrap_err();
        assert!(why.starts_with("speed.noise"), "{why}");
        // A settled pair, both right and faster: PASS, naming both attempts.
        let settled = primary(pass.clone(), g(&t, &t), true);
        let (v, code, reason) = decide(&pass, &g(&t, &t), None, required(Some(&settled))).unwrap();
        assert_eq!((v, code.as_str()), (Final::Pass, "verdict.pass"));
        assert!(reason.contains("reproduction"), "{reason}");
        // Right and faster but unsettled (non-settling reads): no-decision, never a PASS…
        let unsettled = primary(pass.clone(), g(&t, &t), false);
        let why = decide(&pass, &g(&t, &t), None, required(Some(&unsettled))).unwrap_err();
        assert!(why.starts_with("verdict.unsettled"), "{why}");
        // …and never needed when the policy does not require it.
        let optional = Pairing {
            required: false,
            primary: Some(&unsettled),
        };
        assert_eq!(
            decide(&pass, &g(&t, &t), None, optional).unwrap().0,
            Final::Pass
        );
        // Either attempt's proven failure is the candidate's: wrong in the primary only, or
        // slower in it only.
        let wrong_first = primary(pass.clone(), g(&t, &wrong), true);
        let (v, code, reason) =
            decide(&pass, &g(&t, &t), None, required(Some(&wrong_first))).unwrap();
        assert_eq!((v, code.as_str()), (Final::Fail, "quality.exact"));
        assert!(reason.starts_with("the primary attempt: "), "{reason}");
        let slow_first = primary(speed(Verdict::Fail), g(&t, &t), false);
        let (v, _, reason) = decide(&pass, &g(&t, &t), None, required(Some(&slow_first))).unwrap();
        assert_eq!(v, Final::Fail);
        assert!(reason.starts_with("the primary attempt: "), "{reason}");
        let (v, _, reason) = decide(&pass, &g(&t, &wrong), None, required(Some(&settled))).unwrap();
        assert_eq!(v, Final::Fail);
        assert!(reason.starts_with("the reproduction: "), "{reason}");
        // The incumbent disagreeing with T in the primary attempt: no-decision.
        let broken = primary(pass.clone(), g(&wrong, &t), true);
        let why = decide(&pass, &g(&t, &t), None, required(Some(&broken))).unwrap_err();
        assert!(
            why.starts_with("quality.baseline: the primary attempt"),
            "{why}"
        );
    }
}
