//! What a speed qualification records: its three reads, the lanes they ran on, what its
//! authority is frozen on, its settlement and the outputs of its receipt, so that
//! `cordon-verify` reads and recomputes them without the lane that wrote them.

use cordon_canon::canonical::{CanonicalError, Digest, domain_digest};
use serde::{Deserialize, Serialize};

use crate::receipt::{
    DeviceReceipts, LaneAssignment, LaneWindow, LockSpan, StageName, StageOutputs,
};
use crate::speed::{Speed, SpeedRecord};

/// Which lane runs which role.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Orientation {
    /// Where B and B′ run.
    pub baseline: LaneAssignment,
    /// Where C runs.
    pub candidate: LaneAssignment,
}

/// The three reads' session receipts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Reads<T> {
    /// B.
    pub b: T,
    /// C.
    pub c: T,
    /// B′.
    pub b2: T,
}

/// What a qualification's authority is frozen on besides the authority identity (policy,
/// runtime, images, toolchain): a reproduction under any other value is refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Frozen {
    /// The host's kernel release (`/proc/sys/kernel/osrelease`).
    pub kernel_release: String,
    /// The GPU driver version (none: the lanes have no GPU).
    pub gpu_driver: Option<String>,
    /// The CDI spec's digest (none: no device comes from a CDI spec in this build).
    pub cdi_spec: Option<Digest>,
    /// The device policy: the physical lanes and the lane stage's device list.
    pub device_policy: Digest,
}

impl Frozen {
    /// How `self` (a reproduction's) differs from `primary`'s (empty: the same).
    #[must_use]
    pub fn differences(&self, primary: &Self) -> Vec<&'static str> {
        [
            (
                self.kernel_release != primary.kernel_release,
                "the kernel release",
            ),
            (
                self.gpu_driver != primary.gpu_driver,
                "the GPU driver version",
            ),
            (self.cdi_spec != primary.cdi_spec, "the CDI spec"),
            (
                self.device_policy != primary.device_policy,
                "the device policy",
            ),
        ]
        .into_iter()
        .filter_map(|(differs, what)| differs.then_some(what))
        .collect()
    }
}

/// How a reproduction settles with its primary attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Settlement {
    /// The primary attempt's receipt.
    pub primary: Digest,
    /// The two speedups, primary first, basis points.
    pub speedups_bp: [u64; 2],
    /// The lower of the two: the speedup the pair settles at.
    pub speedup_bp: u64,
    /// Both attempts passed and both are settling.
    pub settles: bool,
}

impl Settlement {
    /// How a reproduction (its speed record and whether its reads settle) settles with its
    /// primary attempt `first` (receipt `primary`): the lower of the two speedups, settling only
    /// when both attempts passed on settling reads. The one rule the lane records and the
    /// referee and `cordon-verify` recompute.
    #[must_use]
    pub fn between(
        primary: Digest,
        first: &QualifyOutputs,
        speed: &crate::speed::SpeedRecord,
        settling: bool,
    ) -> Self {
        use crate::speed::Verdict;
        let speedups_bp = [first.speed.speedup_bp, speed.speedup_bp];
        Self {
            primary,
            speedups_bp,
            speedup_bp: speedups_bp[0].min(speedups_bp[1]),
            settles: first.speed.verdict == Verdict::Pass
                && speed.verdict == Verdict::Pass
                && first.settling
                && settling,
        }
    }

    /// The primary attempt's outputs, when `reproduction` (a qualify receipt) is the exact
    /// reproduction of `first` (receipt `primary`): `first` is an `ok` qualification of the
    /// same builds and itself a primary attempt, the lanes are exchanged, the launch, workload
    /// and model are the same, and the settlement recomputes.
    ///
    /// # Errors
    /// What does not pair, for a person.
    pub fn check_pair(
        primary: Digest,
        first: &crate::receipt::Receipt,
        reproduction: &crate::receipt::Receipt,
    ) -> Result<QualifyOutputs, &'static str> {
        use crate::inputs::QualifyInputs;
        use crate::receipt::Outcome;
        if first.stage != StageName::Qualify || first.outcome != Outcome::Ok {
            return Err("the primary attempt is not an ok qualification");
        }
        let decode = |r: &crate::receipt::Receipt| {
            let i = r.inputs_as::<QualifyInputs>().ok()?;
            Some((
                (i.incumbent, i.candidate),
                r.outputs_as::<QualifyOutputs>().ok()?,
            ))
        };
        let (Some((builds, first)), Some((asked, reproduction))) =
            (decode(first), decode(reproduction))
        else {
            return Err("a qualification's inputs or outputs do not decode");
        };
        if builds != asked {
            return Err("the primary attempt qualified other builds");
        }
        Self::check_outputs(primary, &first, &reproduction)?;
        Ok(first)
    }

    fn check_outputs(
        primary: Digest,
        first: &QualifyOutputs,
        reproduction: &QualifyOutputs,
    ) -> Result<(), &'static str> {
        let exchanged = Orientation {
            baseline: first.orientation.candidate.clone(),
            candidate: first.orientation.baseline.clone(),
        };
        if first.reproduces.is_some() || reproduction.reproduces != Some(primary) {
            return Err("the primary attempt is itself a reproduction, or not the one reproduced");
        }
        if reproduction.orientation != exchanged {
            return Err("the reproduction's lanes are not the primary attempt's, exchanged");
        }
        if (first.launch, first.workload, first.model)
            != (
                reproduction.launch,
                reproduction.workload,
                reproduction.model,
            )
        {
            return Err("the reproduction was launched differently (launch, workload or model)");
        }
        let again = Self::between(primary, first, &reproduction.speed, reproduction.settling);
        if reproduction.settlement.as_ref() != Some(&again) {
            return Err("the settlement does not recompute from the two attempts");
        }
        Ok(())
    }
}

/// What `cordon-lane qualify` established: an `ok` receipt's outputs (PASS), or a rejected
/// receipt's evidence (FAIL). Every number the verdict used is here, so it is recomputed from
/// the receipt alone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct QualifyOutputs {
    /// The three session receipts.
    pub sessions: Reads<Digest>,
    /// The lanes.
    pub orientation: Orientation,
    /// The primary attempt, when this is its reproduction.
    pub reproduces: Option<Digest>,
    /// The launch digest all three reads share.
    pub launch: Digest,
    /// The one hold of the host's GPU lock all three reads ran under.
    pub gpu_lock: LockSpan,
    /// Each read's output tokens, by digest (the reference stage grades C's).
    pub outputs: Reads<Digest>,
    /// What the authority is frozen on besides its identity.
    pub frozen: Frozen,
    /// The digest of the policy's speed section.
    pub speed_policy: Digest,
    /// The speed section itself, so the verdict recomputes from the receipt alone.
    pub speed_section: Speed,
    /// The workload.
    pub workload: Digest,
    /// The model.
    pub model: Digest,
    /// Every read's host-stamped windows.
    pub windows: Reads<Vec<LaneWindow>>,
    /// Every read's device receipts.
    pub devices: Reads<DeviceReceipts>,
    /// The verdict and every number in it.
    pub speed: SpeedRecord,
    /// On GPU lanes: what settling was decided under (each lane's pins, the drain and envelope
    /// rules), so it recomputes from the receipt alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guard: Option<GuardSection>,
    /// Whether this attempt can settle a qualification ([`unsettled`]).
    pub settling: bool,
    /// Why not, when it cannot.
    pub non_settling: Option<String>,
    /// The pair's settlement, on a reproduction.
    pub settlement: Option<Settlement>,
}

impl StageOutputs for QualifyOutputs {
    const STAGE: StageName = StageName::Qualify;
}

/// What a GPU-lane qualification's settling is decided under, as the policy gives it: each
/// lane's GPUs with their pinned configurations, the drain rule and the active envelope.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GuardSection {
    /// Lane name → GPU UUID → its pin (lanes without GPUs absent).
    pub lanes: std::collections::BTreeMap<
        String,
        std::collections::BTreeMap<String, crate::device::DeviceConfig>,
    >,
    /// The drain before and after every read.
    pub drain: crate::device::DrainRule,
    /// The bounds of the sample during the last warmup.
    pub envelope: crate::device::Envelope,
}

/// Why reads `(name, lane, device receipts)` do not settle (`None`: they do), under `guard`
/// (`None`: the lanes name no GPU). Only reads on GPU lanes whose device receipts prove each
/// one guarded ([`crate::device::unguarded`]) settle: a CPU rehearsal of the protocol never
/// settles a GPU qualification. The lane decides with it and `cordon-verify` replays it.
#[must_use]
pub fn unsettled(
    guard: Option<&GuardSection>,
    reads: [(&str, &str, &DeviceReceipts); 3],
) -> Option<String> {
    let Some(guard) = guard else {
        return Some(
            "the lanes are CPU sets (no GPU): a rehearsal of the protocol never settles a GPU qualification".to_owned(),
        );
    };
    let mut why = Vec::new();
    for (name, lane, devices) in reads {
        let Some(pins) = guard.lanes.get(lane) else {
            why.push(format!("read {name}: lane {lane} names no GPU"));
            continue;
        };
        let not = crate::device::unguarded(pins, &guard.drain, &guard.envelope, devices);
        if !not.is_empty() {
            why.push(format!("read {name}: {}", not.join("; ")));
        }
    }
    (!why.is_empty()).then(|| why.join("; "))
}

/// The digest of the policy's speed section.
///
/// # Errors
/// It cannot be encoded.
pub fn speed_policy_digest(speed: &Speed) -> Result<Digest, CanonicalError> {
    domain_digest("cordon.speed-policy", 1, speed)
}
