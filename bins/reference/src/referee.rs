//! The referee's steps after a qualification, in order:
//! 1. **The pristine tree.** The tree T runs is the policy's pin, registered on its own (a
//!    registration receipt whose chain starts at an incumbent registration, never a delta's);
//!    it is neither the qualification's incumbent nor its candidate, verifies in the store and
//!    holds no delta manifest. Anything else is refused before launch.
//! 2. **A control-only publication.** T mounts the publication with no entries at all (made
//!    here, named by its digest), checked before launch by the session and again from inside
//!    by the worker, which also recomputes the tree digest it sees.
//! 3. **The audit**, when the policy asks for one ([`crate::audit`]): the candidate answers
//!    host-drawn requests in an untimed session of its own; its receipt is stored and linked.
//!    From here to T's end the referee holds the host's GPU lock once: nothing runs between.
//! 4. **Candidate destruction first.** As the executor's one manager, before T's lease begins,
//!    the executor must be strictly quiescent: nothing of B, C, B′, the audit or any other
//!    session left. The quiescence receipt names the reads' and the audit's leases and post
//!    device receipts as gone and is stored before T starts; residue stops T.
//! 5. **T.** One session of role T in the `reference` stage and protocol; its receipt (outputs
//!    object by digest, no verdict) is stored and linked.
//! 6. **Grading.** B, C and B′'s outputs objects and T's, re-read from the store and re-hashed,
//!    graded by the policy's quality rule, and the audit's regraded against T's for the same
//!    workload requests; the final verdict by [`cordon_evidence::verdict::decide`].
//!
//! What cannot be established — T not serving, residue, an output object missing or edited, an
//! incumbent that disagrees with T — is a no-decision; only the candidate's proven failures
//! (speed, quality, a broken or mismatched audit) are a FAIL.

use std::io::Write;

use cordon::canonical::Digest;
use cordon::exit::ExitClass;
use cordon::receipt::{
    Decision, IncumbentOutputs, LaneAssignment, LaneOutputs, Outcome, Receipt, Rejection, Role,
    StageName,
};
use cordon::residue::ReapOutputs;
use cordon::tree::{self, PUBLICATIONS};
use cordon_evidence::audit::{AuditOutcome, AuditRecord, regrade};
use cordon_evidence::inputs::{QualifyInputs, ReapInputs};
use cordon_evidence::qualify::{QualifyOutputs, Reads};
use cordon_evidence::quality::grade;
use cordon_evidence::verdict::{
    self, Gone, ReferenceInputs, ReferenceOutputs, VerdictInputs, VerdictOutputs,
};
use cordon_lane::lock::GpuLock;
use cordon_lane::session::{Config, Inputs, LaneError, session_gated};
use cordon_policy_lang::Policy;
use cordon_stage::args::Diagnostics;
use cordon_stage::receipt_io as stage;

use crate::audit::{AuditRun, Ended};

/// The delta manifest's name: a tree that holds one anywhere carries a contribution.
const DELTA_MANIFEST: &str = "cordon-delta.kdl";

/// Why the referee could not establish a verdict (exit 3), or the operator's wiring (exit 2).
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum RefereeError {
    /// The operator's inputs: the pristine registration, the policy's pins or rule.
    #[error("{0}")]
    #[diagnostic(code(cordon::reference::usage))]
    Usage(String),
    /// No valid quality authority, or a verdict that cannot be established.
    #[error("{0}")]
    #[diagnostic(code(cordon::reference::no_decision))]
    NoDecision(String),
    /// The reference session failed.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Lane(#[from] LaneError),
}

impl ExitClass for RefereeError {
    fn exit_class(&self) -> cordon::ExitCode {
        match self {
            Self::Usage(_) => cordon::ExitCode::Usage,
            Self::NoDecision(_) => cordon::ExitCode::NoDecision,
            Self::Lane(e) => e.exit_class(),
        }
    }
}

impl stage::Infrastructure for RefereeError {
    fn reason_code(&self) -> &'static str {
        "reference.no-decision"
    }
}

pub(crate) fn no(why: impl Into<String>) -> RefereeError {
    RefereeError::NoDecision(why.into())
}

/// What the referee was given, established by the CLI: the qualification and the pristine
/// registration, each the store's copy under this authority.
#[derive(Debug)]
pub struct Given {
    /// The qualify receipt's digest.
    pub qualify: Digest,
    /// Its outputs.
    pub outputs: QualifyOutputs,
    /// Its inputs (the workload and model T reads).
    pub inputs: QualifyInputs,
    /// The pristine registration receipt's digest.
    pub pristine: Digest,
    /// The tree it registered.
    pub tree: Digest,
    /// The primary attempt, when the qualification is its reproduction: its receipt's digest
    /// and outputs (the store's copy, `ok`, under this authority).
    pub primary: Option<(Digest, QualifyOutputs)>,
}

/// Step 1: the pristine registration checked against the policy's pin.
///
/// # Errors
/// The policy pins no pristine tree, or the receipt is not a registration of the pinned tree.
pub fn pristine_tree(policy: &Policy, registration: &Receipt) -> Result<Digest, RefereeError> {
    let pin = policy.pristine_pin().ok_or_else(|| {
        RefereeError::Usage("the policy pins no pristine reference tree (pristine digest=…)".into())
    })?;
    if !cordon::chain::starts_incumbent_chain(registration) {
        return Err(RefereeError::Usage(
            "the pristine receipt is not a tree registration (cordon-materialize incumbent DIR): a delta's tree carries a contribution".into(),
        ));
    }
    let tree = registration
        .outputs_as::<IncumbentOutputs>()
        .map_err(|e| RefereeError::Usage(format!("the pristine registration: {e}")))?
        .tree_digest;
    if &tree != pin {
        return Err(RefereeError::Usage(format!(
            "the pristine registration registers tree {tree}; the policy pins {pin}"
        )));
    }
    Ok(tree)
}

/// Where the referee works and reports.
pub struct Referee<'a> {
    /// The policy.
    pub policy: &'a Policy,
    /// The stage configuration (store, images, lease setup, authority, key).
    pub cfg: &'a Config,
    /// Diagnostics mode.
    pub mode: Diagnostics,
}

/// Where a session after the qualification runs: on `lane`, when the policy gives it GPUs (the
/// audit on C's lane, T on B's: a GPU read is only ever guarded on its lane's GPUs); on no
/// physical lane when the lanes are CPU sets (nothing is measured there).
#[must_use]
pub fn gpu_lane(policy: &Policy, lane: &LaneAssignment) -> Option<LaneAssignment> {
    policy
        .physical_lanes()
        .get(&lane.name)
        .is_some_and(|l| !l.gpus.is_empty())
        .then(|| lane.clone())
}

/// The three reads' session receipts, their outputs.
fn reads(cfg: &Config, q: &QualifyOutputs) -> Result<Reads<LaneOutputs>, RefereeError> {
    let one = |name: &str, d: &Digest| {
        cordon::chain::load(&cfg.store, d)
            .map_err(|e| no(format!("read {name}'s session receipt: {e}")))?
            .outputs_as::<LaneOutputs>()
            .map_err(|e| no(format!("read {name}'s outputs: {e}")))
    };
    Ok(Reads {
        b: one("B", &q.sessions.b)?,
        c: one("C", &q.sessions.c)?,
        b2: one("B′", &q.sessions.b2)?,
    })
}

/// The reads a quiescence receipt names as gone: each read's lease and post device receipt,
/// named `B`, `C`, `B′` with `prefix` before (the primary attempt's).
fn gone(prefix: &str, read: &Reads<LaneOutputs>) -> Result<Vec<Gone>, RefereeError> {
    [("B", &read.b), ("C", &read.c), ("B′", &read.b2)]
        .into_iter()
        .map(|(name, o)| {
            Ok(Gone {
                read: format!("{prefix}{name}"),
                lease: o.lease.clone(),
                post: post_digest(&o.devices)?,
            })
        })
        .collect()
}

/// A stored session receipt: its digest, the outputs when it served, and its first reason
/// (code, message) when it did not.
pub(crate) type Stored<T> = (Digest, Option<T>, (String, String));

/// The digest of a session's post device receipt, as the quiescence receipt names it.
pub(crate) fn post_digest(
    devices: &cordon::receipt::DeviceReceipts,
) -> Result<Digest, RefereeError> {
    cordon::canonical::domain_digest("cordon.device-receipt", 1, &devices.post)
        .map_err(|e| no(format!("a post device receipt: {e}")))
}

/// An outputs object from the store, re-hashed and decoded.
fn tokens(cfg: &Config, whose: &str, d: &Digest) -> Result<Vec<Vec<u32>>, RefereeError> {
    let bytes = cfg
        .store
        .read_object_checked(d)
        .map_err(|e| no(format!("{whose}'s outputs object {d}: {e}")))?;
    cordon_evidence::outputs::decode(&bytes)
        .map_err(|e| no(format!("{whose}'s outputs object {d}: {e}")))
}

impl Referee<'_> {
    /// A receipt the final verdict links, stored and signed with this host's key.
    pub(crate) fn store_linked<T: serde::Serialize, E: stage::Infrastructure + 'static>(
        &self,
        receipt: &mut Receipt,
        result: Result<Decision<T>, E>,
        stderr: &mut dyn Write,
    ) -> Result<Digest, String> {
        receipt.evidence = self.cfg.evidence.take();
        stage::store_linked(
            &self.cfg.store,
            &self.cfg.key_dir,
            receipt,
            result,
            (self.mode, stderr),
        )
    }

    /// Store a session's receipt, its `result` already in this stage's outputs: its digest, the
    /// outputs when the session served, and its first reason (code, message) when it did not.
    pub(crate) fn store_session<T: serde::Serialize + Clone>(
        &self,
        receipt: &mut Receipt,
        result: Result<Decision<T>, LaneError>,
        what: &str,
        stderr: &mut dyn Write,
    ) -> Result<Stored<T>, RefereeError> {
        let served = match &result {
            Ok(Decision::Accepted(o)) => Some(o.clone()),
            _ => None,
        };
        let digest = self
            .store_linked(receipt, result, stderr)
            .map_err(|e| no(format!("the {what} receipt: {e}")))?;
        let why = receipt
            .reasons
            .first()
            .map_or_else(Default::default, |r| (r.code.clone(), r.message.clone()));
        Ok((digest, served, why))
    }

    /// Steps 1 (store side) and 2: the pinned tree verifies, is neither role's and holds no
    /// delta manifest; the control-only publication exists. Its digest.
    fn plan(&self, given: &Given, read: &Reads<LaneOutputs>) -> Result<Digest, RefereeError> {
        for (role, o) in [("incumbent", &read.b), ("candidate", &read.c)] {
            if o.tree == given.tree {
                return Err(no(format!(
                    "the pristine tree {} is the qualification's {role} tree: T would not be independent of it",
                    given.tree
                )));
            }
        }
        // The record only: T's session verifies the whole tree before launch.
        let record = tree::load(&self.cfg.store, &given.tree)
            .map_err(|e| no(format!("the pristine tree: {e}")))?;
        if let Some(e) = record
            .entries
            .iter()
            .find(|e| e.path == DELTA_MANIFEST || e.path.ends_with(&format!("/{DELTA_MANIFEST}")))
        {
            return Err(no(format!(
                "the pristine tree holds a delta manifest ({}): it carries a contribution",
                e.path
            )));
        }
        let publication = tree::publish_in(
            &self.cfg.store,
            PUBLICATIONS,
            Vec::new(),
            tree::Control::ControlOnly {
                purpose: "the pristine reference session".into(),
            }
            .to_origin()
            .map_err(|e| no(format!("the control-only publication: {e}")))?,
        )
        .map_err(|e| no(format!("the control-only publication: {e}")))?;
        Ok(publication.digest)
    }

    /// Step 4, as the gate of T's session: the strict quiescence check, its receipt stored
    /// whatever it found (residue item by item, as `cordon-reap --check` records it). Its digest, and what was left (residue stops T).
    fn quiescence(
        &self,
        manager: &cordon::lease::Manager,
        gone: &[Gone],
    ) -> Result<(Digest, Vec<String>), RefereeError> {
        let left = manager
            .check()
            .map_err(|e| no(format!("the quiescence check: {e}")))?;
        let gone = gone.to_vec();
        let remaining: Vec<String> = left.iter().map(ToString::to_string).collect();
        let mut receipt = Receipt::new(StageName::Reap, self.cfg.authority, Outcome::Ok);
        let setup = &self.cfg.setup;
        receipt
            .set_inputs(&ReapInputs {
                executor: setup.executor.clone(),
                check: true,
                status: false,
                sweep: false,
                surface_state: None,
                ..ReapInputs::default()
            })
            .map_err(|e| no(e.to_string()))?;
        let quiescent = remaining.is_empty();
        // Residue is recorded as `cordon-reap --check` records it: one `reap.residue` reason
        // per item and the items themselves in the outputs, so an operator reads what was left.
        if !quiescent {
            receipt.outcome = Outcome::NoDecision;
            receipt.reasons = remaining
                .iter()
                .map(|item| cordon::receipt::Reason {
                    code: "reap.residue".to_owned(),
                    message: item.clone(),
                })
                .collect();
        }
        receipt
            .set_outputs(&ReapOutputs {
                quiescent,
                released: None,
                active: Some(Vec::new()),
                remaining,
                gone,
                ..ReapOutputs::default()
            })
            .map_err(|e| no(format!("the quiescence receipt: {e}")))?;
        let digest = stage::emit_signed(
            &self.cfg.store,
            &self.cfg.key_dir,
            &mut receipt,
            &mut std::io::sink(),
        )
        .map_err(|e| no(format!("the quiescence receipt: {e}")))?;
        Ok((digest, left.iter().map(ToString::to_string).collect()))
    }

    /// Steps 4 and 5: T after proven quiescence of every session in `gone`, under `lock`, its
    /// receipt stored. Its outputs and the two receipts' digests are recorded in `recorded` as
    /// they exist.
    fn reference(
        &self,
        given: &Given,
        gone: &[Gone],
        publication: Digest,
        lock: &GpuLock,
        recorded: &mut VerdictInputs,
        stderr: &mut dyn Write,
    ) -> Result<ReferenceOutputs, RefereeError> {
        let inputs = Inputs {
            role: Role::T,
            tree: given.tree,
            publication,
            workload: given.inputs.workload.clone(),
            model: given.inputs.model.clone(),
            lane: gpu_lane(self.policy, &given.outputs.orientation.baseline),
        };
        let mut quiescence = None;
        let mut gate_err = None;
        let session = session_gated(self.policy, self.cfg, &inputs, lock, |m| {
            let refused = match self.quiescence(m, gone) {
                Ok((d, left)) => {
                    quiescence = Some(d);
                    (!left.is_empty()).then(|| {
                        no(format!(
                            "the executor is not quiescent before the reference session (quiescence receipt {d}): {}",
                            left.join("; ")
                        ))
                    })
                }
                Err(e) => Some(e),
            };
            match refused {
                None => Ok(()),
                Some(e) => {
                    let why = e.to_string();
                    gate_err = Some(e);
                    Err(LaneError::NoDecision(why))
                }
            }
        });
        recorded.quiescence = quiescence;
        if let Some(e) = gate_err {
            return Err(e);
        }
        let Some(quiescence) = quiescence else {
            return Err(match session {
                Err(e) => e.into(),
                Ok(_) => no("the reference session ran without its gate"),
            });
        };
        let mut receipt = Receipt::new(StageName::Reference, self.cfg.authority, Outcome::Ok);
        receipt.prev = Some(given.qualify);
        receipt
            .set_inputs(&ReferenceInputs {
                pristine: given.pristine,
                tree: given.tree,
                publication,
                workload: inputs.workload.clone(),
                model: inputs.model.clone(),
                quiescence,
            })
            .map_err(|e| no(e.to_string()))?;
        let result = session.map(|d| match d {
            Decision::Accepted(o) => Decision::Accepted(ReferenceOutputs {
                tree: o.tree,
                publication: o.publication,
                model: o.model,
                workload: o.workload,
                worker: o.worker,
                posture: o.posture,
                step: o.step,
                requests: o.windows.len() as u64,
                outputs: o.outputs,
                meta: o.meta,
                lease: o.lease,
                launch: o.launch,
                devices: o.devices,
                quiescence,
            }),
            Decision::Rejected(r) => Decision::Rejected(r),
        });
        let (digest, served, (code, message)) =
            self.store_session(&mut receipt, result, "reference", stderr)?;
        recorded.reference = Some(digest);
        let o = served.ok_or_else(|| {
            no(format!(
                "the reference session is {} (receipt {digest}): no valid quality authority: {code}: {message}",
                receipt.outcome.as_str()
            ))
        })?;
        // T answered the qualification's own workload on its own model, or it is no reference.
        if (o.workload, o.model) != (given.outputs.workload, given.outputs.model) {
            return Err(no(
                "the reference session read another workload or model than the qualification",
            ));
        }
        Ok(o)
    }

    /// The audit regraded against T's outputs for the requests it sampled.
    fn regrade(
        &self,
        rule: &cordon_evidence::quality::Quality,
        reference: &[Vec<u32>],
        a: AuditRun,
    ) -> Result<AuditRecord, RefereeError> {
        let outcome = match a.ended {
            Ended::Served(outputs) => AuditOutcome::Served {
                outputs,
                graded: regrade(
                    rule,
                    reference,
                    &a.sample,
                    &tokens(self.cfg, "A", &outputs)?,
                )
                .map_err(no)?,
            },
            Ended::Rejected { code, reason } => AuditOutcome::Rejected { code, reason },
        };
        Ok(AuditRecord {
            receipt: a.receipt,
            sample: a.sample,
            outcome,
        })
    }

    /// The whole referee: the final verdict's decision, and what it rests on in `recorded`,
    /// under one hold of the host's GPU lock (with the lanes' GPUs through NVML when they name
    /// any).
    ///
    /// # Errors
    /// What could not be established (no-decision), or the operator's wiring.
    pub fn verdict(
        &self,
        given: &Given,
        recorded: &mut VerdictInputs,
        stderr: &mut dyn Write,
    ) -> Result<Decision<VerdictOutputs>, RefereeError> {
        self.verdict_with(given, recorded, stderr, &|| {
            cordon_lane::lock::acquire_for(self.policy, &self.cfg.setup.lock_dir)
        })
    }

    /// [`Referee::verdict`] under the lock `lock` takes once the plan is checked (a test's
    /// holds scripted GPUs).
    ///
    /// # Errors
    /// As [`Referee::verdict`].
    pub fn verdict_with(
        &self,
        given: &Given,
        recorded: &mut VerdictInputs,
        stderr: &mut dyn Write,
        lock: &dyn Fn() -> Result<GpuLock, String>,
    ) -> Result<Decision<VerdictOutputs>, RefereeError> {
        let rule = self
            .policy
            .quality()
            .ok_or_else(|| RefereeError::Usage("the policy has no quality section".into()))?;
        let quality_policy = verdict::quality_policy_digest(rule)
            .map_err(|e| no(format!("the quality rule's digest: {e}")))?;
        let read = reads(self.cfg, &given.outputs)?;
        let publication = self.plan(given, &read)?;
        // One hold of the host's GPU lock from the audit to T's end: nothing runs between.
        let lock = lock().map_err(no)?;
        let audit = match self.policy.audit() {
            Some(a) => Some(self.audit(given, &read.c, a, &lock, recorded, stderr)?),
            None => None,
        };
        // Every session of the primary attempt, the reproduction and the audit must be gone.
        let mut left = match &given.primary {
            Some((_, first)) => gone("primary ", &reads(self.cfg, first)?)?,
            None => Vec::new(),
        };
        left.extend(gone("", &read)?);
        left.extend(audit.as_ref().and_then(|a| a.gone.clone()));
        let t = self.reference(given, &left, publication, &lock, recorded, stderr)?;
        drop(lock);
        let q = &given.outputs;
        let reference = tokens(self.cfg, "T", &t.outputs)?;
        let graded_of = |prefix: &str, o: &Reads<Digest>| -> Result<_, RefereeError> {
            let of = |name: &str, d: &Digest| {
                Ok::<_, RefereeError>(grade(
                    rule,
                    &reference,
                    &tokens(self.cfg, &format!("{prefix}{name}"), d)?,
                ))
            };
            Ok(Reads {
                b: of("B", &o.b)?,
                c: of("C", &o.c)?,
                b2: of("B′", &o.b2)?,
            })
        };
        let graded = graded_of("", &q.outputs)?;
        let primary = match (&given.primary, &q.settlement) {
            (Some((digest, first)), Some(settlement)) => Some(verdict::Primary {
                qualify: *digest,
                speed: first.speed.clone(),
                outputs: first.outputs.clone(),
                graded: graded_of("the primary attempt's ", &first.outputs)?,
                settlement: settlement.clone(),
            }),
            (None, None) => None,
            _ => return Err(no("a reproduction without its settlement, or the reverse")),
        };
        let audit = audit
            .map(|a| self.regrade(rule, &reference, a))
            .transpose()?;
        let pairing = verdict::Pairing {
            required: self.policy.reproduction_required(),
            primary: primary.as_ref(),
        };
        let (verdict, code, reason) = verdict::decide(
            &q.speed,
            &graded,
            audit.as_ref().map(|a| &a.outcome),
            pairing,
        )
        .map_err(no)?;
        let outputs = VerdictOutputs {
            qualify: given.qualify,
            reference: recorded
                .reference
                .ok_or_else(|| no("the reference receipt was not recorded"))?,
            quiescence: t.quiescence,
            speed: q.speed.clone(),
            quality_policy,
            quality_section: rule.clone(),
            reference_outputs: t.outputs,
            outputs: q.outputs.clone(),
            graded,
            audit_section: self.policy.audit().cloned(),
            audit,
            reproduction_required: pairing.required,
            primary,
            settling: q.settling,
            non_settling: q.non_settling.clone(),
            verdict,
            code,
            reason,
        };
        Ok(match outputs.verdict {
            verdict::Final::Pass => Decision::Accepted(outputs),
            verdict::Final::Fail => Decision::Rejected(Rejection::one(
                &outputs.code.clone(),
                outputs.reason.clone(),
                serde_json::to_value(&outputs).map_err(|e| no(format!("the evidence: {e}")))?,
            )),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(gpus: bool) -> Policy {
        let text =
            std::fs::read_to_string(cordon_testkit::workspace_root().join("policy/evaluator.kdl"))
                .unwrap();
        let text = if gpus {
            cordon_testkit::with_gpu_lanes(&text)
        } else {
            text
        };
        cordon_policy_lang::parse("t.kdl", &text).unwrap()
    }

    #[test]
    fn the_audit_and_t_take_their_lanes_only_when_the_lanes_have_gpus() {
        let cpu = policy(false);
        let o = cordon_lane::qualify::primary(&cpu).unwrap();
        assert_eq!(gpu_lane(&cpu, &o.candidate), None);
        let gpu = policy(true);
        let o = cordon_lane::qualify::primary(&gpu).unwrap();
        assert_eq!(gpu_lane(&gpu, &o.candidate), Some(o.candidate.clone()));
        assert_eq!(gpu_lane(&gpu, &o.baseline), Some(o.baseline.clone()));
        // A lane the policy does not declare gets none.
        let mut other = o.baseline;
        other.name = "z".into();
        assert_eq!(gpu_lane(&gpu, &other), None);
    }
}
