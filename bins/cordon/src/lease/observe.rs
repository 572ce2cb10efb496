//! The lock-free view of an executor's leases: what a monitor reads while a supervisor holds
//! the executor, how an expired lease is ended without waiting for its supervisor, and the
//! quiescence check (what is left, as typed [`Leftover`] items).

use super::*;

/// A view of an executor's leases that takes no lock: what a monitor reads while a supervisor
/// holds the executor, and how `cordon-reap` ends a lease that outlived its deadline (or its
/// supervisor) without waiting for that supervisor.
#[derive(Debug)]
pub struct Observer {
    store: Store,
    setup: Setup,
}

/// One lease as an observer sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    /// The record.
    pub record: Record,
    /// Past its deadline and the grace, or its supervisor is gone.
    pub expired: bool,
}

/// Mark `r`'s run ended by `cordon-reap` before anything of it is killed: a kill its
/// supervisor cannot attribute is the candidate's. `false` (with the residue) when the mark
/// cannot be written.
fn marked(r: &Record, residue: &mut Vec<String>) -> bool {
    if let Some(dir) = r.run_dir()
        && let Err(e) = fs::write(dir.join(ENDED_BY_REAP), &r.lease)
    {
        residue.push(format!(
            "expired lease {}: cannot mark it ended: {e}",
            r.lease
        ));
        return false;
    }
    true
}

impl Observer {
    /// Observe `setup.executor`'s leases in `store`.
    #[must_use]
    pub fn new(store: &Store, setup: Setup) -> Self {
        Self {
            store: store.clone(),
            setup,
        }
    }

    /// Every lease, each active or expired at `now`.
    ///
    /// # Errors
    /// A record is unsafe or corrupt, or a supervisor's state cannot be read.
    pub fn leases(&self, now: &BootTime) -> Result<Vec<Observed>, LeaseError> {
        read_records(&self.store, &self.setup.executor)?
            .into_iter()
            .map(|record| {
                // A lease of an earlier boot is late whatever its numbers say, and its pid and
                // start time may name a process of this boot: its supervisor is not asked.
                let late = record.deadline.passed(EXPIRY_GRACE, now);
                let gone = late
                    || !record
                        .supervisor
                        .alive(self.setup.host())
                        .map_err(io("read the supervisor of", Path::new(&record.lease)))?;
                Ok(Observed {
                    expired: gone || late,
                    record,
                })
            })
            .collect()
    }

    /// Kill the container of every expired lease — only one that carries this executor's,
    /// this store's and that lease's exact labels — so its supervisor (if any) sees its run
    /// end, reads its accounting and deletes and releases the rest (a supervisor that is gone
    /// leaves that to recovery). Not a delete: that would remove the cgroup the supervisor is
    /// about to read, and turn an attributable kill into a lost accounting. A parser child's
    /// lease has no container: its child, every process of the lease's fresh account, is
    /// killed (each through a pidfd, once seen to run as the account), and its supervisor sees
    /// a kill from outside (a no-decision) and releases. Returns what was ended.
    ///
    /// # Errors
    /// The runtime's listing cannot be read, or a kill failed (residue).
    pub fn end_expired(&self, now: &BootTime) -> Result<Vec<String>, LeaseError> {
        let expired: Vec<Record> = self
            .leases(now)?
            .into_iter()
            .filter(|o| o.expired)
            .map(|o| o.record)
            .collect();
        if expired.is_empty() {
            return Ok(Vec::new());
        }
        let store = self.store.root().display().to_string();
        let (mut done, mut residue) = (Vec::new(), Vec::new());
        for (id, labels) in self.setup.runtime.containers()? {
            let owned = expired.iter().find(|r| {
                r.container() == Some(id.as_str())
                    && labels.get(LABEL_EXECUTOR) == Some(&self.setup.executor)
                    && labels.get(LABEL_STORE) == Some(&store)
                    && labels.get(LABEL_LEASE) == Some(&r.lease)
            });
            if let Some(r) = owned {
                if !marked(r, &mut residue) {
                    continue;
                }
                match self.setup.runtime.kill_all(&id) {
                    Ok(()) => done.push(format!("expired lease {}: container {id} ended", r.lease)),
                    Err(e) => {
                        residue.push(format!("expired lease {}: container {id}: {e}", r.lease))
                    }
                }
            }
        }
        // A parser child's lease has no container: its child is every process of its fresh
        // account, each killed through a pidfd only once it is seen to run as that account.
        for r in expired.iter().filter(|r| r.container().is_none()) {
            let Some(account) = r.account() else { continue };
            let live = match super::per_run::processes_of(self.setup.host(), account.uid) {
                Ok(live) if live.is_empty() => continue,
                Ok(live) => live,
                Err(e) => {
                    residue.push(format!("expired lease {}: {e}", r.lease));
                    continue;
                }
            };
            if !marked(r, &mut residue) {
                continue;
            }
            let mut ended = Vec::new();
            for pid in live.iter().filter_map(|p| p.parse::<u32>().ok()) {
                match self.setup.host().kill_of(pid, account.uid) {
                    Ok(true) => ended.push(pid.to_string()),
                    Ok(false) => {}
                    Err(e) => residue.push(format!(
                        "expired lease {}: process {pid} of {}: {e}",
                        r.lease, account.name
                    )),
                }
            }
            if !ended.is_empty() {
                done.push(format!(
                    "expired lease {}: its parser child (pids {}) ended",
                    r.lease,
                    ended.join(", ")
                ));
            }
        }
        if residue.is_empty() {
            Ok(done)
        } else {
            Err(Residue { items: residue }.into())
        }
    }

    /// The owner tag of this executor's accounts in this store.
    pub(crate) fn owner_tag(&self) -> String {
        account::owner_tag(&self.setup.executor, self.store.root())
    }

    /// The accounts in the policy's range: this executor's and store's (by their owner tag)
    /// and the ones with no readable tag; anyone else's are not listed.
    ///
    /// # Errors
    /// The account databases cannot be read.
    pub(super) fn accounts(&self) -> Result<(Vec<Account>, Vec<Account>), LeaseError> {
        let tag = self.owner_tag();
        let (mut ours, mut unattributed) = (Vec::new(), Vec::new());
        for (a, comment) in account::in_range_with_owner(self.setup.host(), &self.setup.accounts)? {
            match comment {
                Some(c) if c == tag => ours.push(a),
                Some(c) if c.starts_with("cordon ") => {}
                _ => unattributed.push(a),
            }
        }
        Ok((ours, unattributed))
    }

    /// The containers in cordon's state root labelled with this executor and this store.
    ///
    /// # Errors
    /// The runtime's listing cannot be read (never "none").
    pub(super) fn own_containers(&self) -> Result<Vec<String>, LeaseError> {
        let store = self.store.root().display().to_string();
        Ok(self
            .setup
            .runtime
            .containers()?
            .into_iter()
            .filter(|(_, labels)| {
                labels.get(LABEL_EXECUTOR) == Some(&self.setup.executor)
                    && labels.get(LABEL_STORE) == Some(&store)
            })
            .map(|(id, _)| id)
            .collect())
    }

    /// The lease-named directories of the run root (`<lease>` and the dot-named ones they are
    /// made under), split into this executor's and this store's (by their owner file) and the
    /// ones whose owner cannot be read; anyone else's are not listed.
    ///
    /// # Errors
    /// The run root cannot be listed.
    pub(super) fn run_dirs(&self) -> Result<(Vec<PathBuf>, Vec<PathBuf>), LeaseError> {
        let root = &self.setup.run_root;
        let (mut ours, mut unattributed) = (Vec::new(), Vec::new());
        if !root.try_exists().map_err(io("stat", root))? {
            return Ok((ours, unattributed));
        }
        let store = self.store.root().display().to_string();
        for entry in fs::read_dir(root).map_err(io("list", root))? {
            let path = entry.map_err(io("list", root))?.path();
            let is_lease = path.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                let id = n.strip_prefix('.').unwrap_or(n);
                id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())
            });
            if !is_lease {
                continue;
            }
            let owner = store::open_nofollow(&path.join(OWNER_FILE))
                .ok()
                .and_then(|mut f| {
                    let mut text = Vec::new();
                    f.read_to_end(&mut text).ok()?;
                    serde_json::from_slice::<Owner>(&text).ok()
                });
            match owner {
                Some(o) if o.executor == self.setup.executor && o.store == store => ours.push(path),
                Some(_) => {}
                None => unattributed.push(path),
            }
        }
        Ok((ours, unattributed))
    }

    /// Quiescence of this executor in this store, taking no lock: no records of it, no
    /// containers labelled with it and this store, no run directories or accounts it owns (or
    /// whose owner cannot be read), no cgroups under its parent, no mounts under cordon's
    /// roots. Returns what remains (empty when quiescent).
    ///
    /// # Errors
    /// Something could not be inspected.
    pub fn check(&self) -> Result<Vec<Leftover>, LeaseError> {
        // This executor's records (a record that cannot be read, anyone's, is an error).
        let mut left: Vec<Leftover> = read_records(&self.store, &self.setup.executor)?
            .into_iter()
            .map(|r| Leftover::LeaseRecord {
                path: self
                    .store
                    .path("leases", &format!("{}.json", r.lease))
                    .display()
                    .to_string(),
                lease: r.lease,
            })
            .collect();
        left.extend(
            self.own_containers()?
                .into_iter()
                .map(|id| Leftover::Container { id }),
        );
        let shown = |p: &Path| p.display().to_string();
        let (ours, unattributed) = self.run_dirs()?;
        for (paths, attributed) in [(ours, true), (unattributed, false)] {
            left.extend(paths.iter().map(|p| Leftover::RunDirectory {
                path: shown(p),
                attributed,
            }));
        }
        let (ours, unattributed) = self.accounts()?;
        for (accounts, attributed) in [(ours, true), (unattributed, false)] {
            left.extend(accounts.into_iter().map(|a| Leftover::Account {
                name: a.name,
                uid: a.uid,
                attributed,
            }));
        }
        for cg in self.setup.leftover_cgroups()? {
            left.push(Leftover::Cgroup { path: shown(&cg) });
        }
        for p in self.setup.mount_points()? {
            if p.starts_with(&self.setup.run_root) || p.starts_with(self.store.root()) {
                left.push(Leftover::Mount { path: shown(&p) });
            }
        }
        Ok(left)
    }
}
