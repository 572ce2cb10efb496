//! SIGINT, SIGTERM and SIGHUP at each point of a real session's life: before the container is
//! created, once it is created, while it runs, after it exited, and during the release (where a
//! second signal follows the first). Each test sends the signal to its own process (nextest runs
//! each test in one of its own) through the real handlers of `cordon::interrupt`, with
//! [`Interposed`] only watching the real calls to pick the moment. After each, the candidate is
//! stopped, the release has run to its end, the executor holds nothing (no container, mount,
//! cgroup, run directory or lease record) and no run account is left; the session's end is a
//! result the receipt path turns into a no-decision naming the signal (its unit test in
//! `receipt_io`), or the session's own `Interrupted` error.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use cordon::container::Input;
use cordon::host::HostRef;
use cordon::host::fake::{Call, Interposed};
use cordon::interrupt;
use cordon_stage::session::SessionError;
use nix::sys::signal::Signal;

/// Where in the session's life the signal arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Point {
    BeforeCreate,
    Created,
    Running,
    AfterExit,
    DuringRelease,
}

/// Send `signal` to this process and wait until its handler recorded it (the first one).
fn send(signal: Signal) {
    nix::sys::signal::kill(nix::unistd::getpid(), signal).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while interrupt::raised().is_none() {
        assert!(Instant::now() < deadline, "{signal} was not recorded");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Another signal than `signal`, for the second one.
fn other(signal: Signal) -> Signal {
    if signal == Signal::SIGINT {
        Signal::SIGTERM
    } else {
        Signal::SIGINT
    }
}

fn interrupted_at(point: Point, signal: Signal) {
    let owner = match signal {
        Signal::SIGINT => "stage-sigint",
        Signal::SIGTERM => "stage-sigterm",
        _ => "stage-sighup",
    };
    let slot = point as u32;
    interrupt::install().unwrap();
    let w = common::world();
    let policy = common::policy(&w, owner, slot);
    let unmounts = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&unmounts);
    let host = Arc::new(Interposed::new().failing(move |call| {
        match (point, call) {
            (Point::BeforeCreate, Call::Mount(_)) if interrupt::raised().is_none() => {
                send(signal);
            }
            (Point::Created, Call::Adopt(_)) => send(signal),
            (Point::DuringRelease, Call::Unmount(_)) => {
                match seen.fetch_add(1, Ordering::SeqCst) {
                    0 => send(signal),
                    // A second signal mid-release: the release goes on.
                    1 => nix::sys::signal::kill(nix::unistd::getpid(), other(signal)).unwrap(),
                    _ => {}
                }
            }
            _ => {}
        }
        false
    }));
    let setup = common::setup(
        &w,
        &policy,
        &format!("{owner}-{slot}"),
        host.clone() as HostRef,
    );
    // A workload that would run for ever unless stopped (the stage deadline is minutes away).
    let script = match point {
        Point::AfterExit | Point::DuringRelease => "true",
        _ => "while :; do :; done",
    };
    let started = Instant::now();
    let result = common::session(&w, &policy, &setup).run(
        &common::job(&w, script, Input::Null, false),
        |_, _, _| {
            if point == Point::Running {
                send(signal);
            }
            Ok::<_, SessionError>(())
        },
        |_, _, finished| {
            if point == Point::AfterExit {
                send(signal);
            }
            Ok::<_, SessionError>(finished.meta.clone())
        },
    );
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "the signal ended the run long before its deadline: {:?}",
        started.elapsed()
    );
    assert_eq!(
        interrupt::raised(),
        Some(signal),
        "the first signal is the one named"
    );
    let calls = host.calls();
    let ran = |needle: &str| {
        calls
            .iter()
            .any(|c| matches!(c, Call::Run(l) | Call::Spawn(l) if l.contains(needle)))
    };
    match point {
        Point::BeforeCreate | Point::Created => {
            let err = result.expect_err("nothing is started after the signal");
            assert!(
                matches!(err, SessionError::Interrupted(i) if i.signal == signal),
                "{err}"
            );
            assert_eq!(ran(" create "), point == Point::Created, "{calls:?}");
            assert!(
                !ran(" start "),
                "a created container is never started: {calls:?}"
            );
        }
        Point::Running => {
            let meta = result
                .expect("the stopped run is still waited for")
                .inspected;
            assert_eq!(meta.signal, Some(9), "the init was killed: {meta:?}");
            assert!(!meta.killed_by_deadline, "{meta:?}");
        }
        Point::AfterExit | Point::DuringRelease => {
            let meta = result.expect("the run had ended").inspected;
            assert_eq!(meta.exit_code, Some(0), "{meta:?}");
        }
    }
    if point == Point::DuringRelease {
        assert!(
            unmounts.load(Ordering::SeqCst) >= 2,
            "the second signal came during the release"
        );
    }
    // The release ran to its end: the executor holds nothing, no account is left.
    let left = common::left(&w, &setup);
    assert!(left.is_empty(), "the release left {left:?} ({calls:?})");
    cordon_testkit::assert_no_accounts(owner, slot);
}

macro_rules! at_each_point {
    ($($name:ident: $point:ident, $signal:ident;)*) => {$(
        #[test]
        fn $name() {
            interrupted_at(Point::$point, Signal::$signal);
        }
    )*};
}

at_each_point! {
    sigint_before_create: BeforeCreate, SIGINT;
    sigint_once_created: Created, SIGINT;
    sigint_while_running: Running, SIGINT;
    sigint_after_exit: AfterExit, SIGINT;
    sigint_and_sigterm_during_release: DuringRelease, SIGINT;
    sigterm_before_create: BeforeCreate, SIGTERM;
    sigterm_once_created: Created, SIGTERM;
    sigterm_while_running: Running, SIGTERM;
    sigterm_after_exit: AfterExit, SIGTERM;
    sigterm_and_sigint_during_release: DuringRelease, SIGTERM;
    sighup_before_create: BeforeCreate, SIGHUP;
    sighup_once_created: Created, SIGHUP;
    sighup_while_running: Running, SIGHUP;
    sighup_after_exit: AfterExit, SIGHUP;
    sighup_and_sigint_during_release: DuringRelease, SIGHUP;
}
