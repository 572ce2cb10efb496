//! The host-global lock that serializes GPU work across lanes (seed 001 §4: "the controller
//! serializes GPU work"): every read — startup, warmup, conditioning and timed phases alike —
//! holds it from before its container is created until after its release, so no two reads'
//! phases ever overlap on one host, whichever lanes they run on.
//!
//! It is an exclusive `flock` on `<run root>.gpu.lock` — beside the run root (one per host),
//! not in it, so a released lease still leaves its run root empty. The kernel drops it when the
//! holder dies, so a crashed supervisor never wedges the host. What it does not own: fairness between waiters
//! (the kernel's), and any device state (the device receipts').

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use cordon::receipt::LockSpan;
use nix::fcntl::{Flock, FlockArg};

/// The lock file of the run root `run_root`: `<run root>.gpu.lock`.
#[must_use]
pub fn lock_path(run_root: &Path) -> std::path::PathBuf {
    let mut name = run_root.as_os_str().to_owned();
    name.push(".gpu.lock");
    name.into()
}

/// The held lock.
#[derive(Debug)]
pub struct GpuLock {
    _lock: Flock<File>,
    waited_ns: u64,
    from_unix_ns: u64,
}

fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// Wait for the lock.
///
/// # Errors
/// The run root or the lock file cannot be made or opened, or the lock cannot be taken.
pub fn acquire(run_root: &Path) -> std::io::Result<GpuLock> {
    if let Some(parent) = run_root.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        // Never follow a link planted where the lock lives.
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
        .open(lock_path(run_root))?;
    let asked = Instant::now();
    let lock = Flock::lock(file, FlockArg::LockExclusive).map_err(|(_, e)| e)?;
    Ok(GpuLock {
        _lock: lock,
        waited_ns: u64::try_from(asked.elapsed().as_nanos()).unwrap_or(u64::MAX),
        from_unix_ns: unix_ns(),
    })
}

impl GpuLock {
    /// Release the lock; the span it was held.
    #[must_use]
    pub fn release(self) -> LockSpan {
        let span = LockSpan {
            waited_ns: self.waited_ns,
            from_unix_ns: self.from_unix_ns,
            until_unix_ns: unix_ns(),
        };
        drop(self);
        span
    }
}
