//! Release and recovery: remove a lease's container and prove it absent (twice), unmount,
//! remove its run directory, account and cgroup, unlink its record — everything attempted,
//! what fails is the residue — and startup recovery of records no live manager holds.

use super::*;

/// Remove run directory `dir` so that a crash at any moment leaves it attributable: every
/// entry but the owner file first; then, under the pending dot-name (renamed without replace),
/// the owner file and the directory. A crash before the rename leaves the owner file in place;
/// after it, a pending directory that is owned or empty — both of which release removes.
fn remove_run_dir(dir: &Path, pending: &Path) -> std::io::Result<()> {
    store::remove_entries_except(dir, OWNER_FILE)?;
    if dir != pending {
        store::rename_noreplace(dir, pending).map_err(std::io::Error::other)?;
    }
    match fs::remove_file(pending.join(OWNER_FILE)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    fs::remove_dir(pending)
}

impl Manager {
    /// Release a lease: remove the container, prove it absent (twice, to close the
    /// create/delete race), unmount, remove the run directory and the account, unlink the
    /// record. Everything is attempted; what fails is the residue.
    ///
    /// # Errors
    /// [`LeaseError::Residue`] listing what remains.
    pub fn release(&self, record: &Record) -> Result<(), LeaseError> {
        let released = self.release_all(std::slice::from_ref(record));
        let watched = self.end_watchdog(&record.lease);
        let mut residue = match (released, watched) {
            (Err(LeaseError::Residue(r)), _) => r,
            (Err(e), _) => return Err(e),
            (Ok(()), Err(why)) => Residue { items: vec![why] },
            (Ok(()), Ok(())) => return Ok(()),
        };
        // Ambiguous residue stops new work on this executor until it is proven quiescent, and
        // its candidate under this authority for good — the incident first, so a lift of the
        // quarantine never finds a candidate without one.
        let why = residue.items.join("; ");
        let incident = self.incident(quarantine::Cause::Residue, &why, record);
        residue
            .items
            .push(self.quarantine(quarantine::Cause::Residue, &why, Some(&record.lease)));
        residue.items.extend(incident);
        Err(residue.into())
    }

    /// End the watchdog of `lease` once its record is gone; while the record stays (residue),
    /// the watchdog stays too, until this manager ends.
    fn end_watchdog(&self, lease: &str) -> Result<(), String> {
        match fs::symlink_metadata(self.record_path(lease)) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            _ => return Ok(()),
        }
        let held = self
            .watchdogs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(lease);
        held.map_or(Ok(()), watchdog::end)
    }

    /// Release many leases with one container listing before and two after (the absence
    /// proof), so recovery of many records costs a few runtime calls, not a few per record.
    pub(super) fn release_all(&self, records: &[Record]) -> Result<(), LeaseError> {
        let mut residue = Vec::new();
        // Leases that never had a container (parser children) have none to prove absent.
        let containers = records
            .iter()
            .flat_map(|r| &r.resources)
            .any(|r| matches!(r, Resource::Container { .. }));
        if !containers {
            return self.release_rest(records, residue);
        }
        let rt = &self.setup.runtime;
        let mine = |labels: &crate::runtime::Labels| {
            labels.get(LABEL_EXECUTOR) == Some(&self.setup.executor)
                && records.iter().any(|r| {
                    labels.get(LABEL_LEASE) == Some(&r.lease)
                        && labels.get(LABEL_AUTHORITY) == Some(&r.authority)
                })
        };
        let listed: Option<Vec<String>> = rt
            .containers()
            .ok()
            .map(|l| l.into_iter().map(|(id, _)| id).collect());
        for id in records
            .iter()
            .flat_map(|r| &r.resources)
            .filter_map(|r| match r {
                Resource::Container { id } => Some(id),
                _ => None,
            })
        {
            // A container the runtime does not list was never created or is gone; one it lists,
            // or any when listing failed, is killed and deleted.
            let present = listed.as_ref().is_none_or(|ids| ids.contains(id));
            if present && let Err(e) = rt.remove(id) {
                residue.push(format!("container {id}: {e}"));
            }
        }
        for attempt in 0..2 {
            match rt.containers() {
                Ok(all) => {
                    let left: Vec<String> = all
                        .into_iter()
                        .filter(|(_, l)| mine(l))
                        .map(|(id, _)| id)
                        .collect();
                    for id in &left {
                        let _ = rt.remove(id);
                    }
                    if attempt == 1 && !left.is_empty() {
                        residue.push(format!("containers still listed: {}", left.join(", ")));
                    }
                }
                Err(e) => residue.push(format!("cannot list containers: {e}")),
            }
            if attempt == 0 {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let proof_failed = !residue.is_empty();
        if proof_failed {
            // A container not proven gone may still run the candidate's processes: its run
            // directory, mounts, cgroup and account stay as they are (residue, retried by the
            // next recovery) rather than be removed under it.
            residue.push(
                "the lease's other resources are kept until its containers are proven gone".into(),
            );
            return Err(Residue { items: residue }.into());
        }
        self.release_rest(records, residue)
    }

    /// Everything but the containers, record by record; a record goes once its resources did.
    pub(super) fn release_rest(
        &self,
        records: &[Record],
        mut residue: Vec<String>,
    ) -> Result<(), LeaseError> {
        for record in records {
            let mut own = self.release_resources(record);
            if own.is_empty() {
                let path = self.record_path(&record.lease);
                match fs::remove_file(&path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => own.push(format!("record {}: {e}", path.display())),
                }
            }
            residue.extend(own);
        }
        let _ = store::fsync_dir(&self.store.root().join("leases"));
        if residue.is_empty() {
            Ok(())
        } else {
            Err(Residue { items: residue }.into())
        }
    }

    /// The host resources of one lease, undone in reverse creation order, one step per kind.
    /// The container is not among them: the batch before removed it and proved it absent.
    pub(super) fn release_resources(&self, record: &Record) -> Vec<String> {
        let mut residue = Vec::new();
        let points = self.setup.mount_points();
        for resource in record.resources.iter().rev() {
            let undone: Result<(), String> = match resource {
                Resource::Container { .. } => Ok(()),
                Resource::Cgroup { path } => {
                    let probe = CgroupProbe {
                        host: self.setup.runtime.host.clone(),
                        root: self.setup.cgroup_root.clone(),
                        path: path.clone(),
                    };
                    // A patcher's bounded child and its sibling leaf (prebuild) go before their
                    // parent: the runtime's delete removes them all, but a run that ended
                    // before its create, or before its delete, left them.
                    match probe.dirs() {
                        Ok(dirs) => dirs.iter().try_for_each(|d| {
                            super::NESTED_CGROUPS
                                .iter()
                                .map(|n| d.join(n))
                                .chain([d.clone()])
                                .collect::<Vec<_>>()
                                .iter()
                                .try_for_each(|d| self.setup.host().remove_dir(d))
                                .map_err(|e| format!("cgroup {}: {e}", d.display()))
                        }),
                        Err(e) => Err(format!("cgroup {path}: the hierarchy cannot be read: {e}")),
                    }
                }
                Resource::Mount { path } => match &points {
                    Ok(p) if p.contains(path) => self
                        .setup
                        .host()
                        .unmount(path)
                        .map_err(|e| format!("mount {}: {e}", path.display())),
                    Ok(_) => Ok(()),
                    Err(e) => Err(format!("mount {}: {e}", path.display())),
                },
                Resource::RunDir { path } => {
                    // Only a lease directory strictly inside the run root is ever removed, with
                    // the dot-named directory it was made under (a crash may leave that), and
                    // only when its owner file names this lease: a directory that was there
                    // before (provision refuses it) or that another writer made is left alone.
                    // While anything released before it is still there (a mount inside it
                    // that would not go) it is kept whole, owner file included, for the next
                    // recovery: removing around a live mount would leave it unattributable.
                    if !residue.is_empty() {
                        Err(format!(
                            "run directory {} kept while the residue above remains",
                            path.display()
                        ))
                    } else if path.starts_with(&self.setup.run_root) && *path != self.setup.run_root
                    {
                        let pending = path.file_name().map(|n| {
                            let mut dot = std::ffi::OsString::from(".");
                            dot.push(n);
                            path.with_file_name(dot)
                        });
                        let owner = Owner {
                            executor: self.setup.executor.clone(),
                            store: record.store.clone(),
                            lease: record.lease.clone(),
                        };
                        let pending = pending.unwrap_or_else(|| path.clone());
                        // The pending name first: the run directory is renamed onto it.
                        [(pending.clone(), true), (path.clone(), false)]
                            .into_iter()
                            .try_for_each(|(dir, is_pending)| {
                                if owned_by(&dir, &owner, is_pending)? {
                                    remove_run_dir(&dir, &pending).map_err(|e| {
                                        format!("run directory {}: {e}", dir.display())
                                    })
                                } else {
                                    Ok(())
                                }
                            })
                    } else {
                        Err(format!(
                            "run directory {} is outside the run root",
                            path.display()
                        ))
                    }
                }
                Resource::Account { name, uid, gid } => {
                    let a = Account {
                        name: name.clone(),
                        uid: *uid,
                        gid: *gid,
                    };
                    account::remove(self.setup.host(), &self.setup.accounts, &a)
                        .map_err(|e| format!("account {name}: {e}"))
                }
                Resource::Device { path } => Err(format!(
                    "device {}: this build cannot drain devices",
                    path.display()
                )),
            };
            if let Err(item) = undone {
                residue.push(item);
            }
        }
        residue
    }

    /// Every lease record of this executor, validated (regular, 0600, one link, parses).
    ///
    /// # Errors
    /// A record is unsafe or corrupt: recovery stops.
    pub fn records(&self) -> Result<Vec<Record>, LeaseError> {
        read_records(&self.store, &self.setup.executor)
    }

    /// Unmount every mount under `dir`, deepest first.
    pub(super) fn unmount_inside(&self, dir: &Path) -> Result<(), String> {
        let mut inside: Vec<PathBuf> = self
            .setup
            .mount_points()
            .map_err(|e| e.to_string())?
            .into_iter()
            .filter(|p| p.starts_with(dir))
            .collect();
        inside.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        inside.iter().try_for_each(|p| {
            self.setup
                .host()
                .unmount(p)
                .map_err(|e| format!("mount {} inside it: {e}", p.display()))
        })
    }

    /// Startup recovery: release every record (this manager holds the executor's lock, so no
    /// live manager holds them), then remove orphans: containers with this executor's label,
    /// run directories, accounts in the policy range. Returns what was released.
    ///
    /// # Errors
    /// A record is unsafe, or something could not be removed (the residue).
    pub fn recover(&self) -> Result<Vec<String>, LeaseError> {
        // Other holders of a shared lock are alive and own their records.
        if self.shared {
            return Err(LeaseError::Busy {
                executor: self.setup.executor.clone(),
                holders: Vec::new(),
            });
        }
        let view = self.view();
        let mut done = Vec::new();
        let mut residue = Vec::new();
        let records = self.records()?;
        // Leases of an earlier boot: the host reset under them. What they held is quarantined
        // until an operator proves it quiescent, whatever this recovery manages to remove.
        let boot = BootTime::now(self.setup.host())
            .map_err(io("read the boot clock and", Path::new(BOOT_ID)))?;
        let reset: Vec<&Record> = records
            .iter()
            .filter(|r| r.deadline.boot_id != boot.boot_id)
            .collect();
        if let Some(first) = reset.first() {
            let why = format!(
                "{} lease(s) of an earlier boot found at recovery: {}",
                reset.len(),
                reset
                    .iter()
                    .map(|r| r.lease.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            // Each candidate a reset interrupted is not run again under its authority.
            for r in &reset {
                done.extend(self.incident(quarantine::Cause::HostReset, &why, r));
            }
            done.push(self.quarantine(quarantine::Cause::HostReset, &why, Some(&first.lease)));
        }
        match self.release_all(&records) {
            Ok(()) => done.extend(records.iter().map(|r| format!("lease {}", r.lease))),
            Err(LeaseError::Residue(x)) => {
                // A run whose lease recovery cannot release ended in an incident too.
                let why = x.items.join("; ");
                for r in records
                    .iter()
                    .filter(|r| self.record_path(&r.lease).exists())
                {
                    residue.extend(self.incident(quarantine::Cause::Residue, &why, r));
                }
                residue.extend(x.items);
            }
            Err(e) => return Err(e),
        }
        for id in view.own_containers()? {
            match self.setup.runtime.remove(&id) {
                Ok(()) => done.push(format!("container {id}")),
                Err(e) => residue.push(format!("container {id}: {e}")),
            }
        }
        // Orphan run directories (no record names them any more): a lease whose release just
        // left residue keeps its record and its directory whole; any other is unmounted inside
        // (deepest first) and then removed — never removed around a mount, which would take its
        // owner file and leave it unattributable.
        let kept: std::collections::BTreeSet<String> =
            self.records()?.into_iter().map(|r| r.lease).collect();
        let (ours, unattributed) = view.run_dirs()?;
        for path in ours {
            let id = path
                .file_name()
                .and_then(|n| n.to_str())
                .map(|n| n.trim_start_matches('.'));
            if id.is_some_and(|id| kept.contains(id)) {
                continue;
            }
            let pending = match path.file_name().and_then(|n| n.to_str()) {
                Some(n) if !n.starts_with('.') => path.with_file_name(format!(".{n}")),
                _ => path.clone(),
            };
            match self
                .unmount_inside(&path)
                .and_then(|()| remove_run_dir(&path, &pending).map_err(|e| e.to_string()))
            {
                Ok(()) => done.push(format!("run directory {}", path.display())),
                Err(e) => residue.push(format!("run directory {}: {e}", path.display())),
            }
        }
        residue.extend(unattributed.iter().map(|p| {
            format!(
                "run directory {} has no readable owner: left alone",
                p.display()
            )
        }));
        // Cgroups of this executor that no container holds any more (empty ones can be
        // removed; one with processes left stays as residue).
        for cg in self.setup.leftover_cgroups()? {
            match self.setup.host().remove_dir(&cg) {
                Ok(()) => done.push(format!("cgroup {}", cg.display())),
                Err(e) => residue.push(format!("cgroup {}: {e}", cg.display())),
            }
        }
        // The executor's own parent, once nothing is under it: the sole manager holds the
        // executor, so no container of it can be made meanwhile, and a parent left per
        // executor ever run would pile up. Not a lease's resource, so not listed as
        // released; one that cannot be removed is residue like any other cgroup.
        if residue.is_empty() {
            for parent in self.setup.cgroup_parents()? {
                match self.setup.host().remove_dir(&parent) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => residue.push(format!("cgroup parent {}: {e}", parent.display())),
                }
            }
            // Lock files of executors nobody holds (this one's is held here): recreated by
            // the next stage of each, so only the pile-up goes.
            super::remove_unheld_locks(&self.setup.lock_dir, &self.setup.lock_path());
        }
        // Accounts of this executor and store no record names any more (their record went with
        // a lost store, say), by the owner tag in their comment; one without a tag is left to
        // the operator, and another executor's is never touched.
        let (ours, unattributed) = view.accounts()?;
        for a in ours {
            match account::remove(self.setup.host(), &self.setup.accounts, &a) {
                Ok(()) => done.push(format!("account {}", a.name)),
                Err(e) => residue.push(format!("account {}: {e}", a.name)),
            }
        }
        residue.extend(
            unattributed
                .iter()
                .map(|a| format!("account {} has no owner tag: left alone", a.name)),
        );
        if residue.is_empty() {
            Ok(done)
        } else {
            let why = residue.join("; ");
            residue.push(self.quarantine(quarantine::Cause::Residue, &why, None));
            Err(Residue { items: residue }.into())
        }
    }
}
