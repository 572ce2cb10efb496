//! The candidate's audit (role A), run by the referee after the qualification and before the
//! quiescence gate: the policy's `audit` section asks for it (see [`cordon_evidence::audit`]).
//!
//! The host draws the sampled requests from the qualification's own workload (its bytes
//! re-hashed to the digest the qualification recorded), with the operating system's randomness
//! at audit time, distinct and shuffled; the candidate's build runs them in a session of its own
//! (the lane's stage and protocol, its own lease; on C's lane when the lanes name GPUs, else on
//! no physical lane) one at a time, with no
//! warm-up or conditioning before the first: eager and untimed. Its receipt is an `audit`
//! receipt, whose outputs carry no windows and no rates, so no speed computation can read it.
//!
//! What it does not own: regrading (after T, in the referee), the final rule.

use std::io::Write;

use cordon::canonical::Digest;
use cordon::receipt::{Decision, Outcome, Receipt, Role, StageName};
use cordon_evidence::audit::{Audit, AuditInputs, AuditOutputs};
use cordon_evidence::verdict::{Gone, VerdictInputs};
use cordon_lane::lock::GpuLock;
use cordon_lane::session::{Inputs, session_under};
use cordon_lane::workload::Workload;
use rand::SeedableRng;

use crate::referee::{Given, Referee, RefereeError, no, post_digest};

/// How the audit session ended.
#[derive(Debug, Clone)]
pub enum Ended {
    /// The candidate answered: its outputs object.
    Served(Digest),
    /// The candidate broke the session: its reason.
    Rejected {
        /// The session's reason code.
        code: String,
        /// For people.
        reason: String,
    },
}

/// The audit as the referee goes on with it.
#[derive(Debug, Clone)]
pub struct AuditRun {
    /// The audit receipt.
    pub receipt: Digest,
    /// The workload requests sampled, in the order sent.
    pub sample: Vec<u32>,
    /// Its lease and post device receipt, which the quiescence receipt names as gone.
    pub gone: Option<Gone>,
    /// How it ended.
    pub ended: Ended,
}

/// `k` distinct request numbers below `n`, in a random order. The workload's own opening order
/// (`0, 1, …, k-1`) is drawn again whenever another draw exists: an engine that answers by its
/// position in a workload it memorised never passes an audit by position.
#[must_use]
pub fn draw(rng: &mut impl rand::Rng, n: u32, k: u32) -> Vec<u32> {
    loop {
        let s: Vec<u32> = rand::seq::index::sample(rng, n as usize, k as usize)
            .into_iter()
            // Below n, a u32.
            .map(|i| u32::try_from(i).unwrap_or(u32::MAX))
            .collect();
        if n == 1 || s.iter().enumerate().any(|(p, &i)| p as u64 != u64::from(i)) {
            return s;
        }
    }
}

/// The audit's own workload: the sampled requests in the order drawn, all sent with no warm-up
/// or conditioning before them.
///
/// # Errors
/// The policy samples more requests than the workload holds (the operator's wiring).
fn plan(workload: &Workload, audit: &Audit) -> Result<(Vec<u32>, Workload), RefereeError> {
    let n = u32::try_from(workload.requests.len())
        .map_err(|_| no("the workload has too many requests"))?;
    let k = u32::try_from(audit.requests)
        .ok()
        .filter(|&k| k <= n)
        .ok_or_else(|| {
            RefereeError::Usage(format!(
                "the policy's audit samples {} requests; the qualification's workload has {n}",
                audit.requests
            ))
        })?;
    let mut rng = rand::rngs::StdRng::from_os_rng();
    let sample = draw(&mut rng, n, k);
    let requests = sample
        .iter()
        .map(|&i| workload.requests[i as usize].clone())
        .collect();
    Ok((
        sample,
        Workload {
            version: 1,
            warmup: 0,
            conditioning: 0,
            requests,
        },
    ))
}

impl Referee<'_> {
    /// Run the candidate's audit under `lock` and store its receipt (recorded in `recorded`).
    ///
    /// # Errors
    /// What could not be established (the workload changed, the session's no-decision), or
    /// the operator's wiring.
    pub fn audit(
        &self,
        given: &Given,
        c: &cordon::receipt::LaneOutputs,
        audit: &Audit,
        lock: &GpuLock,
        recorded: &mut VerdictInputs,
        stderr: &mut dyn Write,
    ) -> Result<AuditRun, RefereeError> {
        let (workload, digest) = Workload::load(&given.inputs.workload)
            .map_err(|e| no(format!("the qualification's workload: {e}")))?;
        // The sample comes from the very workload the candidate was qualified on.
        if digest != given.outputs.workload {
            return Err(no(format!(
                "the workload {} is not the one the qualification read ({digest}, not {})",
                given.inputs.workload.display(),
                given.outputs.workload
            )));
        }
        let (sample, plan) = plan(&workload, audit)?;
        let bytes = serde_json::to_vec(&plan).map_err(|e| no(format!("the audit plan: {e}")))?;
        let plan_digest = self
            .cfg
            .store
            .put_object(&bytes)
            .map_err(|e| no(format!("storing the audit plan: {e}")))?;
        let inputs = Inputs {
            role: Role::A,
            tree: c.tree,
            publication: c.publication,
            workload: self.cfg.store.object_path(&plan_digest, false),
            model: given.inputs.model.clone(),
            lane: crate::referee::gpu_lane(self.policy, &given.outputs.orientation.candidate),
        };
        let session = session_under(self.policy, self.cfg, &inputs, lock);
        let mut receipt = Receipt::new(StageName::Audit, self.cfg.authority, Outcome::Ok);
        receipt.prev = Some(given.qualify);
        receipt
            .set_inputs(&AuditInputs {
                qualify: given.qualify,
                tree: c.tree,
                publication: c.publication,
                workload: given.inputs.workload.clone(),
                model: given.inputs.model.clone(),
                sample: sample.clone(),
                plan: plan_digest,
            })
            .map_err(|e| no(e.to_string()))?;
        let result = session.map(|d| match d {
            Decision::Accepted(o) => Decision::Accepted(AuditOutputs {
                tree: o.tree,
                publication: o.publication,
                model: o.model,
                plan: o.workload,
                worker: o.worker,
                posture: o.posture,
                step: o.step,
                sample: sample.clone(),
                outputs: o.outputs,
                meta: o.meta,
                lease: o.lease,
                launch: o.launch,
                devices: o.devices,
            }),
            Decision::Rejected(r) => Decision::Rejected(r),
        });
        let (digest, served, (code, reason)) =
            self.store_session(&mut receipt, result, "audit", stderr)?;
        recorded.audit = Some(digest);
        let (gone, ended) = match (receipt.outcome, served) {
            (Outcome::Ok, Some(o)) => {
                if (o.plan, o.model) != (plan_digest, given.outputs.model) {
                    return Err(no(
                        "the audit session read another plan or model than the host gave it",
                    ));
                }
                let post = post_digest(&o.devices)?;
                (
                    Some(Gone {
                        read: "A".to_owned(),
                        lease: o.lease,
                        post,
                    }),
                    Ended::Served(o.outputs),
                )
            }
            (Outcome::Rejected, _) => (None, Ended::Rejected { code, reason }),
            (outcome, _) => {
                return Err(no(format!(
                    "the audit session is {} (receipt {digest}): {code}: {reason}",
                    outcome.as_str()
                )));
            }
        };
        Ok(AuditRun {
            receipt: digest,
            sample,
            gone,
            ended,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_draw_is_distinct_in_range_and_never_the_workloads_opening_order() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut firsts = std::collections::BTreeSet::new();
        for _ in 0..2000 {
            let s = draw(&mut rng, 3, 2);
            assert_eq!(s.len(), 2);
            assert!(s.iter().all(|&i| i < 3) && s[0] != s[1], "{s:?}");
            assert_ne!(s, [0, 1], "the opening order is drawn again");
            firsts.insert(s[0]);
        }
        // Shuffled: every request can come first.
        assert_eq!(firsts.len(), 3);
        // The whole workload, shuffled, is never in its own order; one request of one is.
        for _ in 0..200 {
            assert_ne!(draw(&mut rng, 4, 4), [0, 1, 2, 3]);
        }
        assert_eq!(draw(&mut rng, 1, 1), [0]);
    }
}
