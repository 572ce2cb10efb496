//! The quality verdict (seed 001 §5): an engine's outputs graded against the pristine reference
//! T's, request by request, so a candidate that answers fast with wrong tokens cannot pass.
//!
//! Input: the policy's reviewed `quality` section and two output streams — one list of output
//! token ids per request of the host's workload, in plan order — the reference's and the
//! graded engine's (the candidate C, or the incumbent B, whose disagreement with T is the
//! reference's or the baseline's failure, not the candidate's: the caller decides that).
//! Output: a [`QualityRecord`] holding every number that enters the verdict, so [`grade`] run
//! on the stored outputs gives the same record bit for bit. Integers only: shares are basis
//! points (10 000 = all), always rounded down, never in the graded engine's favour.
//!
//! The rules, in the order they apply:
//! 1. The two streams must answer the same requests: a different number of requests is a FAIL
//!    (the graded engine did not answer the workload), never a partial grade.
//! 2. A request matches exactly when its tokens equal the reference's, token for token.
//! 3. A request's agreement is its matched prefix — the leading tokens equal to the
//!    reference's — over the longer of the two outputs, so tokens appended after a correct
//!    answer lower it as much as tokens missing from one. An empty pair agrees fully.
//! 4. PASS when the share of exactly matching requests is at least `min-exact-bp` **and** every
//!    request's agreement is at least `min-prefix-bp`; otherwise FAIL, naming the first request
//!    that does not match exactly. With both floors at 10 000 the rule is exact match.
//!
//! What it does not own: producing or storing the outputs (the lane and the reference
//! session), and what a FAIL of the incumbent means for a qualification (the final verdict).

use serde::{Deserialize, Serialize};

/// All, in basis points.
pub const ALL: u64 = 10_000;

/// The reviewed quality rule (seed 001 §5), integers only: shares in basis points.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Quality {
    /// The least share of requests whose output must equal the reference's exactly.
    pub min_exact_bp: u64,
    /// The least agreement (matched prefix over the longer output) of every request.
    pub min_prefix_bp: u64,
}

/// The verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum QualityVerdict {
    /// The outputs agree with the reference within the rule.
    Pass,
    /// They do not.
    Fail,
}

/// Every number that enters the verdict, and the verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct QualityRecord {
    /// Requests the reference answered.
    pub requests: u64,
    /// Requests the graded engine answered.
    pub answered: u64,
    /// Requests whose output equals the reference's exactly.
    pub exact: u64,
    /// `exact` over `requests` (floor), basis points.
    pub exact_bp: u64,
    /// The least agreement of any request (floor), basis points; `ALL` when there are none.
    pub least_prefix_bp: u64,
    /// The first request (its index in the plan) whose output is not exactly the reference's.
    pub first_mismatch: Option<u64>,
    /// The verdict.
    pub verdict: QualityVerdict,
    /// Its reason code (`quality.pass`, `quality.requests`, `quality.exact`, `quality.prefix`).
    pub code: String,
    /// For people.
    pub reason: String,
}

/// `part` over `whole` in basis points, rounded down; an empty whole is all.
fn share(part: u64, whole: u64) -> u64 {
    if whole == 0 {
        ALL
    } else {
        // part ≤ whole, so this cannot overflow for any realistic count (u128 for safety).
        u64::try_from(u128::from(part) * u128::from(ALL) / u128::from(whole)).unwrap_or(ALL)
    }
}

/// The agreement of one request: its matched prefix over the longer output, basis points.
#[must_use]
pub fn agreement(reference: &[u32], graded: &[u32]) -> u64 {
    let prefix = reference
        .iter()
        .zip(graded)
        .take_while(|(r, g)| r == g)
        .count();
    let longer = reference.len().max(graded.len());
    share(prefix as u64, longer as u64)
}

/// Grade `graded` against `reference` under `rule` (see the module documentation).
#[must_use]
pub fn grade(rule: &Quality, reference: &[Vec<u32>], graded: &[Vec<u32>]) -> QualityRecord {
    let requests = reference.len() as u64;
    let answered = graded.len() as u64;
    let mut exact = 0u64;
    let mut least_prefix_bp = ALL;
    let mut first_mismatch = None;
    let mut least_at = None;
    for (i, (r, g)) in reference.iter().zip(graded).enumerate() {
        if r == g {
            exact += 1;
        } else if first_mismatch.is_none() {
            first_mismatch = Some(i as u64);
        }
        let a = agreement(r, g);
        if a < least_prefix_bp {
            least_prefix_bp = a;
            least_at = Some(i as u64);
        }
    }
    let exact_bp = share(exact, requests);
    let (verdict, code, reason) = if requests != answered {
        (
            QualityVerdict::Fail,
            "quality.requests",
            format!("{answered} answers to the reference's {requests} requests"),
        )
    } else if exact_bp < rule.min_exact_bp {
        (
            QualityVerdict::Fail,
            "quality.exact",
            format!(
                "{exact} of {requests} requests match the reference exactly ({exact_bp} bp, below {} bp); the first that does not is request {}",
                rule.min_exact_bp,
                first_mismatch.unwrap_or_default()
            ),
        )
    } else if least_prefix_bp < rule.min_prefix_bp {
        (
            QualityVerdict::Fail,
            "quality.prefix",
            format!(
                "request {} agrees with the reference on {least_prefix_bp} bp of its tokens, below {} bp",
                least_at.unwrap_or_default(),
                rule.min_prefix_bp
            ),
        )
    } else {
        (
            QualityVerdict::Pass,
            "quality.pass",
            format!(
                "{exact} of {requests} requests match the reference exactly ({exact_bp} bp); every request agrees on at least {least_prefix_bp} bp"
            ),
        )
    };
    QualityRecord {
        requests,
        answered,
        exact,
        exact_bp,
        least_prefix_bp,
        first_mismatch,
        verdict,
        code: code.into(),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXACT: Quality = Quality {
        min_exact_bp: ALL,
        min_prefix_bp: ALL,
    };

    fn outs(v: &[&[u32]]) -> Vec<Vec<u32>> {
        v.iter().map(|r| r.to_vec()).collect()
    }

    #[test]
    fn the_right_number_of_wrong_tokens_fails_and_names_the_first_request() {
        let t = outs(&[&[1, 2, 3], &[4, 5, 6]]);
        let c = outs(&[&[1, 2, 3], &[9, 9, 9]]);
        let r = grade(&EXACT, &t, &c);
        assert_eq!(r.verdict, QualityVerdict::Fail);
        assert_eq!(
            (r.code.as_str(), r.first_mismatch),
            ("quality.exact", Some(1))
        );
        assert_eq!((r.exact, r.exact_bp, r.least_prefix_bp), (1, 5000, 0));
        assert_eq!(grade(&EXACT, &t, &t).verdict, QualityVerdict::Pass);
    }

    #[test]
    fn agreement_is_the_matched_prefix_over_the_longer_output() {
        assert_eq!(agreement(&[1, 2, 3, 4], &[1, 2, 9, 4]), 5000);
        // Appended tokens lower it as much as missing ones.
        assert_eq!(agreement(&[1, 2], &[1, 2, 3, 4]), 5000);
        assert_eq!(agreement(&[1, 2, 3, 4], &[1, 2]), 5000);
        assert_eq!(agreement(&[], &[]), ALL);
        assert_eq!(agreement(&[1], &[]), 0);
        // Rounded down: 2 of 3 is 6666 bp, never 6667.
        assert_eq!(agreement(&[1, 2, 3], &[1, 2, 0]), 6666);
    }

    /// Each floor admits exactly its value and refuses one basis point less of agreement.
    #[test]
    fn every_floor_admits_its_value_and_refuses_one_below() {
        let t = outs(&[&[1, 1, 1, 1], &[2, 2, 2, 2], &[3, 3, 3, 3], &[4, 4, 4, 4]]);
        // Three of four exact (7500 bp); the fourth agrees on 3 of 4 tokens (7500 bp).
        let c = outs(&[&[1, 1, 1, 1], &[2, 2, 2, 2], &[3, 3, 3, 3], &[4, 4, 4, 0]]);
        let rule = |e, p| Quality {
            min_exact_bp: e,
            min_prefix_bp: p,
        };
        assert_eq!(
            grade(&rule(7500, 7500), &t, &c).verdict,
            QualityVerdict::Pass
        );
        let r = grade(&rule(7501, 7500), &t, &c);
        assert_eq!(
            (r.verdict, r.code.as_str()),
            (QualityVerdict::Fail, "quality.exact")
        );
        let r = grade(&rule(7500, 7501), &t, &c);
        assert_eq!(
            (r.verdict, r.code.as_str()),
            (QualityVerdict::Fail, "quality.prefix")
        );
        assert!(r.reason.contains("request 3"), "{}", r.reason);
        assert_eq!(grade(&rule(0, 0), &t, &c).verdict, QualityVerdict::Pass);
    }

    #[test]
    fn a_different_number_of_answers_fails_whatever_the_floors() {
        let t = outs(&[&[1], &[2]]);
        let lax = Quality {
            min_exact_bp: 0,
            min_prefix_bp: 0,
        };
        for c in [outs(&[&[1]]), outs(&[&[1], &[2], &[3]])] {
            let r = grade(&lax, &t, &c);
            assert_eq!(
                (r.verdict, r.code.as_str()),
                (QualityVerdict::Fail, "quality.requests")
            );
        }
    }

    #[test]
    fn no_requests_is_vacuous_agreement() {
        let r = grade(&EXACT, &[], &[]);
        assert_eq!(
            (r.verdict, r.exact_bp, r.least_prefix_bp),
            (QualityVerdict::Pass, ALL, ALL)
        );
    }

    use proptest::prelude::*;

    fn stream() -> impl Strategy<Value = Vec<Vec<u32>>> {
        prop::collection::vec(prop::collection::vec(0u32..4, 0..12), 0..10)
    }

    proptest! {
        /// Fuzzed output streams: the grade never panics, its numbers stay in range, an
        /// engine graded against itself passes every rule, and under exact match any
        /// difference fails and is named.
        #[test]
        fn grading_is_total_bounded_and_exact_match_is_equality(
            t in stream(),
            c in stream(),
            e in 0u64..=ALL,
            p in 0u64..=ALL,
        ) {
            let rule = Quality { min_exact_bp: e, min_prefix_bp: p };
            let r = grade(&rule, &t, &c);
            prop_assert!(r.exact <= r.requests.min(r.answered));
            prop_assert!(r.exact_bp <= ALL && r.least_prefix_bp <= ALL);
            prop_assert_eq!(grade(&rule, &t, &t).verdict, QualityVerdict::Pass);
            let exact = grade(&EXACT, &t, &c);
            prop_assert_eq!(exact.verdict == QualityVerdict::Pass, t == c);
            if t.len() == c.len() && t != c {
                let first = t.iter().zip(&c).position(|(a, b)| a != b).map(|i| i as u64);
                prop_assert_eq!(exact.first_mismatch, first);
            }
            // Loosening a floor never turns a pass into a fail.
            if r.verdict == QualityVerdict::Pass {
                let looser = Quality { min_exact_bp: e / 2, min_prefix_bp: p / 2 };
                prop_assert_eq!(grade(&looser, &t, &c).verdict, QualityVerdict::Pass);
            }
        }
    }
}
