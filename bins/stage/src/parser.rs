//! A stage's confined parser child under its own lease (REQ-117): the one sequence `cordon-fetch`
//! and `cordon-materialize` run instead of copying it.
//!
//! [`under_setup`] holds the executor *shared* (with other parsing stages, never beside a
//! container stage or a recovery), begins a lease that owns only a fresh run account and a run
//! directory with an empty jail in it, hands the caller a [`Launch`] for its child, and
//! releases the lease whatever the caller's work returned: the account is removed, the
//! directory too, the record unlinked. A release that cannot be established overrides the
//! result. A crash in between leaves the record for `cordon-reap`'s recovery.

use std::path::Path;
use std::time::Duration;

use cordon::canonical::Digest;
use cordon::confine::{Launch, Spec};
use cordon::lease::{LeaseError, Manager, Setup};
use cordon::store::Store;
use cordon_policy_lang::Policy;

/// Run `work` with a [`Launch`] for child `kind` of executable `exe` (the stage binary itself,
/// whose digest the authority covers), under a lease of the manager `setup` describes (a
/// stage's `LeaseArgs::setup`, or the setup it holds already) that expires after `budget`.
///
/// # Errors
/// The lease could not be begun, provisioned or released.
#[allow(clippy::too_many_arguments)]
pub fn under_setup<T>(
    policy: &Policy,
    setup: Setup,
    store: &Store,
    authority: &Digest,
    kind: &str,
    exe: &Path,
    budget: Duration,
    work: impl FnOnce(&Launch) -> T,
) -> Result<T, LeaseError> {
    let manager = Manager::open_shared(store, setup)?;
    let held = manager.begin_child(&authority.to_string(), budget)?;
    // A signal before the child exists ends here; one after it kills the child
    // (`cordon::confine::spawn`). Either way the release below runs.
    let ran = cordon::interrupt::check()
        .map_err(LeaseError::from)
        .and_then(|()| manager.provision_child(&held))
        .map(|jail| {
            let account = held.account();
            work(&Launch {
                host: manager.runtime().host.clone(),
                exe: exe.to_path_buf(),
                spec: Spec {
                    kind: kind.to_owned(),
                    uid: account.uid,
                    gid: account.gid,
                    jail,
                    limits: crate::settings::parser_limits(policy),
                    argument: None,
                },
                budget,
            })
        });
    manager.release(&held.record)?;
    ran
}

/// The wall-clock budget of a parser child that waits on no transfer: twice its CPU limit.
#[must_use]
pub fn budget(policy: &Policy) -> Duration {
    2 * Duration::from_millis(policy.parser().cpu_time_ms)
}
