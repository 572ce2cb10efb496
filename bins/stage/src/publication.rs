//! A publication reopened against the authority a stage runs under: its control record (which
//! its name covers, so the store cannot change it unseen) must say it was built from the tree
//! the stage runs, by the policy's registered patcher for its tier with the patcher's exact
//! argv, in the pinned prebuild image. A publication from another tree, another patcher or
//! another image is refused, never mounted.

use cordon::canonical::Digest;
use cordon::store::Store;
use cordon::tree::{self, Control, PUBLICATIONS, TreeRecord};
use cordon_policy_lang::{Policy, StageKind};

/// Reopen and re-verify publication `digest` (every file re-hashed) and check its control
/// record: built from `tree` under `policy`, by `step` when the caller knows which step it
/// asked for.
///
/// # Errors
/// `Err(Ok(why))`: the publication is whole and its control record does not match (the
/// stage's no-decision); `Err(Err(e))`: it is missing or corrupt.
pub fn reopen(
    store: &Store,
    policy: &Policy,
    digest: &Digest,
    tree: &Digest,
    step: Option<&str>,
) -> Result<TreeRecord, Result<String, tree::TreeError>> {
    let record = tree::verify_in(store, PUBLICATIONS, digest).map_err(Err)?;
    let control = Control::of(&record).map_err(Err)?;
    matches(policy, &control, tree, step)
        .map_err(|why| Ok(format!("publication {digest} does not match: {why}")))?;
    Ok(record)
}

/// The control record of a build of `tree` by registered prebuild step `step` under lease
/// `lease`: the step's tier and exact argv and the pinned prebuild image, from `policy`.
///
/// # Errors
/// `step` is not a registered prebuild step, or the policy pins no prebuild image.
pub fn built(policy: &Policy, tree: &Digest, step: &str, lease: &str) -> Result<Control, String> {
    let (argv, tier) = match (policy.step(step), policy.step_tier(step)) {
        (Some((StageKind::Prebuild, argv)), Some(tier)) => (argv, tier),
        _ => {
            return Err(format!(
                "{step:?} is not a registered prebuild step of the policy"
            ));
        }
    };
    let (_, image) = crate::bundle::image_of(policy, StageKind::Prebuild)
        .map_err(|e| format!("the policy's prebuild image: {e}"))?;
    Ok(Control::Built {
        tree: *tree,
        tier: tier.as_str().to_owned(),
        step: step.to_owned(),
        argv: argv.to_vec(),
        image,
        lease: lease.to_owned(),
        request: None,
    })
}

/// Whether `control` is a build of `tree` by the policy's patcher (`step` when given).
///
/// # Errors
/// What differs, as a sentence.
pub fn matches(
    policy: &Policy,
    control: &Control,
    tree: &Digest,
    step: Option<&str>,
) -> Result<(), String> {
    let Control::Built { step: built_by, .. } = control else {
        return Err("it is a control-only publication, built by no patcher".into());
    };
    if let Some(asked) = step.filter(|s| s != built_by) {
        return Err(format!("it was built by step {built_by:?}, not {asked:?}"));
    }
    control.check_built(&built(policy, tree, built_by, "")?)
}
