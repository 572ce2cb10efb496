//! Policy values → the mechanism library's settings, in one place: the archive bounds of the
//! safe tar reader, the per-run account rules, the lease manager's setup. Each function reads
//! the typed policy and builds the plain type the mechanism takes, so no policy value is parsed
//! twice or lives in two shapes. The host paths the mechanisms read (passwd, group, mountinfo,
//! the cgroup root) and the real host seam are injected here, and only here.

use std::path::{Path, PathBuf};

use cordon::account::AccountPolicy;
use cordon::archive::ArchiveLimits;
use cordon::lease::Setup;
use cordon::runtime::Runtime;
use cordon_policy_lang::Policy;

/// The archive bounds, in the form the safe tar reader takes.
#[must_use]
pub fn archive_limits(policy: &Policy) -> ArchiveLimits {
    let a = policy.archive();
    ArchiveLimits {
        max_archive_bytes: a.max_archive_bytes,
        max_extracted_bytes: a.max_extracted_bytes,
        max_members: a.max_members,
        max_file_bytes: a.max_file_bytes,
        max_path_length: a.max_path_length,
        max_depth: a.max_depth,
        max_pax_bytes: a.max_pax_bytes,
        max_compression_ratio: a.max_compression_ratio,
        exclude: a.exclude.iter().cloned().collect(),
    }
}

/// The limits of a confined parser child, in the form the child takes.
#[must_use]
pub fn parser_limits(policy: &Policy) -> cordon::confine::Limits {
    let p = policy.parser();
    cordon::confine::Limits {
        address_space: p.address_space,
        cpu_seconds: p.cpu_time_ms.div_ceil(1000),
    }
}

/// The per-run account rules, in the form the account module takes.
#[must_use]
pub fn account_policy(policy: &Policy) -> AccountPolicy {
    let a = policy.accounts();
    AccountPolicy {
        uids: (a.uid_range.first, a.uid_range.last),
        gids: (a.gid_range.first, a.gid_range.last),
        shell: PathBuf::from(&a.shell),
        cron_deny: PathBuf::from(&a.cron_deny),
        at_deny: PathBuf::from(&a.at_deny),
        passwd: PathBuf::from("/etc/passwd"),
        group: PathBuf::from("/etc/group"),
    }
}

/// The lease manager's setup for `executor` under this policy: its runtime with cordon's
/// state root for the executor, its run-directory root, its account rules.
#[must_use]
pub fn lease_setup(policy: &Policy, executor: &str, state_root: &Path, run_root: PathBuf) -> Setup {
    Setup {
        executor: executor.to_owned(),
        runtime: Runtime {
            binary: PathBuf::from(policy.runtime().path()),
            state_root: state_root.join(executor),
            host: cordon::host::Linux::shared(),
        },
        run_root,
        lock_dir: PathBuf::from(cordon::lease::LOCK_DIR),
        accounts: account_policy(policy),
        cgroup_root: PathBuf::from("/sys/fs/cgroup"),
        mountinfo: PathBuf::from("/proc/self/mountinfo"),
        init_mountinfo: PathBuf::from("/proc/1/mountinfo"),
        cdi_dirs: crate::cdi::SPEC_DIRS.iter().map(PathBuf::from).collect(),
        // The supervisor's own binary, whatever replaced the file on disk since it started.
        watchdog: PathBuf::from("/proc/self/exe"),
    }
}
