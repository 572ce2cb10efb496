//! What an ablation shows the session's outside posture check (`cordon_stage::posture`): the
//! created container's facts as the session planned them. The check is a second control over
//! the bundle's flags (it refuses a container the runtime made otherwise than planned), so an
//! ablation that removed a flag also blinds the check to it: the attempt from inside then shows
//! what the flag alone did. Used by the stage's and the lane's ablation suites, at the read seam
//! of their interposed host.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

/// A planned tmpfs size (bytes, or `k` KiB) as the kernel shows it: KiB of whole pages.
fn kernel_kib(size: &str) -> u64 {
    let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .unwrap()
        .and_then(|p| u64::try_from(p).ok())
        .unwrap();
    let bytes = match size.strip_suffix('k') {
        Some(k) => k.parse::<u64>().unwrap() * 1024,
        None => size.parse::<u64>().unwrap(),
    };
    bytes.div_ceil(page) * (page / 1024)
}

/// The planned bundle of one created container, and where its init's pid is written.
pub struct Blind {
    /// The runtime's pid file of the created init.
    pid_file: PathBuf,
    /// The bundle as the session wrote it, before the test's rewrite.
    planned: Value,
}

impl Blind {
    /// The plan of a `runc create` about to be spawned with `args` (its `--bundle`'s
    /// `config.json` as it is now, before any rewrite); `None` for any other runtime call.
    #[must_use]
    pub fn at_create(args: &[OsString]) -> Option<Self> {
        let after = |flag: &str| {
            let at = args.iter().position(|a| a == flag)?;
            args.get(at + 1).map(PathBuf::from)
        };
        if !args.iter().any(|a| a == "create") {
            return None;
        }
        let planned = std::fs::read(after("--bundle")?.join("config.json")).unwrap();
        Some(Self {
            pid_file: after("--pid-file")?,
            planned: serde_json::from_slice(&planned).unwrap(),
        })
    }

    /// `bytes` read from `path`, as the posture check would read them of a container made as
    /// planned: the init's status credentials, capabilities and no-new-privileges, the flags
    /// of its root and of every planned mount, the namespaces it planned as its own, no route.
    /// Anything else, as read.
    #[must_use]
    pub fn shown(&self, path: &Path, bytes: Vec<u8>) -> Vec<u8> {
        let pid = std::fs::read_to_string(&self.pid_file).unwrap_or_default();
        if pid.trim().is_empty() {
            return bytes;
        }
        let Ok(rest) = path.strip_prefix(format!("/proc/{}", pid.trim())) else {
            return bytes;
        };
        let text = String::from_utf8_lossy(&bytes).into_owned();
        let out = match rest.to_str() {
            Some("status") => self.status(&text),
            Some("mountinfo") => self.mountinfo(&text),
            Some(ns) if ns.starts_with("ns/") => {
                // A namespace the plan makes its own: shown as another than the supervisor's.
                let kind = match &ns[3..] {
                    "net" => "network",
                    "mnt" => "mount",
                    other => other,
                };
                let own = self.planned["linux"]["namespaces"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|n| n["type"] == kind && n.get("path").is_none());
                if own { "1".to_owned() } else { text }
            }
            Some("net/route") => "Iface\tDestination\n".to_owned(),
            _ => text,
        };
        out.into_bytes()
    }

    fn status(&self, text: &str) -> String {
        let p = &self.planned["process"];
        let (u, g) = (&p["user"]["uid"], &p["user"]["gid"]);
        let mask = |set: &str| {
            p["capabilities"][set]
                .as_array()
                .into_iter()
                .flatten()
                .map(|c| {
                    std::str::FromStr::from_str(c.as_str().unwrap())
                        .map_or(0, |k: caps::Capability| k.bitmask())
                })
                .fold(0u64, |a, b| a | b)
        };
        let nnp = u8::from(p["noNewPrivileges"] == json!(true));
        text.lines()
            .map(|l| match l.split(':').next() {
                Some("Uid") => format!("Uid:\t{u}\t{u}\t{u}\t{u}"),
                Some("Gid") => format!("Gid:\t{g}\t{g}\t{g}\t{g}"),
                Some("Groups") => "Groups:\t".to_owned(),
                Some("CapInh") => format!("CapInh:\t{:016x}", mask("inheritable")),
                Some("CapPrm") => format!("CapPrm:\t{:016x}", mask("permitted")),
                Some("CapEff") => format!("CapEff:\t{:016x}", mask("effective")),
                Some("CapBnd") => format!("CapBnd:\t{:016x}", mask("bounding")),
                Some("CapAmb") => format!("CapAmb:\t{:016x}", mask("ambient")),
                Some("NoNewPrivs") => format!("NoNewPrivs:\t{nnp}"),
                _ => l.to_owned(),
            })
            .map(|l| l + "\n")
            .collect()
    }

    /// Each planned point's line with its per-mount flags as planned (read-only or not, and
    /// `nosuid`, `nodev`, `noexec` where planned) and a planned tmpfs size as the plan writes
    /// it; every other line as read.
    fn mountinfo(&self, text: &str) -> String {
        let p = &self.planned;
        let planned = |point: &str| -> Option<(Vec<String>, Option<String>)> {
            if point == "/" {
                let ro = p["root"]["readonly"] == json!(true);
                return Some((vec![if ro { "ro" } else { "rw" }.to_owned()], None));
            }
            let m = p["mounts"]
                .as_array()
                .unwrap()
                .iter()
                .rfind(|m| m["destination"] == point)?;
            let options: Vec<&str> = m["options"]
                .as_array()
                .unwrap()
                .iter()
                .map(|o| o.as_str().unwrap())
                .collect();
            let ro = if options.contains(&"ro") { "ro" } else { "rw" };
            let flags = std::iter::once(ro)
                .chain(
                    ["nosuid", "nodev", "noexec"]
                        .into_iter()
                        .filter(|f| options.contains(f)),
                )
                .map(str::to_owned)
                .collect();
            let size = options
                .iter()
                .find_map(|o| o.strip_prefix("size="))
                .map(|s| format!("size={}k", kernel_kib(s)));
            Some((flags, size))
        };
        text.lines()
            .map(|l| {
                let mut f: Vec<String> = l.split(' ').map(str::to_owned).collect();
                if let Some((flags, size)) = f.get(4).and_then(|point| planned(point)) {
                    let rest = f[5]
                        .split(',')
                        .filter(|o| !["ro", "rw", "nosuid", "nodev", "noexec"].contains(o))
                        .map(str::to_owned);
                    f[5] = flags.into_iter().chain(rest).collect::<Vec<_>>().join(",");
                    // The super block's options are the last field.
                    if let (Some(size), Some(last)) = (size, f.last_mut()) {
                        let rest = last.split(',').filter(|o| !o.starts_with("size="));
                        *last = std::iter::once(size.as_str())
                            .chain(rest)
                            .collect::<Vec<_>>()
                            .join(",");
                    }
                }
                f.join(" ") + "\n"
            })
            .collect()
    }
}
