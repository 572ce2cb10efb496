//! Real qualifications: three real lane sessions per qualification (the pinned runtime image,
//! the real worker, per-run accounts, runc) on the policy's two CPU lanes, with engines whose
//! speed is a fixed sleep per request, so the host's verdict is known in advance. And two
//! qualifications at once, to show the host-global lock never lets two reads overlap.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use cordon::chain;
use cordon::receipt::{LaneOutputs, LockSpan};
use cordon_lane::qualify::{Plan, QualifyOutputs, frozen, primary};
use cordon_lane::speed::Verdict;

mod common;

use common::{World, build, nothing_left, qualified};

fn plan(w: &World, incumbent_ms: u64, candidate_ms: u64) -> Plan {
    Plan {
        incumbent: build(w, incumbent_ms),
        candidate: build(w, candidate_ms),
        // One warmup, four timed (the policy's minimum), four tokens each.
        workload: common::workload(w.dir.path(), 5, 1, 4),
        model: w.model.clone(),
        orientation: primary(&w.policy).unwrap(),
        reproduces: None,
        frozen: frozen(&w.policy, &w.cfg.setup.cdi_dirs).unwrap(),
    }
}

fn spans(w: &World, o: &QualifyOutputs) -> Vec<LockSpan> {
    [o.sessions.b, o.sessions.c, o.sessions.b2]
        .iter()
        .map(|d| {
            chain::load(&w.store, d)
                .unwrap()
                .outputs_as::<LaneOutputs>()
                .unwrap()
                .gpu_lock
        })
        .collect()
}

#[test]
fn a_real_qualification_reads_b_c_b_prime_on_their_lanes_and_passes_a_faster_candidate() {
    let w = common::world("lane-qualify", 0, "qualify-0", &[]);
    let p = plan(&w, 60, 15);
    let o = qualified(&w, &w.cfg, &p);
    nothing_left(&w);
    assert_eq!(o.speed.verdict, Verdict::Pass);
    assert!(o.speed.speedup_bp > 20_000, "{:?}", o.speed);
    // Each read ran on its lane's CPUs, as the kernel allowed its first process.
    let cpus: Vec<Option<&str>> = [&o.devices.b, &o.devices.c, &o.devices.b2]
        .iter()
        .map(|d| d.active.cpuset.as_deref())
        .collect();
    assert_eq!(cpus, [Some("0"), Some("1"), Some("0")]);
    // No GPU, no drain is claimed; the post receipt's quiescence is the release's proof.
    for d in [&o.devices.b, &o.devices.c, &o.devices.b2] {
        assert!(
            [&d.pre, &d.active, &d.post]
                .iter()
                .all(|r| r.gpus.is_empty())
        );
        assert_eq!((d.pre.quiescent, d.post.quiescent), (None, Some(true)));
        assert!(d.pre.at_ns <= d.active.at_ns && d.active.at_ns <= d.post.at_ns);
    }
    // B, C, B′ in that order, one at a time, inside the qualification's one hold of the lock.
    let s = spans(&w, &o);
    assert!(o.gpu_lock.from_unix_ns <= s[0].from_unix_ns);
    assert!(s[2].until_unix_ns <= o.gpu_lock.until_unix_ns);
    for pair in s.windows(2) {
        assert!(pair[0].until_unix_ns <= pair[1].from_unix_ns, "{s:?}");
    }
    assert!(!o.settling);
}

#[test]
fn two_qualifications_at_once_never_overlap_and_never_interleave_their_reads() {
    let w = common::world("lane-qualify", 1, "qualify-1", &[]);
    // The second runs from another run directory: the lock is the host's, not the run
    // directory's.
    let mut other = w.cfg.clone();
    other.setup.run_root = w.dir.path().join("run-2");
    let (p1, p2) = (plan(&w, 30, 10), plan(&w, 31, 11));
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| qualified(&w, &w.cfg, &p1));
        let b = s.spawn(|| qualified(&w, &other, &p2));
        (a.join().unwrap(), b.join().unwrap())
    });
    nothing_left(&w);
    // One hold per qualification, the two disjoint, and each read inside its own's.
    let (first, second) = if a.gpu_lock.from_unix_ns <= b.gpu_lock.from_unix_ns {
        (&a, &b)
    } else {
        (&b, &a)
    };
    assert!(
        first.gpu_lock.until_unix_ns <= second.gpu_lock.from_unix_ns,
        "two qualifications held the host's GPU lock at once: {:?} {:?}",
        first.gpu_lock,
        second.gpu_lock
    );
    for q in [&a, &b] {
        for s in spans(&w, q) {
            assert!(
                q.gpu_lock.from_unix_ns <= s.from_unix_ns
                    && s.until_unix_ns <= q.gpu_lock.until_unix_ns,
                "a read outside its qualification's hold: {s:?} {:?}",
                q.gpu_lock
            );
        }
    }
    // They did run at once: the second waited for the first.
    assert!(
        second.gpu_lock.waited_ns > 100_000_000,
        "no qualification waited for the lock: {:?}",
        second.gpu_lock
    );
}

/// SIGTERM while B reads: B's engine is stopped, and neither C nor B′ makes a lease or a
/// container (each session checks before it begins); the qualification ends without a verdict
/// and the executor holds nothing.
#[test]
fn a_signal_during_b_ends_the_qualification_before_c_and_b_prime() {
    cordon::interrupt::install().unwrap();
    let w = common::world("lane-qualify", 2, "qualify-2", &[]);
    // B's engine sleeps far past anything the test waits for.
    let p = plan(&w, 600_000, 10);
    let (store, state_root) = (
        w.store.root().to_path_buf(),
        w.cfg.setup.runtime.state_root.clone(),
    );
    let signaller = std::thread::spawn(move || {
        let _ = cordon_testkit::wait_running(&store, &state_root);
        nix::sys::signal::kill(nix::unistd::getpid(), nix::sys::signal::Signal::SIGTERM).unwrap();
    });
    let mut ends = Vec::new();
    let mut read = |inputs: &cordon_lane::session::Inputs, lock: &cordon_lane::lock::GpuLock| {
        let r = cordon_lane::session::session_under(&w.policy, &w.cfg, inputs, lock);
        ends.push(match &r {
            Err(e) => e.to_string(),
            Ok(_) => "a result".to_owned(),
        });
        r
    };
    let started = std::time::Instant::now();
    let result = cordon_lane::qualify::qualify(
        &w.policy,
        &w.cfg,
        &p,
        &mut read,
        cordon_stage::args::Diagnostics::Text,
        &mut std::io::sink(),
    );
    signaller.join().unwrap();
    assert!(
        started.elapsed() < std::time::Duration::from_secs(60),
        "{:?}",
        started.elapsed()
    );
    assert!(
        !matches!(result, Ok(cordon::receipt::Decision::Accepted(_))),
        "{result:?}"
    );
    // B ran and was stopped; every later read ended before it began.
    assert!(!ends.is_empty());
    for later in ends.iter().skip(1) {
        assert!(later.contains("SIGTERM received"), "{ends:?}");
    }
    nothing_left(&w);
}
