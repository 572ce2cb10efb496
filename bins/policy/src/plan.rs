//! From a validated stage to the `cordon` library's bundle [`Plan`]: the policy supplies every
//! control, the caller supplies what only the host knows at run time (the per-run ids, the
//! image root, the mount sources, the lease labels, the protected paths).

use std::collections::BTreeMap;
use std::path::PathBuf;

use cordon::bundle::{Bind, Plan, Seccomp, SyscallRule};

use crate::Policy;

/// What the host supplies at run time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunInputs {
    /// The exact argv (a registered step's).
    pub argv: Vec<String>,
    /// The per-run uid and gid.
    pub uid: u32,
    /// The per-run gid.
    pub gid: u32,
    /// The unpacked image root.
    pub rootfs: PathBuf,
    /// Mount role (`tree`, `staging`, …) → host source.
    pub sources: BTreeMap<String, PathBuf>,
    /// Lease labels.
    pub executor: String,
    /// The lease id.
    pub lease: String,
    /// The authority identity.
    pub authority: String,
    /// Paths no mount may expose.
    pub protected: Vec<PathBuf>,
    /// Store subtrees that may be mounted despite the store being protected.
    pub mountable_store_roots: Vec<PathBuf>,
}

/// Why a stage cannot be planned from the policy.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum PlanError {
    /// The stage kind is not declared.
    #[error("the policy declares no stage {0:?}")]
    #[diagnostic(code(cordon::policy::no_stage))]
    NoStage(String),
    /// A mount role has no source.
    #[error("stage {stage:?} mounts {role:?} at {dest}, but no source was given for it")]
    #[diagnostic(code(cordon::policy::no_source))]
    NoSource {
        /// The stage.
        stage: String,
        /// The role.
        role: String,
        /// Where it mounts.
        dest: String,
    },
}

impl Policy {
    /// The effective seccomp profile `name` in plain form.
    #[must_use]
    pub fn seccomp_plain(&self, name: &str) -> Option<Seccomp> {
        let p = self.seccomp.get(name)?;
        Some(Seccomp {
            default_action: p.default_action.clone(),
            architectures: p.architectures.iter().cloned().collect(),
            rules: p
                .syscall
                .iter()
                .map(|(n, r)| SyscallRule {
                    name: n.clone(),
                    action: r.action.clone(),
                    args: r
                        .args
                        .iter()
                        .map(|a| (a.index, a.op.clone(), a.value, a.mask))
                        .collect(),
                })
                .collect(),
        })
    }

    /// The bundle plan of stage `kind` for one run.
    ///
    /// # Errors
    /// The stage is not declared, or a mount role has no source.
    pub fn bundle_plan(&self, kind: &str, run: &RunInputs) -> Result<Plan, PlanError> {
        let s = self
            .stage
            .get(kind)
            .ok_or_else(|| PlanError::NoStage(kind.to_owned()))?;
        let mut binds = Vec::new();
        for (dest, m) in &s.mount {
            let source = run
                .sources
                .get(&m.source)
                .ok_or_else(|| PlanError::NoSource {
                    stage: kind.to_owned(),
                    role: m.source.clone(),
                    dest: dest.clone(),
                })?;
            binds.push(Bind {
                source: source.clone(),
                destination: PathBuf::from(dest),
                writable: m.mode == "rw",
            });
        }
        Ok(Plan {
            argv: run.argv.clone(),
            env: s.env.clone(),
            uid: run.uid,
            gid: run.gid,
            rootfs: run.rootfs.clone(),
            readonly_root: s.root == "read-only",
            capabilities: s.capability.keys().cloned().collect(),
            no_new_privileges: s.no_new_privileges,
            nofile: s.nofile,
            core_bytes: s.core_bytes,
            tmp_bytes: s.tmp.size_bytes,
            tmp_exec: s.tmp.exec,
            shm_bytes: s.shm_bytes,
            binds,
            sys: s.sys == "read-only",
            network_none: s.network == "none",
            cpus_milli: s.cpus_milli,
            cpuset: s.cpuset.clone(),
            memory_bytes: s.memory_bytes,
            pids: s.pids,
            seccomp: self.seccomp_plain(&s.seccomp).unwrap_or(Seccomp {
                default_action: "kill-process".into(),
                architectures: vec!["x86_64".into()],
                rules: Vec::new(),
            }),
            executor: run.executor.clone(),
            lease: run.lease.clone(),
            authority: run.authority.clone(),
            cgroup_path: format!("/cordon/{}", run.lease),
            protected: run.protected.clone(),
            mountable_store_roots: run.mountable_store_roots.clone(),
        })
    }

    /// The lease manager's setup for `executor` under this policy: its runtime with cordon's
    /// state root for the executor, its run-directory root, its account rules.
    #[must_use]
    pub fn lease_setup(
        &self,
        executor: &str,
        state_root: &std::path::Path,
        run_root: PathBuf,
    ) -> cordon::lease::Setup {
        cordon::lease::Setup {
            executor: executor.to_owned(),
            runtime: cordon::runtime::Runtime {
                binary: PathBuf::from(&self.runtime.path),
                state_root: state_root.join(executor),
            },
            run_root,
            accounts: self.account_policy(),
            cgroup_root: PathBuf::from("/sys/fs/cgroup"),
            passwd: PathBuf::from("/etc/passwd"),
        }
    }

    /// Placeholder run inputs for `explain`: the first ids of the range, the pinned image's
    /// cache path, store paths with `TREE`/`LEASE` placeholders.
    #[must_use]
    pub fn example_inputs(&self, kind: &str) -> RunInputs {
        let store = PathBuf::from(&self.store);
        let image = self
            .stage
            .get(kind)
            .and_then(|s| self.image.get(&s.image))
            .map_or_else(|| "IMAGE".to_owned(), cordon::Digest::hex);
        let run = PathBuf::from(&self.run_dir).join("LEASE");
        let sources: BTreeMap<String, PathBuf> = [
            ("tree", store.join("trees/TREE/root")),
            ("publication", store.join("publications/PUBLICATION/root")),
            ("staging", run.join("staging")),
            ("model", PathBuf::from("/var/lib/cordon/models/MODEL")),
            (
                "workspace",
                PathBuf::from("/var/lib/cordon/workspaces/WORKSPACE"),
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        let argv = self
            .step
            .values()
            .find(|st| st.stage == kind)
            .map_or_else(|| vec!["/bin/sh".to_owned()], |st| st.argv.clone());
        let id = |r: &crate::model::IdRange| u32::try_from(r.first).unwrap_or(u32::MAX);
        RunInputs {
            argv,
            uid: id(&self.accounts.uid_range),
            gid: id(&self.accounts.gid_range),
            rootfs: store.join("images").join(image).join("rootfs"),
            sources,
            executor: "EXECUTOR".into(),
            lease: "LEASE".into(),
            authority: "AUTHORITY".into(),
            protected: vec![
                store.clone(),
                run.join("bundle"),
                PathBuf::from("/run/cordon-runc"),
            ],
            mountable_store_roots: vec![store.join("trees"), store.join("publications")],
        }
    }
}
