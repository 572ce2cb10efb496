//! What this process does when the operator (a terminal's Ctrl-C, `kill`, `timeout`, a closed
//! session) asks it to stop: SIGINT, SIGTERM and SIGHUP end a stage through its normal release,
//! never by dying with the candidate still running (brief §5, "Signals").
//!
//! It owns the process-wide record of the first such signal and the set of candidate processes
//! to stop when one arrives:
//! - [`install`] (the stage prologue) catches the three signals for the whole process, on a
//!   thread of its own that reads them from `signal-hook`'s self-pipe: no work happens in a
//!   signal handler, and a blocking call elsewhere is restarted, not failed (`SA_RESTART`);
//! - the first signal is recorded ([`raised`]) and every registered candidate process — a
//!   container's init, a confined parser child ([`Process::stop_on_interrupt`](crate::host::Process::stop_on_interrupt))
//!   — is sent SIGKILL, every registered transfer aborted ([`on_signal`]); a registration made
//!   after the signal acts at once;
//! - everything else stays the caller's: a stage checks [`check`] before each step that would
//!   make something new (a lease, a container, a start), lets its release run as after any
//!   other failure, and writes a no-decision receipt naming the signal.
//!
//! A second signal changes nothing: the handler stays installed, so the release it would
//! otherwise cut short runs to its end with the same absence proof as a normal one. Only
//! SIGKILL cannot be caught; a container's deadline outlives its supervisor for that case (the
//! lease record, read by `cordon-reap`).
//!
//! The runtime and the host's own tools run in process groups of their own
//! ([`Linux::spawn`](crate::host::Linux)), so a terminal's Ctrl-C reaches this process alone and
//! cannot kill a `runtime delete` half-way through a release.
//!
//! It does not decide what a stopped run means (the stage's receipt path does: a no-decision,
//! exit 3) and does not touch the kernel beyond the signal mask's handlers and SIGKILL through
//! each process's own supervisor (which never signals a reaped pid).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use nix::sys::signal::Signal;

use crate::host::process::Supervise;

/// The signals that end a stage through its release.
pub const HANDLED: [Signal; 3] = [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP];

/// The first handled signal, as its number; 0 until one arrives.
static RAISED: AtomicI32 = AtomicI32::new(0);

/// Whether the handlers are installed (an error kept so every caller sees it).
static INSTALLED: OnceLock<Result<(), String>> = OnceLock::new();

/// What stops a candidate's work: a kill, an aborted transfer.
type Stop = Box<dyn Fn() + Send + Sync>;

/// What to stop, by registration number.
#[derive(Default)]
struct Targets {
    next: u64,
    live: BTreeMap<u64, Stop>,
}

fn targets() -> MutexGuard<'static, Targets> {
    static TARGETS: OnceLock<Mutex<Targets>> = OnceLock::new();
    // A panic while holding it leaves a consistent map: every change is one insert or remove.
    TARGETS
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

/// A stage stopped by a signal before its result was established.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error, miette::Diagnostic)]
#[error(
    "{} received: the run was stopped before its result was established",
    signal.as_str()
)]
#[diagnostic(
    code(cordon::interrupted),
    help(
        "the candidate was stopped and its lease released with the same absence proof as a normal end; the receipt is a no-decision: run the stage again"
    )
)]
pub struct Interrupted {
    /// The first signal received.
    pub signal: Signal,
}

/// Catch SIGINT, SIGTERM and SIGHUP for this whole process from now on (idempotent). Called
/// by the stage prologue, before the stage makes anything.
///
/// # Errors
/// The handlers or their thread could not be installed.
pub fn install() -> std::io::Result<()> {
    INSTALLED
        .get_or_init(|| {
            let numbers = HANDLED.map(|s| s as i32);
            let mut signals =
                signal_hook::iterator::Signals::new(numbers).map_err(|e| e.to_string())?;
            std::thread::Builder::new()
                .name("cordon-interrupt".into())
                .spawn(move || {
                    for number in signals.forever() {
                        arrived(number);
                    }
                })
                .map(drop)
                .map_err(|e| e.to_string())
        })
        .clone()
        .map_err(std::io::Error::other)
}

/// One signal arrived: record it if it is the first, and stop every registered candidate.
fn arrived(number: i32) {
    let _ = RAISED.compare_exchange(0, number, Ordering::SeqCst, Ordering::SeqCst);
    for stop in targets().live.values() {
        stop();
    }
}

/// The first handled signal this process received, if any.
#[must_use]
pub fn raised() -> Option<Signal> {
    match RAISED.load(Ordering::SeqCst) {
        0 => None,
        n => Signal::try_from(n).ok(),
    }
}

/// Stop here if a handled signal has arrived: the check a stage makes before each step that
/// would make something new.
///
/// # Errors
/// A signal arrived.
pub fn check() -> Result<(), Interrupted> {
    raised().map_or(Ok(()), |signal| Err(Interrupted { signal }))
}

/// A candidate process registered to be stopped by a signal; dropping it deregisters it.
#[derive(Debug)]
pub struct Registered(u64);

impl Drop for Registered {
    fn drop(&mut self) {
        targets().live.remove(&self.0);
    }
}

/// Register `process` to be sent SIGKILL when a handled signal arrives — at once, if one
/// already has.
pub fn stop_on_signal(process: Arc<dyn Supervise>) -> Registered {
    // A kill the kernel refuses leaves the process to the release's absence proof.
    on_signal(move || drop(process.kill()))
}

/// Register `stop` (quick, never blocking: it runs on the signal thread) to run when a handled
/// signal arrives — at once, if one already has: work of a candidate's that is not a process
/// (a transfer whose reader would otherwise wait out its deadline).
pub fn on_signal(stop: impl Fn() + Send + Sync + 'static) -> Registered {
    let mut targets = targets();
    // Under the lock: a signal recorded before this point is seen here, one recorded after it
    // finds `stop` registered.
    if raised().is_some() {
        stop();
    }
    let id = targets.next;
    targets.next += 1;
    targets.live.insert(id, Box::new(stop));
    Registered(id)
}

#[cfg(test)]
mod tests {
    //! Each test runs in a process of its own (nextest), so the process-wide record starts
    //! empty in each.

    use std::time::{Duration, Instant};

    use super::*;
    use crate::host::Host as _;
    use crate::host::fake::{Call, Fake, Script};

    fn hanging(fake: &Fake) -> crate::host::Process {
        fake.process("sleeper", Script::hangs());
        fake.spawn(
            &crate::host::Tool::new("sleeper", &[]),
            crate::host::Stdin::Null,
        )
        .unwrap()
    }

    #[test]
    fn a_signal_is_recorded_once_and_stops_every_registered_process() {
        install().unwrap();
        let fake = Fake::new();
        let mut first = hanging(&fake);
        first.stop_on_interrupt();
        assert_eq!(raised(), None);
        check().unwrap();
        nix::sys::signal::kill(nix::unistd::getpid(), Signal::SIGHUP).unwrap();
        assert!(
            first
                .exited_by(Instant::now() + Duration::from_secs(10))
                .unwrap(),
            "the registered process was killed"
        );
        assert_eq!(raised(), Some(Signal::SIGHUP));
        // A second signal neither replaces the first nor ends this process.
        nix::sys::signal::kill(nix::unistd::getpid(), Signal::SIGINT).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(
            check(),
            Err(Interrupted {
                signal: Signal::SIGHUP
            })
        );
        // A process registered after the signal is killed at once.
        let mut late = hanging(&fake);
        late.stop_on_interrupt();
        assert!(late.exited_by(Instant::now()).unwrap());
        assert_eq!(
            fake.calls()
                .iter()
                .filter(|c| matches!(c, Call::Kill(_)))
                .count(),
            3,
            "the first process once per signal (it is not reaped yet, so its pid is its own), the late one once: {:?}",
            fake.calls()
        );
    }

    #[test]
    fn a_process_that_was_let_go_is_not_signalled() {
        install().unwrap();
        let fake = Fake::new();
        let mut process = hanging(&fake);
        process.stop_on_interrupt();
        process.kill().unwrap();
        let _ = process.wait().unwrap();
        nix::sys::signal::kill(nix::unistd::getpid(), Signal::SIGTERM).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while raised().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(raised(), Some(Signal::SIGTERM));
        assert_eq!(
            fake.calls()
                .iter()
                .filter(|c| matches!(c, Call::Kill(_)))
                .count(),
            1,
            "only the caller's own kill: {:?}",
            fake.calls()
        );
    }
}
