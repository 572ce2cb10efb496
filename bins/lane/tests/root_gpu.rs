//! GPU lanes with real containers and scripted GPUs: the policy's lanes each name a GPU, the
//! host's CDI spec (a test's own directory) gives each GPU's nodes as character devices with
//! the driver's numbers (made by the test; no driver answers them) and a library bind, and the GPUs themselves are `cordon-device`'s fake
//! behind the GPU lock. A read gets exactly its lane's devices, the guard checks its GPUs
//! before, during and after it, a GPU left busy is marked not reusable until a later drain
//! holds, and a qualification whose reads were all guarded settles.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use cordon::lease::quarantine::{self, Cause, Scope};
use cordon::receipt::{Decision, DeviceReceipts, LaneAssignment, Role};
use cordon_device::fake::{Fake, FakeClock, Step, pinned_config};
use cordon_lane::guard::Devices;
use cordon_lane::lock::GpuLock;
use cordon_lane::qualify::{Build, Plan, frozen, primary, qualify_with};
use cordon_lane::session::{Inputs, LaneError, session_under};
use cordon_stage::args::Diagnostics;
use cordon_testkit::LANE_GPUS;

mod common;

use common::{World, build, build_probing, nothing_left};

const A: &str = LANE_GPUS[0];
const B: &str = LANE_GPUS[1];

/// The world of slot `slot` under the GPU-lane policy, its CDI spec in the world's directory.
fn gpu_world(slot: u32, executor: &str) -> World {
    let mut w = common::world_of("lane-gpu", slot, executor, &|t| {
        cordon_testkit::with_gpu_lanes(&t)
    });
    let lib = w.dir.path().join("driver/libcuda.so.1");
    std::fs::create_dir_all(lib.parent().unwrap()).unwrap();
    std::fs::write(&lib, "not a driver\n").unwrap();
    // The GPUs' nodes as the driver numbers them (major 195; lane a's GPU minor 0, lane b's 1,
    // the control node 255), made here: no driver answers them, and only their numbers count.
    let nodes = w.dir.path().join("nodes");
    std::fs::create_dir(&nodes).unwrap();
    for (name, minor) in [("nvidia0", 0), ("nvidia1", 1), ("nvidiactl", 255)] {
        nix::sys::stat::mknod(
            &nodes.join(name),
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::from_bits_truncate(0o600),
            nix::sys::stat::makedev(195, minor),
        )
        .unwrap();
    }
    let node = |name: &str| nodes.join(name).display().to_string();
    let cdi = w.dir.path().join("cdi");
    std::fs::create_dir(&cdi).unwrap();
    let spec = format!(
        r#"{{"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu",
  "devices": [
    {{"name": "{A}", "containerEdits": {{"deviceNodes": [{{"path": "/dev/nvidia0", "hostPath": "{}"}}]}}}},
    {{"name": "{B}", "containerEdits": {{"deviceNodes": [{{"path": "/dev/nvidia1", "hostPath": "{}"}}]}}}}
  ],
  "containerEdits": {{
    "env": ["NVIDIA_VISIBLE_DEVICES=void"],
    "deviceNodes": [{{"path": "/dev/nvidiactl", "hostPath": "{}", "permissions": "rw"}}],
    "mounts": [{{"hostPath": "{}", "containerPath": "/usr/lib/libcuda.so.1", "options": ["ro", "nosuid", "nodev", "bind"]}}]
  }}}}"#,
        node("nvidia0"),
        node("nvidia1"),
        node("nvidiactl"),
        lib.display()
    );
    std::fs::write(cdi.join("nvidia.json"), spec).unwrap();
    w.cfg.setup.cdi_dirs = vec![cdi];
    w
}

/// Both lane GPUs, pinned as the policy pins them and idle, on a fake clock.
fn gpus() -> (Arc<Fake>, Arc<FakeClock>) {
    let clock = Arc::new(FakeClock::default());
    let fake = Arc::new(Fake::new(clock.clone()));
    fake.config_of(A, Some(pinned_config()))
        .config_of(B, Some(pinned_config()))
        .minor_of(A, Some(0))
        .minor_of(B, Some(1));
    (fake, clock)
}

fn lock(w: &World, fake: &Arc<Fake>, clock: &Arc<FakeClock>) -> Result<GpuLock, String> {
    Ok(cordon_lane::lock::acquire(&w.cfg.setup.lock_dir)
        .map_err(|e| e.to_string())?
        .with_devices(Devices {
            gpus: fake.clone(),
            clock: clock.clone(),
        }))
}

/// What a lane a read's engine checks from inside before it answers: its GPU's node (195:0),
/// the common node, the library bind read-only, the spec's variable, and no node
/// of lane b's GPU. Any miss raises, and the read is rejected.
const PROBE: &str = "    import os\n    st = os.stat('/dev/nvidia0').st_rdev\n    assert (os.major(st), os.minor(st)) == (195, 0)\n    assert os.path.exists('/dev/nvidiactl')\n    assert not os.path.exists('/dev/nvidia1')\n    assert open('/usr/lib/libcuda.so.1').read() == 'not a driver\\n'\n    assert not os.access('/usr/lib/libcuda.so.1', os.W_OK)\n    assert os.environ.get('NVIDIA_VISIBLE_DEVICES') == 'void'\n";

fn lane_a(w: &World) -> LaneAssignment {
    primary(&w.policy).unwrap().baseline
}

fn read(w: &World, b: &Build, lock: &GpuLock) -> Result<cordon_lane::session::Outcome, LaneError> {
    let inputs = Inputs {
        role: Role::B,
        tree: b.tree,
        publication: b.publication,
        workload: common::workload(w.dir.path(), 3, 1, 2),
        model: w.model.clone(),
        lane: Some(lane_a(w)),
    };
    session_under(&w.policy, &w.cfg, &inputs, lock)
}

fn guarded(w: &World, d: &DeviceReceipts) -> Vec<String> {
    let guard = w.policy.device_guard().unwrap();
    cordon_evidence::device::unguarded(
        &w.policy.physical_lanes()["a"].gpus,
        &guard.drain,
        &guard.envelope,
        d,
    )
}

#[test]
fn a_gpu_lanes_read_is_guarded_before_during_and_after() {
    let w = gpu_world(0, "gpu-0");
    let (fake, clock) = gpus();
    let b = build_probing(&w, 5, PROBE);
    let held = lock(&w, &fake, &clock).unwrap();
    let o = match read(&w, &b, &held) {
        Ok(Decision::Accepted(o)) => o,
        other => panic!("{other:?}"),
    };
    drop(held);
    nothing_left(&w);
    let d = &o.devices;
    for r in [&d.pre, &d.active, &d.post] {
        assert_eq!(r.gpus, [A]);
    }
    assert_eq!(d.pre.config, [pinned_config()]);
    assert_eq!(d.pre.samples[0].len(), 3);
    assert_eq!(d.active.samples[0].len(), 1);
    assert_eq!(d.post.samples[0].len(), 3);
    assert!(guarded(&w, d).is_empty(), "{:?}", guarded(&w, d));
    // Lane b's GPU was never read: the read's devices are its lane's alone.
    assert_eq!(fake.sampled(B), 0);
    // A spec that gives lane a's UUID lane b's node (the driver says A is minor 1 now): the
    // container would open another GPU than the guard measures, and the engine never starts.
    fake.minor_of(A, Some(1));
    let held = lock(&w, &fake, &clock).unwrap();
    let e = read(&w, &b, &held).unwrap_err();
    assert!(
        e.to_string()
            .contains("GPU device nodes are 195:[0], and the lane's GPUs are 195:[1]"),
        "{e}"
    );
    drop(held);
    nothing_left(&w);
}

#[test]
fn a_gpu_left_busy_voids_the_read_and_stays_marked_until_a_drain_holds() {
    let w = gpu_world(1, "gpu-1");
    let (fake, clock) = gpus();
    let b = build(&w, 5);
    // Idle before, busy from the active sample on, for good.
    fake.script(
        A,
        [
            Step::idle(),
            Step::idle(),
            Step::idle(),
            Step::with(|s| s.processes = vec![4242]),
        ],
    );
    let held = lock(&w, &fake, &clock).unwrap();
    let e = read(&w, &b, &held).unwrap_err();
    let text = e.to_string();
    assert!(text.contains("after the read: GPU"), "{text}");
    assert!(text.contains("did not drain"), "{text}");
    assert!(text.contains("quarantined (drain"), "{text}");
    assert_eq!(
        cordon::exit::ExitClass::exit_class(&e),
        cordon::ExitCode::NoDecision
    );
    let marks: Vec<_> = quarantine::in_force(&w.store)
        .unwrap()
        .into_values()
        .map(|q| (q.scope, q.cause))
        .collect();
    assert_eq!(marks, [(Scope::Device(A.into()), Cause::Drain)]);
    // Still busy: the next read does not start, and the mark stands.
    let e = read(&w, &b, &held).unwrap_err();
    assert!(e.to_string().contains("before the read"), "{e}");
    // Idle again: the next read's drain lifts the mark, and says so in its pre receipt.
    fake.script(A, [Step::idle()]);
    let o = match read(&w, &b, &held) {
        Ok(Decision::Accepted(o)) => o,
        other => panic!("{other:?}"),
    };
    assert!(
        o.devices.pre.note.contains("not-reusable mark"),
        "{}",
        o.devices.pre.note
    );
    assert!(quarantine::in_force(&w.store).unwrap().is_empty());
    drop(held);
    nothing_left(&w);
}

#[test]
fn a_qualification_whose_reads_were_all_guarded_settles() {
    let w = gpu_world(2, "gpu-2");
    let (fake, clock) = gpus();
    let p = Plan {
        incumbent: build(&w, 60),
        candidate: build(&w, 15),
        workload: common::workload(w.dir.path(), 5, 1, 4),
        model: w.model.clone(),
        orientation: primary(&w.policy).unwrap(),
        reproduces: None,
        frozen: frozen(&w.policy, &w.cfg.setup.cdi_dirs).unwrap(),
    };
    assert_eq!(p.frozen.gpu_driver.as_deref(), Some("550.54.15"));
    assert!(p.frozen.cdi_spec.is_some());
    let mut read = |inputs: &Inputs, lock: &GpuLock| session_under(&w.policy, &w.cfg, inputs, lock);
    let o = match qualify_with(
        &w.policy,
        &w.cfg,
        &p,
        &mut read,
        Diagnostics::Text,
        &mut std::io::sink(),
        &|| lock(&w, &fake, &clock),
    ) {
        Ok(Decision::Accepted(o)) => o,
        other => panic!("expected a PASS, got {other:?}"),
    };
    nothing_left(&w);
    assert!(o.settling, "{:?}", o.non_settling);
    assert_eq!(o.devices.c.pre.gpus, [B]);
    assert_eq!(o.devices.b2.pre.gpus, [A]);
}

/// After the qualification, under GPU lanes, the audit reads on C's lane and T on B's
/// (`cordon_reference::referee::gpu_lane`): each guarded on its lane's GPUs like any read.
#[test]
fn the_audit_and_the_reference_session_read_guarded_on_gpu_lanes() {
    let w = gpu_world(3, "gpu-3");
    let (fake, clock) = gpus();
    let b = build(&w, 5);
    let orientation = primary(&w.policy).unwrap();
    let held = lock(&w, &fake, &clock).unwrap();
    for (role, publication, lane, gpu) in [
        (Role::A, b.publication, orientation.candidate.clone(), B),
        (
            Role::T,
            common::control_only(&w.store),
            orientation.baseline.clone(),
            A,
        ),
    ] {
        let inputs = Inputs {
            role,
            tree: b.tree,
            publication,
            workload: common::workload(w.dir.path(), 3, 1, 2),
            model: w.model.clone(),
            lane: Some(lane),
        };
        let o = match session_under(&w.policy, &w.cfg, &inputs, &held) {
            Ok(Decision::Accepted(o)) => o,
            other => panic!("{role:?}: {other:?}"),
        };
        for r in [&o.devices.pre, &o.devices.active, &o.devices.post] {
            assert_eq!(r.gpus, [gpu], "{role:?}");
        }
        assert_eq!(o.devices.active.samples.len(), 1, "{role:?}");
    }
    // Off its lanes, under a GPU-lane policy, no GPU-capable read runs at all.
    let inputs = Inputs {
        role: Role::A,
        tree: b.tree,
        publication: b.publication,
        workload: common::workload(w.dir.path(), 3, 1, 2),
        model: w.model.clone(),
        lane: None,
    };
    let e = session_under(&w.policy, &w.cfg, &inputs, &held).unwrap_err();
    assert!(e.to_string().contains("a read without a GPU lane"), "{e}");
    drop(held);
    nothing_left(&w);
}
