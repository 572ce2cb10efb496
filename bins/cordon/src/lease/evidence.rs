//! What the host preserves of a lease's run before its release takes the run apart: the lease
//! record, the runtime's state of its container, its cgroup's event and usage counters, and the
//! container's mount table as launched. Each is read through the host seam and bounded
//! ([`EVIDENCE_MAX`]); one that cannot be read is recorded as the error that stopped it, never
//! left out. It stores nothing: the stage names what it keeps in its receipt.

use std::path::Path;

use super::{Lease, Manager};
use crate::host::Host;

/// The most bytes of one piece of host evidence kept (the rest is cut and the cut said).
pub const EVIDENCE_MAX: usize = 256 * 1024;

/// `bytes` cut to [`EVIDENCE_MAX`], saying so at the end when cut.
#[must_use]
pub fn bounded(mut bytes: Vec<u8>) -> Vec<u8> {
    if bytes.len() > EVIDENCE_MAX {
        let total = bytes.len();
        bytes.truncate(EVIDENCE_MAX);
        bytes.extend_from_slice(format!("\n[cut at {EVIDENCE_MAX} of {total} bytes]\n").as_bytes());
    }
    bytes
}

fn read_or_why(host: &dyn Host, path: &Path) -> Vec<u8> {
    host.read(path)
        .unwrap_or_else(|e| format!("unavailable: {}: {e}\n", path.display()).into_bytes())
}

/// The mount table of the container whose init is `pid` (host pid), bounded: what the runtime
/// set up, as the kernel lists it.
#[must_use]
pub fn mount_table(host: &dyn Host, pid: i32) -> Vec<u8> {
    let path = Path::new("/proc").join(pid.to_string()).join("mountinfo");
    bounded(read_or_why(host, &path))
}

impl Manager {
    /// The host's own evidence of `lease`'s run, by name (`lease-record`, `runtime-state`,
    /// `cgroup-events`), each bounded. Read before release: afterwards none of it exists.
    #[must_use]
    pub fn host_evidence(&self, lease: &Lease) -> Vec<(&'static str, Vec<u8>)> {
        let host = self.setup.host();
        let record = read_or_why(host, &self.record_path(&lease.record.lease));
        let state = self
            .runtime()
            .call(&["state", lease.container()])
            .unwrap_or_else(|e| format!("unavailable: {e}\n").into_bytes());
        [
            ("lease-record", record),
            ("runtime-state", state),
            ("cgroup-events", self.cgroup(lease).events().into_bytes()),
        ]
        .into_iter()
        .map(|(n, b)| (n, bounded(b)))
        .collect()
    }
}
