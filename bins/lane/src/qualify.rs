//! A speed qualification: the reads B (incumbent), C (candidate) and B′ (incumbent again), in
//! that order, each a whole part-1 session in a fresh container with its own stored receipt,
//! under one authority and one hold of the host's GPU lock (nothing else runs between them);
//! then the host's verdict ([`crate::speed`]).
//!
//! There is no adaptive escalation: B, C, B′ are the only reads, every time (seed 001's "v8").
//! A read that does not serve ends the qualification — a candidate's rejection is the
//! qualification's rejection, an incumbent's rejection or any read's no-decision is a
//! no-decision (the host could not measure, which is never the candidate's failure).
//!
//! Before any verdict the host checks that the three reads differ only where they must: the
//! same launch digest (argv, env, seccomp, mount table by role, devices, limits, image,
//! deadlines, protocol), the same model, workload, worker and step; the tree and publication
//! are the role's, the lane its orientation's. A read whose kernel-allowed CPUs are not its
//! lane's ran on another physical lane: no-decision.
//!
//! Lanes: the primary attempt runs B and B′ on the baseline lane (the policy's first) and C on
//! the candidate lane; `--reproduce` exchanges them and is refused for any other orientation;
//! the pair settles only with two PASSes, at the lower of the two speedups. Only reads on GPU
//! lanes whose device receipts prove each guarded (pinned and drained before and after, inside
//! the envelope while measured: `cordon_evidence::device::unguarded`) settle; on a host whose
//! lanes are CPU sets every receipt is **non-settling**: a CPU rehearsal of the protocol never
//! settles a GPU qualification.
//!
//! Before the first read, with the lock held, nothing may be live in cordon's runtime state
//! (a container of any executor, a dead supervisor's orphan among them): a no-decision.
//!
//! What it does not own: reading and checking the input receipts (the CLI's), one session
//! (the session module's), the arithmetic of the verdict (the speed module's).

use cordon::exit::ExitClass;
use std::io::Write;
use std::path::PathBuf;

use cordon::canonical::{Digest, domain_digest};
use cordon::receipt::{
    Decision, DevicePhase, DeviceReceipts, LaneAssignment, LaneOutputs, Outcome, Receipt,
    Rejection, Role, StageName,
};
use cordon_policy_lang::{Policy, StageKind, cpu_list};
use cordon_stage::args::Diagnostics;
use cordon_stage::receipt_io as stage;
use serde_json::json;

use crate::lock::GpuLock;
use crate::session::{Config, Inputs, LaneError};
use crate::speed::{self, Verdict};
use crate::workload::Workload;
use cordon::inputs::LaneInputs;
pub use cordon_evidence::qualify::{
    Frozen, GuardSection, Orientation, QualifyOutputs, Reads, Settlement, speed_policy_digest,
    unsettled,
};

/// One role's build: what its reads mount, and the prebuild receipt they continue.
#[derive(Debug, Clone)]
pub struct Build {
    /// The engine tree.
    pub tree: Digest,
    /// Its native publication.
    pub publication: Digest,
    /// The prebuild receipt.
    pub receipt: Digest,
}

/// What the qualification asks.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The incumbent's build (B, B′).
    pub incumbent: Build,
    /// The candidate's build (C).
    pub candidate: Build,
    /// The workload file.
    pub workload: PathBuf,
    /// The model directory.
    pub model: PathBuf,
    /// The lanes.
    pub orientation: Orientation,
    /// The primary attempt this one reproduces, and its outputs.
    pub reproduces: Option<(Digest, QualifyOutputs)>,
    /// The frozen values on this host, probed before any read.
    pub frozen: Frozen,
}

/// The values on this host under `policy`, the CDI specs read from `cdi_dirs`.
///
/// # Errors
/// The kernel release cannot be read, or the device policy cannot be encoded.
pub fn frozen(policy: &Policy, cdi_dirs: &[PathBuf]) -> Result<Frozen, LaneError> {
    let kernel_release = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .map_err(|e| LaneError::NoDecision(format!("the kernel release: {e}")))?;
    let devices = policy.stage(StageKind::Lane).map(|s| &s.gpu_device);
    let device_policy = domain_digest(
        "cordon.device-policy",
        1,
        &json!({ "lanes": policy.physical_lanes(), "devices": devices }),
    )
    .map_err(|e| LaneError::NoDecision(format!("the device policy digest: {e}")))?;
    // On GPU lanes: the driver every GPU is pinned to (alike, by the language; each read's
    // guard checks it before and after), and the CDI specs the reads resolve from.
    let gpu_driver = policy
        .physical_lanes()
        .values()
        .flat_map(|l| l.gpus.values())
        .map(|c| c.driver.clone())
        .next();
    let cdi_spec = match gpu_driver {
        None => None,
        Some(_) => {
            let specs = cordon_stage::cdi::read_specs(cdi_dirs)
                .map_err(|e| LaneError::NoDecision(format!("the host's CDI specs: {e}")))?;
            Some(
                cordon_stage::cdi::digest(&cordon_stage::cdi::files(&specs))
                    .map_err(|e| LaneError::NoDecision(format!("the CDI specs' digest: {e}")))?,
            )
        }
    };
    Ok(Frozen {
        kernel_release,
        gpu_driver,
        cdi_spec,
        device_policy,
    })
}

/// The primary orientation: B and B′ on the policy's first lane, C on its second.
///
/// # Errors
/// The policy does not declare two physical lanes (a usage error).
pub fn primary(policy: &Policy) -> Result<Orientation, LaneError> {
    let lanes: Vec<LaneAssignment> = policy
        .physical_lanes()
        .iter()
        .map(|(name, l)| LaneAssignment {
            name: name.clone(),
            cpuset: l.cpuset.clone(),
            cpu_shares: l.cpu_shares,
        })
        .collect();
    match <[LaneAssignment; 2]>::try_from(lanes) {
        Ok([baseline, candidate]) => Ok(Orientation {
            baseline,
            candidate,
        }),
        Err(_) => Err(LaneError::Policy(
            "the policy declares no physical lanes (physical-lane \"a\" cpuset=…, twice)".into(),
        )),
    }
}

/// The orientation of `first`'s reproduction: the exact exchange. A reproduction is not
/// reproduced again (that would be the primary's orientation), nor under another frozen
/// authority (`frozen`, this host's now).
///
/// # Errors
/// `first` is itself a reproduction, its lanes are not this policy's, or a frozen value
/// differs.
pub fn exchanged(
    policy: &Policy,
    first: &QualifyOutputs,
    frozen: &Frozen,
) -> Result<Orientation, LaneError> {
    let differ = frozen.differences(&first.frozen);
    if !differ.is_empty() {
        return Err(LaneError::Policy(format!(
            "the primary attempt ran under another {}",
            differ.join(", ")
        )));
    }
    let p = primary(policy)?;
    if first.reproduces.is_some() || first.orientation != p {
        return Err(LaneError::Policy(
            "only a primary attempt on this policy's lanes is reproduced, in the exchanged orientation"
                .into(),
        ));
    }
    Ok(Orientation {
        baseline: p.candidate,
        candidate: p.baseline,
    })
}

/// A read that ended the qualification before the verdict.
fn stopped(role: &str, outcome: Outcome, digest: &Digest, first_reason: &str) -> String {
    format!(
        "read {role} is {} (session receipt {digest}): {first_reason}",
        outcome.as_str()
    )
}

/// A workload with fewer timed requests than the verdict needs is refused before any read.
fn check_timed(plan: &Plan, speed_policy: &cordon_policy_lang::Speed) -> Result<(), LaneError> {
    let (workload, _) = Workload::load(&plan.workload)?;
    let timed = (0..workload.requests.len())
        .filter(|&i| workload.phase(i) == cordon::receipt::LanePhase::Timed)
        .count() as u64;
    if timed < speed_policy.min_timed_windows {
        return Err(LaneError::Policy(format!(
            "the workload has {timed} timed requests; the speed policy needs at least {}",
            speed_policy.min_timed_windows
        )));
    }
    Ok(())
}

/// The session receipt of read `name`, its inputs set, chained to the build it reads.
fn read_receipt(
    cfg: &Config,
    plan: &Plan,
    name: &str,
    role: Role,
    build: &Build,
    lane: &LaneAssignment,
) -> Result<Receipt, LaneError> {
    let mut receipt = Receipt::new(StageName::Lane, cfg.authority, Outcome::Ok);
    receipt.prev = Some(build.receipt);
    receipt
        .set_inputs(&LaneInputs {
            role,
            read: Some(name.to_owned()),
            tree: build.tree,
            publication: build.publication,
            workload: plan.workload.clone(),
            model: plan.model.clone(),
            lane: Some(lane.clone()),
        })
        .map_err(|e| LaneError::NoDecision(e.to_string()))?;
    Ok(receipt)
}

/// Run the three reads, each with `read` (a real session: [`crate::session::session`]), under
/// one hold of the host's GPU lock (with the lanes' GPUs through NVML when they name any), and
/// decide.
///
/// # Errors
/// What cordon could not establish (no-decision), or the operator's wiring error.
pub fn qualify(
    policy: &Policy,
    cfg: &Config,
    plan: &Plan,
    read: &mut dyn FnMut(&Inputs, &GpuLock) -> Result<crate::session::Outcome, LaneError>,
    mode: Diagnostics,
    stderr: &mut dyn Write,
) -> Result<Decision<QualifyOutputs>, LaneError> {
    qualify_with(policy, cfg, plan, read, mode, stderr, &|| {
        crate::lock::acquire_for(policy, &cfg.setup.lock_dir)
    })
}

/// [`qualify`] under the lock `lock` takes once the plan is checked (a test's holds scripted
/// GPUs).
///
/// # Errors
/// As [`qualify`].
pub fn qualify_with(
    policy: &Policy,
    cfg: &Config,
    plan: &Plan,
    read: &mut dyn FnMut(&Inputs, &GpuLock) -> Result<crate::session::Outcome, LaneError>,
    mode: Diagnostics,
    stderr: &mut dyn Write,
    lock: &dyn Fn() -> Result<GpuLock, String>,
) -> Result<Decision<QualifyOutputs>, LaneError> {
    let speed_policy = policy
        .speed()
        .ok_or_else(|| LaneError::Policy("the policy has no speed section".into()))?;
    let speed_digest = speed_policy_digest(speed_policy)
        .map_err(|e| LaneError::NoDecision(format!("the speed policy digest: {e}")))?;
    check_timed(plan, speed_policy)?;
    // One hold of the host's GPU lock for all three reads: no other read runs between them.
    let lock = lock().map_err(LaneError::NoDecision)?;
    let from_unix_ns = crate::lock::unix_ns();
    nothing_live(cfg)?;
    // The sessions stored so far, named in any no-decision that follows them.
    let mut ran: Vec<(&str, Digest)> = Vec::new();
    let decided = (|| {
        let reads = [
            ("B", Role::B, &plan.incumbent, &plan.orientation.baseline),
            ("C", Role::C, &plan.candidate, &plan.orientation.candidate),
            ("B′", Role::B, &plan.incumbent, &plan.orientation.baseline),
        ];
        let mut done: Vec<(Digest, LaneOutputs)> = Vec::new();
        for (name, role, build, lane) in reads {
            let inputs = Inputs {
                role,
                tree: build.tree,
                publication: build.publication,
                workload: plan.workload.clone(),
                model: plan.model.clone(),
                lane: Some(lane.clone()),
            };
            let mut receipt = read_receipt(cfg, plan, name, role, build, lane)?;
            let result = match read(&inputs, &lock) {
                Err(e) if e.exit_class() == cordon::ExitCode::Usage => return Err(e),
                r => r,
            };
            // Each read's receipt is stored like any session's; only the qualification's is
            // printed.
            // The qualify receipt links only session receipts the store holds.
            receipt.evidence = cfg.evidence.take();
            let digest = stage::store_linked(
                &cfg.store,
                &cfg.key_dir,
                &mut receipt,
                result,
                (mode, stderr),
            )
            .map_err(|e| LaneError::NoDecision(format!("read {name}'s session receipt: {e}")))?;
            ran.push((name, digest));
            let why = receipt
                .reasons
                .first()
                .map_or_else(String::new, |r| format!("{}: {}", r.code, r.message));
            match (receipt.outcome, role) {
                (Outcome::Ok, _) => {}
                // The candidate broke its own session: the qualification's rejection.
                (Outcome::Rejected, Role::C) => {
                    return Ok(Decision::Rejected(Rejection::one(
                        "qualify.candidate",
                        stopped(name, receipt.outcome, &digest, &why),
                        json!({ "session": digest, "read": name }),
                    )));
                }
                (outcome, _) => {
                    return Err(LaneError::NoDecision(stopped(name, outcome, &digest, &why)));
                }
            }
            let outputs = receipt
                .outputs_as::<LaneOutputs>()
                .map_err(|e| LaneError::NoDecision(format!("read {name}'s outputs: {e}")))?;
            check_devices(name, lane, &outputs.devices)?;
            done.push((digest, outputs));
        }
        let [(db, b), (dc, c), (db2, b2)] = <[(Digest, LaneOutputs); 3]>::try_from(done)
            .map_err(|_| LaneError::NoDecision("not every read ran".into()))?;
        same_launch(&b, &c, &b2)?;
        let gpu_lock = lock.span(from_unix_ns);
        drop(lock);
        // A reproduction repeats its primary attempt's launch, workload and model exactly.
        if let Some((_, first)) = &plan.reproduces
            && (first.launch, first.workload, first.model) != (b.launch, b.workload, b.model)
        {
            return Err(LaneError::NoDecision(
            "the reproduction was launched differently from its primary attempt (launch, workload or model)".into(),
        ));
        }
        let record = speed::decide(speed_policy, &b.windows, &c.windows, &b2.windows);
        let guard = guard_section(policy);
        let non_settling = unsettled(
            guard.as_ref(),
            [
                ("B", &plan.orientation.baseline.name, &b.devices),
                ("C", &plan.orientation.candidate.name, &c.devices),
                ("B′", &plan.orientation.baseline.name, &b2.devices),
            ],
        );
        let settlement = plan.reproduces.as_ref().map(|(primary, first)| {
            Settlement::between(*primary, first, &record, non_settling.is_none())
        });
        let outputs = QualifyOutputs {
            sessions: Reads {
                b: db,
                c: dc,
                b2: db2,
            },
            orientation: plan.orientation.clone(),
            reproduces: plan.reproduces.as_ref().map(|(d, _)| *d),
            launch: b.launch,
            gpu_lock,
            outputs: Reads {
                b: b.outputs,
                c: c.outputs,
                b2: b2.outputs,
            },
            frozen: plan.frozen.clone(),
            speed_policy: speed_digest,
            speed_section: speed_policy.clone(),
            workload: b.workload,
            model: b.model,
            windows: Reads {
                b: b.windows,
                c: c.windows,
                b2: b2.windows,
            },
            devices: Reads {
                b: b.devices,
                c: c.devices,
                b2: b2.devices,
            },
            guard,
            settling: non_settling.is_none(),
            non_settling,
            settlement,
            speed: record,
        };
        match outputs.speed.verdict {
            Verdict::Pass => Ok(Decision::Accepted(outputs)),
            Verdict::Fail => Ok(Decision::Rejected(Rejection::one(
                &outputs.speed.code.clone(),
                outputs.speed.reason.clone(),
                serde_json::to_value(&outputs)
                    .map_err(|e| LaneError::NoDecision(format!("the evidence: {e}")))?,
            ))),
            Verdict::NoDecision => Err(LaneError::NoDecision(format!(
                "{}: {}",
                outputs.speed.code, outputs.speed.reason
            ))),
        }
    })();
    match decided {
        Err(LaneError::NoDecision(why)) if !ran.is_empty() => {
            let named: Vec<String> = ran.iter().map(|(n, d)| format!("{n} {d}")).collect();
            Err(LaneError::NoDecision(format!(
                "{why} (the sessions it ran: {})",
                named.join(", ")
            )))
        }
        other => other,
    }
}

/// A read's device receipts: pre, active and post of one launch, in order, the active one on
/// the lane's CPUs as the kernel reported them, the post one quiescent.
/// Before the first read, with the GPU lock held: no container in cordon's runtime state, of
/// any executor — a dead supervisor's orphan among them, which no lease of this executor and no
/// read's pre receipt would show — shares the host's lanes with the reads.
fn nothing_live(cfg: &Config) -> Result<(), LaneError> {
    let live = cfg.setup.runtime.containers().map_err(|e| {
        LaneError::NoDecision(format!("the host's containers cannot be listed: {e}"))
    })?;
    if live.is_empty() {
        return Ok(());
    }
    let named: Vec<String> = live
        .iter()
        .map(|(id, labels)| {
            let executor = labels
                .get(cordon::lease::LABEL_EXECUTOR)
                .map_or("no executor", String::as_str);
            // Escaped where it is printed, like every diagnostic (cordon_canon::text).
            format!("{id} ({executor})")
        })
        .collect();
    Err(LaneError::NoDecision(format!(
        "containers are live on this host before the qualification: {}",
        named.join(", ")
    )))
}

/// The section settling is decided under: the lanes' pinned GPUs and the guard's rules
/// (`None` when no lane names a GPU).
fn guard_section(policy: &Policy) -> Option<GuardSection> {
    let lanes: std::collections::BTreeMap<_, _> = policy
        .physical_lanes()
        .iter()
        .filter(|(_, l)| !l.gpus.is_empty())
        .map(|(name, l)| (name.clone(), l.gpus.clone()))
        .collect();
    let g = policy.device_guard().filter(|_| !lanes.is_empty())?;
    Some(GuardSection {
        lanes,
        drain: g.drain.clone(),
        envelope: g.envelope.clone(),
    })
}

fn check_devices(name: &str, lane: &LaneAssignment, d: &DeviceReceipts) -> Result<(), LaneError> {
    let no = |why: String| {
        Err(LaneError::NoDecision(format!(
            "read {name}'s device receipts: {why}"
        )))
    };
    let all = [&d.pre, &d.active, &d.post];
    if all.iter().any(|r| r.launch != d.pre.launch) {
        return no("they name different launches".into());
    }
    let phases = all.map(|r| r.phase);
    if phases != [DevicePhase::Pre, DevicePhase::Active, DevicePhase::Post]
        || all
            .windows(2)
            .any(|p| p[0].seq >= p[1].seq || p[0].at_ns > p[1].at_ns)
    {
        return no("not pre, active, post in sequence and time".into());
    }
    if d.post.quiescent != Some(true) {
        return no("the post receipt does not prove the lane quiescent".into());
    }
    let observed = d.active.cpuset.as_deref().and_then(cpu_list);
    if observed.is_none() || observed != cpu_list(&lane.cpuset) {
        return Err(LaneError::NoDecision(format!(
            "read {name} ran on another physical lane: its CPUs were {:?}, lane {} is {}",
            d.active.cpuset, lane.name, lane.cpuset
        )));
    }
    Ok(())
}

/// B, C and B′ may differ only in tree, publication and lane.
fn same_launch(b: &LaneOutputs, c: &LaneOutputs, b2: &LaneOutputs) -> Result<(), LaneError> {
    let key = |o: &LaneOutputs| (o.launch, o.model, o.workload, o.worker, o.step.clone());
    for (name, o) in [("C", c), ("B′", b2)] {
        if key(o) != key(b) {
            return Err(LaneError::NoDecision(format!(
                "read {name} was launched differently from B (launch {} against {}, model, workload, worker or step): the reads are not comparable",
                o.launch, b.launch
            )));
        }
    }
    Ok(())
}
