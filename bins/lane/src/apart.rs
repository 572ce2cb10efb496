//! The supervisor kept off the lane it times: while a read runs on a physical lane, the
//! supervisor's thread that drives it and the threads it starts for it (the one that stamps
//! the engine's frames and the one that feeds it) run on the CPUs outside the lane (threads
//! and runtime processes started before the read keep their CPUs), so the supervisor neither slows the read it measures nor, under the
//! lane's CPU weight, waits behind it for its stamps.
//!
//! Owns the calling thread's CPU affinity for the span of a read, and nothing else: threads
//! spawned inside the span inherit it; the previous affinity comes back when the guard drops.

use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
use nix::unistd::Pid;
use std::collections::BTreeSet;

/// The calling thread's affinity before the read, restored on drop.
#[derive(Debug)]
pub struct Apart {
    before: CpuSet,
}

impl Apart {
    /// Moves the calling thread off `lane` (a lane's CPUs), onto the CPUs it may use outside
    /// it.
    ///
    /// # Errors
    /// The affinity cannot be read or set, or no CPU the thread may use lies outside the lane:
    /// the host cannot keep its own work off the read (a no-decision for the caller, never a
    /// read timed beside the supervisor).
    pub fn enter(lane: &BTreeSet<u32>) -> Result<Self, String> {
        let me = Pid::from_raw(0);
        let before = sched_getaffinity(me).map_err(|e| format!("the supervisor's CPUs: {e}"))?;
        let mut outside = CpuSet::new();
        let mut any = false;
        for cpu in 0..CpuSet::count() {
            if before.is_set(cpu).unwrap_or(false) && !lane.contains(&(cpu as u32)) {
                outside
                    .set(cpu)
                    .map_err(|e| format!("the supervisor's CPUs: {e}"))?;
                any = true;
            }
        }
        if !any {
            return Err(
                "no CPU outside the physical lane for the supervisor: it would time the read from the lane's own CPUs"
                    .into(),
            );
        }
        sched_setaffinity(me, &outside)
            .map_err(|e| format!("moving the supervisor off the lane: {e}"))?;
        Ok(Self { before })
    }
}

impl Drop for Apart {
    fn drop(&mut self) {
        // Back to where it was: release and receipts run anywhere. A failure leaves the thread
        // on the CPUs outside the lane, which is only narrower.
        let _ = sched_setaffinity(Pid::from_raw(0), &self.before);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mine() -> BTreeSet<u32> {
        let set = sched_getaffinity(Pid::from_raw(0)).unwrap();
        (0..CpuSet::count())
            .filter(|&c| set.is_set(c).unwrap())
            .map(|c| c as u32)
            .collect()
    }

    #[test]
    fn a_read_moves_the_thread_off_the_lane_and_back() {
        // In a thread of its own: the test harness's threads keep their CPUs.
        std::thread::spawn(|| {
            let all = mine();
            let lane: BTreeSet<u32> = all.iter().copied().take(1).collect();
            if all.len() < 2 {
                // One CPU: there is no outside, and the read is refused, never timed beside us.
                assert!(Apart::enter(&lane).unwrap_err().contains("no CPU outside"));
                return;
            }
            {
                let _apart = Apart::enter(&lane).unwrap();
                let now = mine();
                assert!(now.is_disjoint(&lane), "{now:?} and {lane:?}");
                // A thread spawned during the read inherits it.
                let child = std::thread::spawn(mine).join().unwrap();
                assert_eq!(child, now);
            }
            assert_eq!(mine(), all);
            // A lane covering every CPU the thread may use leaves no outside: refused.
            assert!(Apart::enter(&all).unwrap_err().contains("no CPU outside"));
            assert_eq!(mine(), all);
        })
        .join()
        .unwrap();
    }
}
