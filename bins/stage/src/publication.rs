//! A publication reopened against the authority a stage runs under: its control record (which
//! its name covers, so the store cannot change it unseen) must say it was built from the tree
//! the stage runs, by the policy's registered patcher for its tier with the patcher's exact
//! argv, in the pinned prebuild image, from the compile request that tree implies
//! ([`crate::compile`]). A publication from another tree, another patcher, another image or
//! another request is refused, never mounted.

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
    // The tree's record (cheap: its entries hash to its name) gives the request it implies.
    let tree = tree::load(store, tree).map_err(Err)?;
    matches(policy, &control, &tree, step)
        .map_err(|why| Ok(format!("publication {digest} does not match: {why}")))?;
    Ok(record)
}

/// The control record of a build of `tree` by registered prebuild step `step` under lease
/// `lease`: the step's tier and exact argv and the pinned prebuild image, from `policy`.
///
/// # Errors
/// `step` is not a registered prebuild step, or the policy pins no prebuild image.
pub fn built(
    policy: &Policy,
    tree: &TreeRecord,
    step: &str,
    lease: &str,
) -> Result<Control, String> {
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
    let request = crate::compile::request_for(tree, tier)?;
    Ok(Control::Built {
        tree: tree.digest,
        tier: tier.as_str().to_owned(),
        step: step.to_owned(),
        argv: argv.to_vec(),
        image,
        lease: lease.to_owned(),
        request: request.map(|r| r.digest),
    })
}

/// Whether `control` is a build of `tree` by the policy's patcher (`step` when given).
///
/// # Errors
/// What differs, as a sentence.
pub fn matches(
    policy: &Policy,
    control: &Control,
    tree: &TreeRecord,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(factory: Option<&str>) -> TreeRecord {
        TreeRecord {
            schema: tree::TREE_SCHEMA,
            materializer: tree::MATERIALIZER.to_owned(),
            digest: Digest::of_bytes(b"a tree"),
            entries: Vec::new(),
            origin: serde_json::json!({ "kind": "candidate", "factory": factory }),
        }
    }

    /// A sealed-direct-artifact build matches only the compile request its tree implies: a
    /// record naming another factory for the same digest, or a build with another or no
    /// request, is refused; a tree with no factory has no such build.
    #[test]
    fn a_compiled_build_is_matched_by_the_request_its_tree_implies() {
        let policy = crate::session::tests::policy(|t| t);
        let aot = tree(Some("ns.aot:build"));
        let control = built(&policy, &aot, "build-aot", "lease").unwrap();
        assert!(matches!(
            &control,
            Control::Built {
                request: Some(_),
                ..
            }
        ));
        matches(&policy, &control, &aot, Some("build-aot")).unwrap();
        let why = matches(&policy, &control, &tree(Some("ns.aot:other")), None).unwrap_err();
        assert!(why.contains("compile request"), "{why}");
        let mut bare = control.clone();
        if let Control::Built { request, .. } = &mut bare {
            *request = None;
        }
        assert!(matches(&policy, &bare, &aot, None).is_err());
        assert!(built(&policy, &tree(None), "build-aot", "lease").is_err());
        // Another tier's build has no request.
        let native = built(&policy, &tree(None), "build-native", "lease").unwrap();
        assert!(matches!(native, Control::Built { request: None, .. }));
    }
}
