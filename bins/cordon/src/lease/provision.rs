//! One lease's life up to its launch: begin (the record, durably, before any resource),
//! provision (account, run directory), the lease's mounts (tmpfs, copies, overlays), its
//! protected files and secret, and creating and running its container.

use super::*;
use crate::walk::{Kind, Stop};

/// The walk's findings in a store tree are the tree's: not what cordon wrote there.
fn walked(root: &Path) -> impl FnOnce(Stop<LeaseError>) -> LeaseError + '_ {
    move |stop| match stop {
        Stop::Walk(e) => LeaseError::Protected {
            path: root.to_path_buf(),
            why: e.to_string(),
        },
        Stop::Visit(e) => e,
    }
}

/// The bytes (whole pages per file, plus one) and inodes (plus slack) a tmpfs needs to hold a
/// copy of the tree at `root`.
pub(super) fn tree_size(root: &Path) -> Result<(u64, u64), LeaseError> {
    const PAGE: u64 = 4096;
    let (mut bytes, mut inodes) = (PAGE, 16u64);
    crate::walk::walk(root, &mut |n| -> Result<(), Stop<LeaseError>> {
        match n.stat.kind {
            _ if n.path.is_empty() => {}
            Kind::Dir => inodes += 1,
            Kind::File => {
                inodes += 1;
                bytes += n.stat.size.div_ceil(PAGE) * PAGE;
            }
            Kind::Symlink | Kind::Fifo | Kind::Socket | Kind::Device => {
                return Err(Stop::Visit(LeaseError::Protected {
                    path: root.join(n.path),
                    why: "a store tree holds only regular files and directories".into(),
                }));
            }
        }
        Ok(())
    })
    .map_err(walked(root))?;
    Ok((bytes, inodes))
}

/// Copy the tree at `from` into the empty directory `to`: directories 0555 (sealed once their
/// contents are in), files 0444 or 0555 (executable as in the store), no link followed, each
/// file read from the inode the walk examined.
pub(super) fn copy_tree(from: &Path, to: &Path) -> Result<(), LeaseError> {
    let mut dirs = vec![to.to_path_buf()];
    // On a terminal, how far a large tree's copy into the lease has come.
    let mut meter = crate::voice::Meter::new("cordon: copying into the lease");
    crate::walk::walk(from, &mut |n| -> Result<(), Stop<LeaseError>> {
        if n.path.is_empty() {
            return Ok(());
        }
        let dst = to.join(n.path);
        if n.stat.kind == Kind::Dir {
            fs::DirBuilder::new()
                .mode(0o755)
                .create(&dst)
                .map_err(|e| Stop::Visit(io("create", &dst)(e)))?;
            dirs.push(dst);
            return Ok(());
        }
        let mut input = n.open()?;
        let mut out = store::create_exclusive(&dst, 0o600).map_err(|e| Stop::Visit(e.into()))?;
        let copied =
            std::io::copy(&mut input, &mut out).map_err(|e| Stop::Visit(io("copy", &dst)(e)))?;
        meter.add(copied);
        let mode = if n.stat.mode & 0o111 != 0 {
            0o555
        } else {
            0o444
        };
        out.set_permissions(fs::Permissions::from_mode(mode))
            .map_err(|e| Stop::Visit(io("chmod", &dst)(e)))?;
        Ok(())
    })
    .map_err(walked(from))?;
    // A directory after its parent in the walk: in reverse, each is sealed after its contents.
    for d in dirs.iter().rev() {
        fs::set_permissions(d, fs::Permissions::from_mode(0o555)).map_err(io("chmod", d))?;
    }
    Ok(())
}

/// Whether the open file `f` is exactly what cordon wrote: a regular file of this user's with
/// `mode`, one link and `size` bytes; else what it is instead.
fn exactly(f: &File, mode: u32, size: u64) -> Result<(), String> {
    let m = f.metadata().map_err(|e| e.to_string())?;
    if m.is_file()
        && m.uid() == nix::unistd::geteuid().as_raw()
        && m.mode() & 0o7777 == mode
        && m.nlink() == 1
        && m.len() == size
    {
        Ok(())
    } else {
        Err(format!(
            "owner {} mode {:o} links {} size {}",
            m.uid(),
            m.mode() & 0o7777,
            m.nlink(),
            m.len()
        ))
    }
}

impl Manager {
    /// Begin a lease that ends `budget` from now (the run's absolute deadline, on this boot's
    /// `CLOCK_BOOTTIME`): write its record (durably, before any resource exists), naming this
    /// process as its supervisor.
    ///
    /// # Errors
    /// The store failed.
    pub fn begin(&self, authority: &str, budget: Duration) -> Result<Lease, LeaseError> {
        self.begin_with(authority, &[], budget)
    }

    /// [`Manager::begin`], naming the mount points (relative to the run directory) the lease
    /// will create, so that a crash after mounting leaves a record that says what to unmount.
    ///
    /// # Errors
    /// The store failed.
    pub fn begin_with(
        &self,
        authority: &str,
        mounts: &[&str],
        budget: Duration,
    ) -> Result<Lease, LeaseError> {
        self.begin_resources(authority, None, mounts, budget, true)
    }

    /// [`Manager::begin_with`] for a run of `candidate`'s engine tree: its record names the
    /// candidate, so an incident of the run stops it under this authority ([`super::incident`]).
    ///
    /// # Errors
    /// The store failed.
    pub fn begin_for(
        &self,
        authority: &str,
        candidate: &crate::canonical::Digest,
        mounts: &[&str],
        budget: Duration,
    ) -> Result<Lease, LeaseError> {
        self.begin_resources(authority, Some(candidate), mounts, budget, true)
    }

    /// Begin a lease for a parser child: an account and a run directory, no cgroup, no
    /// container (the child is a process of this one, killed with it).
    ///
    /// # Errors
    /// The store failed.
    pub fn begin_child(&self, authority: &str, budget: Duration) -> Result<Lease, LeaseError> {
        self.begin_resources(authority, None, &[], budget, false)
    }

    pub(super) fn begin_resources(
        &self,
        authority: &str,
        candidate: Option<&crate::canonical::Digest>,
        mounts: &[&str],
        budget: Duration,
        container: bool,
    ) -> Result<Lease, LeaseError> {
        // No new work where a quarantine stands (the host's or this executor's).
        quarantine::check(&self.store, &self.setup.executor, &[])?;
        let supervisor = Supervisor::this(self.setup.host())
            .map_err(io("read", Path::new("/proc/self/stat")))?;
        let now = BootTime::now(self.setup.host())
            .map_err(io("read the boot clock and", Path::new(BOOT_ID)))?;
        // A lease of an earlier boot is a host reset no recovery has classified (and
        // quarantined) yet: nothing new starts beside it. A sole manager sees every record; a
        // shared one (parser children) runs beside live peers and leaves this to the next.
        if !self.shared
            && let Some(r) = self
                .records()?
                .into_iter()
                .find(|r| r.deadline.boot_id != now.boot_id)
        {
            return Err(LeaseError::Unrecovered { lease: r.lease });
        }
        let deadline = now.after(budget);
        let lease = fresh_id();
        let run_dir = self.setup.run_root.join(&lease);
        let account = account::for_lease(&self.setup.accounts, &lease);
        // Creation order: account, run directory, mounts, then the runtime's cgroup and the
        // container; release walks this list backwards.
        let mut resources = vec![
            Resource::Account {
                name: account.name.clone(),
                uid: account.uid,
                gid: account.gid,
            },
            Resource::RunDir {
                path: run_dir.clone(),
            },
        ];
        resources.extend(mounts.iter().map(|m| Resource::Mount {
            path: run_dir.join(m),
        }));
        if container {
            resources.push(Resource::Cgroup {
                path: cgroup_path(&self.setup.executor, &lease),
            });
            resources.push(Resource::Container {
                id: format!("cordon-{lease}"),
            });
        }
        let record = Record {
            schema: LEASE_SCHEMA,
            executor: self.setup.executor.clone(),
            authority: authority.to_owned(),
            candidate: candidate.copied(),
            created_at: crate::receipt::now_rfc3339(),
            store: self.store.root().display().to_string(),
            deadline,
            supervisor,
            lease,
            resources,
        };
        let path = self.record_path(&record.lease);
        // Armed before the record exists: from the record's first moment, a container it names
        // is ended at the deadline or when this process is gone, whoever else runs or not.
        let watchdog = if container {
            Some(self.start_watchdog(&record, &path, &run_dir)?)
        } else {
            None
        };
        if let Err(e) = self.publish(&record, &path) {
            if let Some(w) = watchdog {
                let _ = watchdog::end(w);
            }
            return Err(e);
        }
        if let Some(w) = watchdog {
            self.watchdogs
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .insert(record.lease.clone(), w);
        }
        Ok(Lease {
            container: format!("cordon-{}", record.lease),
            record,
            run_dir,
            account,
            protected: BTreeMap::new(),
            secret: None,
        })
    }

    /// Write `record` at `path` durably: staged in scratch, fsynced, published by link, one link.
    fn publish(&self, record: &Record, path: &Path) -> Result<(), LeaseError> {
        let text = to_canonical_json(record)?;
        let mut scratch = self.store.scratch()?;
        let (staged, mut f) = scratch.create_file()?;
        f.write_all(text.as_bytes()).map_err(io("write", &staged))?;
        f.sync_all().map_err(io("fsync", &staged))?;
        fs::hard_link(&staged, path).map_err(io("publish", path))?;
        // One hard link: the scratch name goes, so the record's link count is 1.
        fs::remove_file(&staged).map_err(io("unlink", &staged))?;
        store::fsync_dir(&self.store.root().join("leases"))?;
        Ok(())
    }

    /// Start and arm the watchdog of a container lease ([`watchdog`]): it kills the container
    /// at the deadline plus [`EXPIRY_GRACE`], or as soon as this process is gone, unless the
    /// record at `path` is gone first.
    fn start_watchdog(
        &self,
        record: &Record,
        path: &Path,
        run_dir: &Path,
    ) -> Result<crate::host::Process, LeaseError> {
        let id = record.container().unwrap_or_default();
        let watch = watchdog::Watch::for_run(
            &self.setup.watchdog,
            path,
            run_dir,
            &record.lease,
            &record.deadline,
            self.setup.runtime.tool(&["kill", "--all", id, "KILL"]),
        );
        watchdog::start(self.setup.host(), &watch).map_err(io("start the watchdog of", path))
    }

    /// Create the lease's account and run directory (which must not exist).
    ///
    /// # Errors
    /// The account's name or ids are taken, or the directory exists.
    pub fn provision(&self, lease: &Lease) -> Result<(), LeaseError> {
        account::create(
            self.setup.host(),
            &self.setup.accounts,
            lease.account(),
            &self.view().owner_tag(),
        )?;
        let dir = lease.run_dir();
        fs::create_dir_all(&self.setup.run_root).map_err(io("create", &self.setup.run_root))?;
        if dir.try_exists().map_err(io("stat", dir))? {
            return Err(LeaseError::RunDirExists(dir.to_path_buf()));
        }
        // Made under a dot name with its owner file, then renamed into place: every run
        // directory under its lease name says whose it is, so recovery touches only its own.
        let pending = self.setup.run_root.join(format!(".{}", lease.record.lease));
        match fs::DirBuilder::new().mode(0o711).create(&pending) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return Err(LeaseError::RunDirExists(pending));
            }
            Err(e) => return Err(io("create", &pending)(e)),
        }
        fs::set_permissions(&pending, fs::Permissions::from_mode(0o711))
            .map_err(io("chmod", &pending))?;
        let owner = to_canonical_json(&Owner {
            executor: self.setup.executor.clone(),
            store: lease.record.store.clone(),
            lease: lease.record.lease.clone(),
        })?;
        let owner_path = pending.join(OWNER_FILE);
        let mut f = store::create_exclusive(&owner_path, 0o444)?;
        f.write_all(owner.as_bytes())
            .and_then(|()| f.sync_all())
            .map_err(io("write", &owner_path))?;
        store::rename_noreplace(&pending, dir).map_err(|e| match e {
            e if store::is_exists(&e) => LeaseError::RunDirExists(dir.to_path_buf()),
            e => e.into(),
        })?;
        store::fsync_dir(&self.setup.run_root)?;
        fs::DirBuilder::new()
            .mode(0o700)
            .create(lease.bundle_dir())
            .map_err(io("create", &lease.bundle_dir()))?;
        Ok(())
    }

    /// [`Manager::provision`], then the parser child's empty root ([`Lease::jail_dir`]).
    ///
    /// # Errors
    /// As `provision`, or the directory cannot be made.
    pub fn provision_child(&self, lease: &Lease) -> Result<PathBuf, LeaseError> {
        self.provision(lease)?;
        let jail = lease.jail_dir();
        fs::DirBuilder::new()
            .mode(0o500)
            .create(&jail)
            .map_err(io("create", &jail))?;
        Ok(jail)
    }

    /// Mount one of the lease's writable scratch areas (the staging area, `/tmp`): a private
    /// tmpfs at `point` bounded in bytes (and in inodes when `inodes` is given), its root mode
    /// 0700 and owned by the run account. The kernel enforces the bounds, so a full area is the
    /// workload's ENOSPC, never the host's disk. The container sees it through a bind, which
    /// the runtime never re-modes (it gives a tmpfs *mount* the mode of the directory it covers,
    /// 0555 in a sealed image).
    ///
    /// # Errors
    /// The mount point is not one the record names, or the mount failed.
    pub fn mount_tmpfs(
        &self,
        lease: &Lease,
        point: &Path,
        bytes: u64,
        inodes: Option<u64>,
    ) -> Result<PathBuf, LeaseError> {
        let point = lease.named_mount_point(point)?;
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&point)
            .map_err(io("create", &point))?;
        let a = lease.account();
        let mut options = format!("size={bytes},mode=0700,uid={},gid={}", a.uid, a.gid);
        if let Some(n) = inodes {
            options.push_str(&format!(",nr_inodes={n}"));
        }
        self.setup
            .host()
            .mount(&MountRequest::Tmpfs {
                target: point.clone(),
                options,
            })
            .map_err(io("mount tmpfs on", &point))?;
        Ok(point)
    }

    /// Mount the lease's own read-only copy of the store tree `source` at `point`: a private
    /// tmpfs (root-owned, 0755) sized to the tree, its directories 0555 and files 0444 or 0555
    /// as in the store. Each lease gets its own inodes: no lock, inotify watch, link count or
    /// access time is shared with another lease, and the mount table names no store path.
    ///
    /// # Errors
    /// The mount point is not one the record names, the tree holds anything but regular files
    /// and directories, or a step failed.
    pub fn mount_copy(
        &self,
        lease: &Lease,
        point: &Path,
        source: &Path,
    ) -> Result<PathBuf, LeaseError> {
        let point = lease.named_mount_point(point)?;
        let (bytes, inodes) = tree_size(source)?;
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&point)
            .map_err(io("create", &point))?;
        self.setup
            .host()
            .mount(&MountRequest::Tmpfs {
                target: point.clone(),
                options: format!("size={bytes},nr_inodes={inodes},mode=0755,uid=0,gid=0"),
            })
            .map_err(io("mount tmpfs on", &point))?;
        copy_tree(source, &point)?;
        Ok(point)
    }

    /// Mount the lease's disposable root: an overlay at `point` whose lower layer is the
    /// read-only image rootfs and whose upper and work directories (created here, root-owned)
    /// belong to this lease alone, on a tmpfs of their own bounded to `bytes` and `inodes`
    /// (mounted at their common parent, root-owned 0700), so nothing written reaches the shared
    /// image cache, outlives the lease, or fills the host's disk or `/run`.
    ///
    /// # Errors
    /// The mount point or the writable layer's parent is not one the record names, upper and
    /// work do not share a parent, or a directory or a mount failed.
    #[allow(clippy::too_many_arguments)]
    pub fn mount_overlay(
        &self,
        lease: &Lease,
        point: &Path,
        lower: &Path,
        upper: &Path,
        work: &Path,
        bytes: u64,
        inodes: u64,
    ) -> Result<PathBuf, LeaseError> {
        let point = lease.named_mount_point(point)?;
        // overlayfs needs upper and work on one filesystem: the bounded tmpfs is their parent.
        let state = match (upper.parent(), work.parent()) {
            (Some(a), Some(b)) if a == b => lease.named_mount_point(a)?,
            _ => {
                return Err(LeaseError::Protected {
                    path: upper.to_path_buf(),
                    why: "the overlay's upper and work directories must share a parent".into(),
                });
            }
        };
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&state)
            .map_err(io("create", &state))?;
        self.setup
            .host()
            .mount(&MountRequest::Tmpfs {
                target: state.clone(),
                options: format!("size={bytes},nr_inodes={inodes},mode=0700,uid=0,gid=0"),
            })
            .map_err(io("mount tmpfs on", &state))?;
        for d in [&point, upper, work] {
            if !d.starts_with(lease.run_dir()) {
                return Err(LeaseError::Protected {
                    path: d.to_path_buf(),
                    why: "outside the lease's run directory".into(),
                });
            }
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(d)
                .map_err(io("create", d))?;
        }
        self.setup
            .host()
            .mount(&MountRequest::Overlay {
                target: point.clone(),
                lower: lower.to_path_buf(),
                upper: upper.to_path_buf(),
                work: work.to_path_buf(),
            })
            .map_err(io("mount overlay on", &point))?;
        Ok(point)
    }

    /// Write a protected, root-owned file into the lease's bundle directory and remember its
    /// size and sha256 for the check before launch.
    ///
    /// # Errors
    /// The file could not be written.
    pub fn write_protected(
        &self,
        lease: &mut Lease,
        name: &str,
        bytes: &[u8],
    ) -> Result<PathBuf, LeaseError> {
        let path = lease.bundle_dir().join(name);
        let mut f = store::create_exclusive(&path, 0o600)?;
        f.write_all(bytes).map_err(io("write", &path))?;
        f.sync_all().map_err(io("fsync", &path))?;
        lease
            .protected
            .insert(path.clone(), (bytes.len() as u64, Digest::of_bytes(bytes)));
        Ok(path)
    }

    /// Write the declared secret into the run directory as `secret`: a regular file owned by
    /// this (root) process, mode 0400, one link. Its bytes reach the workload only on stdin,
    /// read back at launch ([`Manager::create`]) after [`Manager::check_protected`].
    ///
    /// # Errors
    /// The file exists or cannot be written.
    pub fn write_secret(&self, lease: &mut Lease, bytes: &[u8]) -> Result<PathBuf, LeaseError> {
        let path = lease.run_dir().join("secret");
        let mut f = store::create_exclusive(&path, 0o400)?;
        f.write_all(bytes).map_err(io("write", &path))?;
        f.sync_all().map_err(io("fsync", &path))?;
        lease.secret = Some((path.clone(), bytes.len() as u64));
        Ok(path)
    }

    /// The declared secret's bytes, from a descriptor whose file is checked first: a regular
    /// root-owned 0400 file with one link and its written size (not hashed: a digest of a
    /// secret is a thing to guess against).
    pub(super) fn read_secret(lease: &Lease) -> Result<Option<Vec<u8>>, LeaseError> {
        let Some((path, size)) = &lease.secret else {
            return Ok(None);
        };
        let bad = |why: String| LeaseError::Protected {
            path: path.clone(),
            why,
        };
        let mut f = store::open_nofollow(path).map_err(|e| bad(e.to_string()))?;
        exactly(&f, 0o400, *size).map_err(bad)?;
        let mut bytes = Vec::with_capacity(usize::try_from(*size).unwrap_or(0));
        f.read_to_end(&mut bytes).map_err(|e| bad(e.to_string()))?;
        if bytes.len() as u64 != *size {
            return Err(bad(format!("{} bytes read", bytes.len())));
        }
        Ok(Some(bytes))
    }

    /// Right before launch: every protected file is a regular root-owned 0600 file with one
    /// link, its recorded size and sha256.
    ///
    /// # Errors
    /// [`LeaseError::Protected`] naming what changed.
    pub fn check_protected(&self, lease: &Lease) -> Result<(), LeaseError> {
        for (path, (size, sha)) in &lease.protected {
            let bad = |why: String| LeaseError::Protected {
                path: path.clone(),
                why,
            };
            let f = store::open_nofollow(path).map_err(|e| bad(e.to_string()))?;
            exactly(&f, 0o600, *size).map_err(bad)?;
            let (found, _) = Digest::of_reader(f).map_err(|e| bad(e.to_string()))?;
            if &found != sha {
                return Err(bad(format!("sha256 is {found}")));
            }
        }
        Ok(())
    }

    /// The cgroup probe of a lease's container.
    #[must_use]
    pub fn cgroup(&self, lease: &Lease) -> CgroupProbe {
        self.setup.probe(&lease.record.lease)
    }

    /// Create the lease's container from its bundle, right after checking the protected files.
    ///
    /// # Errors
    /// A protected file changed, or the runtime failed.
    pub fn create(&self, lease: &Lease, mut stdio: Stdio3) -> Result<Created, LeaseError> {
        self.check_protected(lease)?;
        // The declared secret crosses on stdin only, read from the checked file.
        if let Some(bytes) = Self::read_secret(lease)? {
            stdio.stdin = crate::container::Input::Bytes(bytes);
        }
        Ok(self
            .setup
            .runtime
            .create(lease.container(), &lease.bundle_dir(), stdio)?)
    }

    /// Run the lease's bundle to its end or its deadline with captured output: check the
    /// protected files, create, start, wait, delete.
    ///
    /// # Errors
    /// A protected file changed, or the runtime failed.
    pub fn run(
        &self,
        lease: &Lease,
        deadline: Instant,
        caps: OutputCaps,
        stdin: Option<Vec<u8>>,
    ) -> Result<Finished, LeaseError> {
        let probe = self.cgroup(lease);
        Ok(self
            .create(lease, Stdio3::captured(stdin, caps))?
            .start()?
            .wait(deadline, &probe)?
            .delete()?)
    }
}
