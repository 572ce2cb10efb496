//! The host-global lock that serializes GPU work across lanes (seed 001 §4: "the controller
//! serializes GPU work"). A lane session holds it from before its container is created until
//! after its release; a qualification holds it once for its three reads, so no other read —
//! of any qualification, on any lane — runs between B, C and B′ or overlaps any of their
//! phases (startup, warmup, conditioning, timed).
//!
//! It is an exclusive `flock` on `.gpu.lock` in the host's lock directory (`/run/cordon-locks`,
//! a constant, not a flag: every store, run directory and state root shares it), opened by
//! [`cordon::lease::open_lock_file`], which refuses a link, a FIFO or a file others could
//! open. The kernel drops it when the holder dies, so a crashed supervisor never wedges the
//! host. What it does not own: a container a dead supervisor left running (`cordon-reap`
//! releases it), fairness between waiters (the kernel's), device state (the device receipts').

use std::fs::File;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use cordon::receipt::LockSpan;
use nix::fcntl::{Flock, FlockArg};

/// The lock file's name in the lock directory: it starts with a dot, which no executor name
/// may (the executors' locks, `<executor>.lock`, share the directory).
pub const LOCK_FILE: &str = ".gpu.lock";

/// The held lock.
#[derive(Debug)]
pub struct GpuLock {
    _lock: Flock<File>,
    waited_ns: u64,
}

/// Now, ns since the Unix epoch (the host's wall clock: it dates spans, it decides nothing).
#[must_use]
pub fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// How often a waiter looks again: a signal ends the wait within this.
const RETRY: Duration = Duration::from_millis(25);

/// Wait for the lock in `lock_dir`, until it is taken or a signal reaches this process
/// ([`cordon::interrupt`]; a blocking `flock` would hold an operator's Ctrl-C until another
/// lane's whole read ended).
///
/// # Errors
/// The lock file cannot be made, opened or trusted, the lock cannot be taken, or a signal
/// arrived while waiting (`ErrorKind::Interrupted`).
pub fn acquire(lock_dir: &Path) -> std::io::Result<GpuLock> {
    let mut file = cordon::lease::open_lock_file(&lock_dir.join(LOCK_FILE))?;
    let asked = Instant::now();
    let lock = loop {
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => break lock,
            Err((back, nix::errno::Errno::EWOULDBLOCK)) => file = back,
            Err((_, e)) => return Err(e.into()),
        }
        cordon::interrupt::check()
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::Interrupted, e))?;
        std::thread::sleep(RETRY);
    };
    Ok(GpuLock {
        _lock: lock,
        waited_ns: u64::try_from(asked.elapsed().as_nanos()).unwrap_or(u64::MAX),
    })
}

impl GpuLock {
    /// The span of a read that began at `from_unix_ns` under this lock and ends now.
    #[must_use]
    pub fn span(&self, from_unix_ns: u64) -> LockSpan {
        LockSpan {
            waited_ns: self.waited_ns,
            from_unix_ns,
            until_unix_ns: unix_ns(),
        }
    }
}
