//! The lease record: the resources a lease owns in creation order, its supervisor and the
//! run directory's owner note, the record's own checks, and reading every record of an
//! executor back from the store.

use super::*;

/// The lease record schema (2: resources are one typed list; 4: the deadline is a moment of
/// one boot's `CLOCK_BOOTTIME`, with that boot's id).
pub const LEASE_SCHEMA: u32 = 4;

/// Where the kernel names the running boot: a fresh random id at every boot.
pub const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

/// A moment on one boot's `CLOCK_BOOTTIME`: NTP steps and `settimeofday` do not move it, and it
/// keeps counting through a suspend, so a deadline passes while the host sleeps. It means
/// something only with its boot id: the clock starts again at every boot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BootTime {
    /// The boot ([`BOOT_ID`]'s text).
    pub boot_id: String,
    /// Milliseconds of `CLOCK_BOOTTIME`.
    pub ms: u64,
}

impl BootTime {
    /// Now: the boot id read through the host seam, the clock from the kernel.
    ///
    /// # Errors
    /// The boot id cannot be read or is not a boot id, or the clock cannot be read.
    pub fn now(host: &dyn crate::host::Host) -> std::io::Result<Self> {
        let text = host.read(Path::new(BOOT_ID))?;
        let boot_id = String::from_utf8_lossy(&text).trim().to_owned();
        // A UUID's 36 characters: what the kernel writes, and all a record may carry.
        if boot_id.len() != 36 || !boot_id.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-') {
            return Err(std::io::Error::other(format!(
                "{BOOT_ID} does not hold a boot id: {:?}",
                crate::text::printable(&boot_id)
            )));
        }
        let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME)?;
        let ms = u64::try_from(t.tv_sec())
            .unwrap_or(0)
            .saturating_mul(1000)
            .saturating_add(u64::try_from(t.tv_nsec() / 1_000_000).unwrap_or(0));
        Ok(Self { boot_id, ms })
    }

    /// `d` later, on the same boot.
    #[must_use]
    pub fn after(&self, d: Duration) -> Self {
        Self {
            boot_id: self.boot_id.clone(),
            ms: self
                .ms
                .saturating_add(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        }
    }

    /// Whether `self` (a deadline) has passed by more than `grace` at `now`: always, when
    /// `now` is of another boot (the clock it was set on is gone).
    #[must_use]
    pub fn passed(&self, grace: Duration, now: &Self) -> bool {
        now.boot_id != self.boot_id || now.ms > self.after(grace).ms
    }

    /// The milliseconds left until `self` at `now` (none on another boot).
    #[must_use]
    pub fn left(&self, now: &Self) -> u64 {
        if now.boot_id == self.boot_id {
            self.ms.saturating_sub(now.ms)
        } else {
            0
        }
    }
}

/// One host resource a lease owns. A record lists them in the order they are created; release
/// undoes them in reverse, one loop over this list, each kind with its own undo step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Resource {
    /// The per-run account (REQ-117).
    Account {
        /// `cordon-<8 hex>`.
        name: String,
        /// Its uid.
        uid: u32,
        /// Its gid.
        gid: u32,
    },
    /// The run directory (must not pre-exist; root-owned).
    RunDir {
        /// Its path, under the run root.
        path: PathBuf,
    },
    /// A mount point inside the run directory (staging tmpfs, overlay root).
    Mount {
        /// The mount point.
        path: PathBuf,
    },
    /// The container's cgroup (the runtime creates it from the bundle's `cgroupsPath`).
    Cgroup {
        /// The cgroup path.
        path: String,
    },
    /// The container.
    Container {
        /// Its id in cordon's state root.
        id: String,
    },
    /// A device handed to the container (the lane's GPUs): released by a device drain, which
    /// this build does not implement, so a record that names one is residue until it does.
    Device {
        /// The device node.
        path: PathBuf,
    },
}

/// A lease record, `leases/<lease>.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Record {
    /// [`LEASE_SCHEMA`].
    pub schema: u32,
    /// The executor that owns it.
    pub executor: String,
    /// The lease id (32 hex).
    pub lease: String,
    /// The authority identity the run is under.
    pub authority: String,
    /// The engine tree the run runs, when it runs one: an incident of the run stops that
    /// candidate under this authority ([`super::incident`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub candidate: Option<crate::canonical::Digest>,
    /// RFC 3339.
    pub created_at: String,
    /// The store whose `leases/` holds this record (its root path).
    pub store: String,
    /// The absolute deadline, on the boot the lease began in: past it (and [`EXPIRY_GRACE`])
    /// the lease is expired, whoever still holds it, and so is every lease of an earlier boot.
    pub deadline: BootTime,
    /// The supervising process.
    pub supervisor: Supervisor,
    /// What the lease owns, in creation order.
    pub resources: Vec<Resource>,
}

/// The process that supervises a lease: its pid and its start time (clock ticks since boot,
/// `/proc/<pid>/stat` field 22), so a reused pid is not mistaken for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Supervisor {
    /// Its pid.
    pub pid: u32,
    /// Its start time in clock ticks since boot.
    pub start_ticks: u64,
}

/// The owner file's content: what a run directory belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Owner {
    /// The executor.
    pub executor: String,
    /// The store root.
    pub store: String,
    /// The lease.
    pub lease: String,
}

/// Whether the run directory `dir` is there and is `owner`'s: `Ok(false)` when it is absent,
/// an error (residue) when it exists without an owner file naming exactly `owner` — never
/// removed on a guess. Only the `pending` dot-named directory `provision` made and left before
/// its owner file was written (a crash in between) may be owned without one, and only empty.
pub(super) fn owned_by(dir: &Path, owner: &Owner, pending: bool) -> Result<bool, String> {
    match fs::symlink_metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(format!("run directory {}: {e}", dir.display())),
        Ok(m) if !m.is_dir() => {
            return Err(format!(
                "run directory {} is not a directory: left for the operator",
                dir.display()
            ));
        }
        Ok(_) => {}
    }
    let read = store::open_nofollow(&dir.join(OWNER_FILE))
        .map_err(|e| e.to_string())
        .and_then(|mut f| {
            let mut text = Vec::new();
            f.read_to_end(&mut text).map_err(|e| e.to_string())?;
            Ok(text)
        });
    match read {
        Ok(text) => match serde_json::from_slice::<Owner>(&text) {
            Ok(found) if found == *owner => Ok(true),
            Ok(found) => Err(format!(
                "run directory {} belongs to executor {}, lease {}, not this lease: left alone",
                dir.display(),
                found.executor,
                found.lease
            )),
            Err(e) => Err(format!(
                "run directory {} has an unreadable owner file ({e}): left for the operator",
                dir.display()
            )),
        },
        Err(_) if pending && fs::read_dir(dir).is_ok_and(|mut d| d.next().is_none()) => Ok(true),
        Err(e) => Err(format!(
            "run directory {} has no owner file ({e}): left for the operator",
            dir.display()
        )),
    }
}

/// The start time (clock ticks since boot) of process `pid` through the host seam, or `None`
/// when it does not exist.
///
/// # Errors
/// `/proc/<pid>/stat` exists but cannot be read or parsed.
pub fn process_start(host: &dyn crate::host::Host, pid: u32) -> std::io::Result<Option<u64>> {
    let path = PathBuf::from(format!("/proc/{pid}/stat"));
    let text = match host.read(&path) {
        Ok(b) => String::from_utf8_lossy(&b).into_owned(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    // The command name (field 2) is parenthesised and may hold spaces: count after its end.
    text.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(19))
        .and_then(|t| t.parse().ok())
        .map(Some)
        .ok_or_else(|| std::io::Error::other(format!("{} is not a stat line", path.display())))
}

impl Supervisor {
    /// This process.
    ///
    /// # Errors
    /// Its own stat line cannot be read.
    pub fn this(host: &dyn crate::host::Host) -> std::io::Result<Self> {
        let pid = std::process::id();
        let start_ticks = process_start(host, pid)?
            .ok_or_else(|| std::io::Error::other("this process has no /proc entry"))?;
        Ok(Self { pid, start_ticks })
    }

    /// Whether the supervisor still runs (the same pid with the same start time).
    ///
    /// # Errors
    /// Its stat line exists but cannot be read.
    pub fn alive(&self, host: &dyn crate::host::Host) -> std::io::Result<bool> {
        Ok(process_start(host, self.pid)? == Some(self.start_ticks))
    }
}

impl Record {
    /// The run account.
    #[must_use]
    pub fn account(&self) -> Option<Account> {
        self.resources.iter().find_map(|r| match r {
            Resource::Account { name, uid, gid } => Some(Account {
                name: name.clone(),
                uid: *uid,
                gid: *gid,
            }),
            _ => None,
        })
    }

    /// The run directory.
    #[must_use]
    pub fn run_dir(&self) -> Option<&Path> {
        self.resources.iter().find_map(|r| match r {
            Resource::RunDir { path } => Some(path.as_path()),
            _ => None,
        })
    }

    /// The container id.
    #[must_use]
    pub fn container(&self) -> Option<&str> {
        self.resources.iter().find_map(|r| match r {
            Resource::Container { id } => Some(id.as_str()),
            _ => None,
        })
    }

    /// The mount points.
    pub fn mounts(&self) -> impl Iterator<Item = &Path> {
        self.resources.iter().filter_map(|r| match r {
            Resource::Mount { path } => Some(path.as_path()),
            _ => None,
        })
    }

    /// Exactly one account and run directory, and either exactly one cgroup and container (a
    /// container's lease) or neither (a parser child's lease): what every record cordon writes
    /// names, and what a record must name for its resources to be found again.
    pub(super) fn check_shape(&self) -> Result<(), String> {
        let count = |f: fn(&Resource) -> bool| self.resources.iter().filter(|r| f(r)).count();
        let runtime = [
            ("cgroup", count(|r| matches!(r, Resource::Cgroup { .. }))),
            (
                "container",
                count(|r| matches!(r, Resource::Container { .. })),
            ),
        ];
        // A parser child's lease has no cgroup and no container; any other has one of each.
        let want_runtime = usize::from(runtime.iter().any(|(_, n)| *n != 0));
        for (what, n, want) in [
            (
                "account",
                count(|r| matches!(r, Resource::Account { .. })),
                1,
            ),
            (
                "run directory",
                count(|r| matches!(r, Resource::RunDir { .. })),
                1,
            ),
            (runtime[0].0, runtime[0].1, want_runtime),
            (runtime[1].0, runtime[1].1, want_runtime),
        ] {
            if n != want {
                return Err(format!("it names {n} {what} resources, not {want}"));
            }
        }
        Ok(())
    }
}

/// Every lease record of `executor` in `store`, validated (regular, 0600, one link, parses).
///
/// # Errors
/// A record is unsafe or corrupt: recovery stops.
pub fn read_records(store: &Store, executor: &str) -> Result<Vec<Record>, LeaseError> {
    let mut out = read_all_records(store)?;
    out.retain(|r| r.executor == executor);
    Ok(out)
}

/// Every lease record in `store`, of every executor, validated as [`read_records`] validates
/// them, by lease id.
///
/// # Errors
/// A record is unsafe or corrupt.
pub fn read_all_records(store: &Store) -> Result<Vec<Record>, LeaseError> {
    let dir = store.root().join("leases");
    let mut out = Vec::new();
    for entry in fs::read_dir(&dir).map_err(io("list", &dir))? {
        let path = entry.map_err(io("list", &dir))?.path();
        if path.extension().is_none_or(|e| e != "json") {
            continue;
        }
        let bad = |why: String| LeaseError::Record {
            path: path.clone(),
            why,
        };
        let m = fs::symlink_metadata(&path).map_err(|e| bad(e.to_string()))?;
        if !m.is_file() {
            return Err(bad("not a regular file (a link?)".into()));
        }
        if m.mode() & 0o7777 != 0o600 || m.nlink() != 1 {
            return Err(bad(format!(
                "mode {:o} links {}",
                m.mode() & 0o7777,
                m.nlink()
            )));
        }
        let text = fs::read(&path).map_err(|e| bad(e.to_string()))?;
        let r: Record = serde_json::from_slice(&text).map_err(|e| bad(e.to_string()))?;
        if r.schema != LEASE_SCHEMA {
            return Err(bad(format!("schema {}", r.schema)));
        }
        r.check_shape().map_err(bad)?;
        out.push(r);
    }
    out.sort_by(|a, b| a.lease.cmp(&b.lease));
    Ok(out)
}
