//! The host-global lock that serializes GPU work across lanes (seed 001 §4: "the controller
//! serializes GPU work"). A lane session holds it from before its container is created until
//! after its release; a qualification holds it once for its three reads, so no other read —
//! of any qualification, on any lane — runs between B, C and B′ or overlaps any of their
//! phases (startup, warmup, conditioning, timed).
//!
//! It is an exclusive `flock` on `.gpu.lock` in the host's lock directory (`/run/cordon-locks`,
//! a constant, not a flag: every store, run directory and state root shares it), taken by
//! [`cordon::lease::lock_at`], which refuses a link, a FIFO or a file others could open, and
//! takes it again when recovery removed the file under it. The kernel drops it when the holder dies, so a crashed supervisor never wedges the
//! host. What it does not own: a container a dead supervisor left running (`cordon-reap`
//! releases it), fairness between waiters (the kernel's), device state (the device guard's, through the GPUs the lock holds).

use std::fs::File;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use cordon::receipt::LockSpan;
use nix::fcntl::{Flock, FlockArg};

/// The lock file's name in the lock directory: it starts with a dot, which no executor name
/// may (the executors' locks, `<executor>.lock`, share the directory).
pub const LOCK_FILE: &str = ".gpu.lock";

/// The held lock, with the host's GPUs when the reads under it are on GPU lanes (reading
/// them is the lock holder's alone).
#[derive(Debug)]
pub struct GpuLock {
    _lock: Flock<File>,
    waited_ns: u64,
    devices: Option<crate::guard::Devices>,
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

/// How long a waiter waits before it says so.
const SAY_WAIT: Duration = Duration::from_secs(1);

/// One line on this process's stderr (the stage's own: the lock is taken deep inside a
/// session) when the wait passes [`SAY_WAIT`]: the lock and who holds it, by pid and command.
fn say_waiting(file: &File, path: &Path) {
    let by = cordon::lease::lock_holders_named(file);
    cordon::voice::say(
        &mut std::io::stderr(),
        cordon::voice::Level::Normal,
        &format!(
            "{}: waiting for the host's GPU lock {}, held by {by} (Ctrl-C stops the wait with a no-decision)",
            tool_name(),
            path.display()
        ),
    );
}

/// This binary's name (`cordon-lane`, `cordon-reference`: both take the lock).
fn tool_name() -> String {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "cordon".to_owned())
}

/// Wait for the lock in `lock_dir`, until it is taken or a signal reaches this process
/// ([`cordon::interrupt`]; a blocking `flock` would hold an operator's Ctrl-C until another
/// lane's whole read ended).
///
/// # Errors
/// The lock file cannot be made, opened or trusted, the lock cannot be taken, or a signal
/// arrived while waiting (`ErrorKind::Interrupted`).
pub fn acquire(lock_dir: &Path) -> std::io::Result<GpuLock> {
    let path = lock_dir.join(LOCK_FILE);
    let asked = Instant::now();
    let mut said = false;
    let lock = loop {
        // A lock on the file the path still names (recovery removes unheld lock files).
        let file = match cordon::lease::lock_at(&path, FlockArg::LockExclusiveNonblock)? {
            Ok(lock) => break lock,
            Err(busy) => busy,
        };
        if !said && asked.elapsed() >= SAY_WAIT {
            said = true;
            say_waiting(&file, &path);
        }
        cordon::interrupt::check()
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::Interrupted, e))?;
        std::thread::sleep(RETRY);
    };
    Ok(GpuLock {
        _lock: lock,
        waited_ns: u64::try_from(asked.elapsed().as_nanos()).unwrap_or(u64::MAX),
        devices: None,
    })
}

/// [`acquire`], then, when `policy`'s lanes name GPUs, open them through NVML for the reads
/// under the lock.
///
/// # Errors
/// The lock cannot be taken, or the lanes' GPUs cannot be opened.
pub fn acquire_for(
    policy: &cordon_policy_lang::Policy,
    lock_dir: &Path,
) -> Result<GpuLock, String> {
    let lock = acquire(lock_dir).map_err(|e| format!("cannot take the host's GPU lock: {e}"))?;
    let uuids: Vec<String> = crate::devices::named(policy)
        .into_iter()
        .map(|(_, u)| u)
        .collect();
    if uuids.is_empty() {
        return Ok(lock);
    }
    let nvml = cordon_device::nvml::Nvml::open(&uuids)
        .map_err(|e| format!("cannot read the lanes' GPUs: {e}"))?;
    Ok(lock.with_devices(crate::guard::Devices {
        gpus: std::sync::Arc::new(nvml),
        clock: std::sync::Arc::new(cordon_device::SystemClock::default()),
    }))
}

impl GpuLock {
    /// This lock with the host's GPUs read through `devices`.
    #[must_use]
    pub fn with_devices(mut self, devices: crate::guard::Devices) -> Self {
        self.devices = Some(devices);
        self
    }

    /// The host's GPUs, when this lock holds them.
    #[must_use]
    pub const fn devices(&self) -> Option<&crate::guard::Devices> {
        self.devices.as_ref()
    }

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

#[cfg(test)]
mod tests {
    /// Run as its own child (the variable naming the lock directory), this test's process
    /// waits for the lock the parent holds: past a second it says so on its stderr, naming
    /// the parent by pid, and takes the lock once the parent lets go.
    #[test]
    fn a_wait_past_a_second_names_the_holder() {
        if let Some(dir) = std::env::var_os("CORDON_LOCK_CHILD") {
            super::acquire(std::path::Path::new(&dir)).unwrap();
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let held = super::acquire(dir.path()).unwrap();
        let child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "--nocapture",
                "lock::tests::a_wait_past_a_second_names_the_holder",
            ])
            .env("CORDON_LOCK_CHILD", dir.path())
            .stderr(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(1500));
        drop(held);
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        let said = format!(
            "waiting for the host's GPU lock {}, held by pid {}",
            dir.path().join(super::LOCK_FILE).display(),
            std::process::id()
        );
        assert!(stderr.contains(&said), "{stderr}");
    }
}
