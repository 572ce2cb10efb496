//! `cordon-worker`: cordon's own process inside the lane's container, shipped in the pinned
//! runtime image (so the image digest covers its bytes) and started as the container's first
//! process by the host's exact argv:
//!
//! `/cordon/worker [--gate FIFO] --protocol lane|reference --sealed HEX --max-bytes N
//! --max-frames N [--read-only PATH]… [--cache-root DIR --cache DIR…]
//! [--tree DIR --publication DIR] -- ENGINE ARGV…`
//!
//! `--gate`: under a runtime that installs the seccomp filter only as it execs the worker
//! (crun), the worker first opens the start gate and waits for its line; the host reads its
//! posture from outside meanwhile and writes the line only if it is the planned one. A gate
//! closed without its line ends the worker (exit 70) before it does anything else.
//!
//! The protocol is the one it speaks to the host (the engine always speaks the lane's to it:
//! the worker re-encodes every frame it relays). In the pristine reference session
//! (`reference`, which needs `--tree` and `--publication`) the posture also reports what the
//! worker sees from inside: the tree digest of the tree mount, recomputed file by file, and
//! every name in the publication mount — the host compares them with the policy's pin and the
//! control-only publication, so a candidate's or incumbent's artifact reaching T is seen there.
//!
//! What it owns: establishing the posture from inside, before anything of the candidate runs,
//! and reporting it as one `posture` frame (facts only — the host compares them with what it
//! planned and decides); starting the registered engine command when, and only when, the host
//! answers `start`; relaying frames, decoding the engine's stream as hostile input and refusing
//! any kind the engine may not send; reporting how the engine ended. What it does not own: any
//! clock, deadline or verdict (the host's), and the engine's semantics.
//!
//! Why the engine cannot touch it, although both run as the run account: it makes itself
//! non-dumpable first, so the engine can neither ptrace it nor open its `/proc/1/{mem,fd}`; it
//! blocks every signal in every thread (as the container's init it would ignore only those it
//! has no handler for, and the Rust runtime installs some — a signal that interrupted a read
//! would end the relay); and before the engine exists it installs a seccomp filter, inherited
//! by the engine, that refuses `prlimit64` on any process but the caller (the kernel lets a
//! process lower the limits of another of the same account, which would starve the worker).
//! When it exits the kernel ends every process left in the container.
//!
//! Member coverage: before the engine exists the worker makes a datagram socket pair; every
//! engine process inherits one end (its number in `CORDON_MEMBERS_FD`), and the worker reads
//! the other with `SO_PASSCRED`, so each report (`ROLE RANK`) arrives with the pid the kernel
//! attached — a process can report only itself. The registered harness's scheduler ranks report
//! before they load the engine tree, a process of another role only if something tried to load
//! candidate code in it; the worker passes every report on in `ended`, and the host checks
//! them against the step's ranks.
//!
//! Exit status: 0 after reporting `ended`; 70 after reporting a `fault` (it could not do its
//! job); 64 on a bad argv (the host's bug).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::process::{ChildStdin, ChildStdout, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cordon_frame::message::{self, Ended, Fault, MAX_MEMBERS, Member, PROTOCOL, Posture, Seen};
use cordon_frame::{Decoder, Frame, Kind, LANE, Limits, Protocol, REFERENCE, encode};
use sha2::{Digest as _, Sha256};

/// How long the relay may drain the engine's output after the engine exited.
const DRAIN: Duration = Duration::from_secs(1);

/// The worker's argv.
#[derive(Debug, Default)]
struct Args {
    protocol: Option<Protocol>,
    tree: Option<String>,
    publication: Option<String>,
    sealed: String,
    limits: Option<Limits>,
    read_only: Vec<String>,
    cache_root: Option<String>,
    caches: Vec<String>,
    engine: Vec<String>,
    gate: Option<String>,
}

fn parse(mut argv: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut a = Args::default();
    let (mut max_bytes, mut max_frames) = (None, None);
    while let Some(flag) = argv.next() {
        if flag == "--" {
            a.engine = argv.collect();
            break;
        }
        let value = argv.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--protocol" => {
                a.protocol = Some(match value.as_str() {
                    "lane" => LANE,
                    "reference" => REFERENCE,
                    _ => return Err(format!("unknown protocol {value}")),
                });
            }
            "--tree" => a.tree = Some(value),
            "--publication" => a.publication = Some(value),
            "--sealed" => a.sealed = value,
            "--max-bytes" => max_bytes = Some(value.parse().map_err(|_| "bad --max-bytes")?),
            "--max-frames" => max_frames = Some(value.parse().map_err(|_| "bad --max-frames")?),
            "--read-only" => a.read_only.push(value),
            "--cache-root" => a.cache_root = Some(value),
            "--cache" => a.caches.push(value),
            "--gate" => a.gate = Some(value),
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    if a.caches.is_empty() != a.cache_root.is_none() {
        return Err("--cache needs --cache-root, and --cache-root a --cache".into());
    }
    // The pristine checks belong to the reference session, and it cannot run without them.
    let pristine = a.tree.is_some() && a.publication.is_some();
    match a.protocol {
        None => return Err("--protocol is required".into()),
        Some(p) if (p == REFERENCE) != pristine => {
            return Err("--tree and --publication go with --protocol reference, and only".into());
        }
        Some(_) => {}
    }
    if a.sealed.len() != 64 || a.engine.is_empty() {
        return Err("--sealed HEX and an engine argv after -- are required".into());
    }
    a.limits = Some(Limits {
        max_bytes: max_bytes.ok_or("--max-bytes is required")?,
        max_frames: max_frames.ok_or("--max-frames is required")?,
    });
    Ok(a)
}

/// The frame writer towards the host (the container's stdout).
struct Host {
    out: std::io::Stdout,
    protocol: Protocol,
    limits: Limits,
}

impl Host {
    fn send(&mut self, kind: Kind, payload: &[u8]) -> Result<(), String> {
        let bytes = encode(self.protocol, kind, payload, self.limits).map_err(|e| e.to_string())?;
        let mut out = self.out.lock();
        out.write_all(&bytes)
            .and_then(|()| out.flush())
            .map_err(|e| format!("writing to the host: {e}"))
    }

    fn message<T: serde::Serialize>(&mut self, kind: Kind, m: &T) -> Result<(), String> {
        let payload = message::to_payload(m).map_err(|e| e.to_string())?;
        self.send(kind, &payload)
    }
}

fn status_field(status: &str, name: &str) -> Result<String, String> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map(|v| v.trim().to_owned())
        .ok_or_else(|| format!("/proc/self/status has no {name}"))
}

fn hex_field(status: &str, name: &str) -> Result<u64, String> {
    u64::from_str_radix(&status_field(status, name)?, 16).map_err(|e| format!("{name}: {e}"))
}

fn dec_field(status: &str, name: &str) -> Result<u32, String> {
    status_field(status, name)?
        .parse()
        .map_err(|e| format!("{name}: {e}"))
}

fn read(path: &str) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))
}

/// The exec probe: the smallest static x86-64 ELF program, `exit(0)` — one loadable segment
/// (read and execute) holding the headers and three instructions, 129 bytes, so even a nearly
/// full cache can take it and nothing of the image is needed to run it.
fn exit0_program() -> Vec<u8> {
    const BASE: u64 = 0x40_0000;
    const HEADERS: u64 = 64 + 56;
    // mov eax, 60 (exit); xor edi, edi; syscall
    let code = [0xb8, 0x3c, 0, 0, 0, 0x31, 0xff, 0x0f, 0x05];
    let size = HEADERS + code.len() as u64;
    let mut elf = vec![0x7f, b'E', b'L', b'F', 2, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    elf.extend(2u16.to_le_bytes()); // ET_EXEC
    elf.extend(0x3eu16.to_le_bytes()); // x86-64
    elf.extend(1u32.to_le_bytes()); // version
    elf.extend((BASE + HEADERS).to_le_bytes()); // entry: the code after the headers
    elf.extend(64u64.to_le_bytes()); // program headers right after this header
    elf.extend(0u64.to_le_bytes()); // no section headers
    elf.extend(0u32.to_le_bytes()); // flags
    for v in [64u16, 56, 1, 0, 0, 0] {
        elf.extend(v.to_le_bytes()); // header size, phdr size, one phdr, no sections
    }
    elf.extend(1u32.to_le_bytes()); // PT_LOAD
    elf.extend(5u32.to_le_bytes()); // read + execute
    elf.extend(0u64.to_le_bytes()); // from the file's start
    elf.extend(BASE.to_le_bytes()); // vaddr
    elf.extend(BASE.to_le_bytes()); // paddr
    elf.extend(size.to_le_bytes()); // filesz
    elf.extend(size.to_le_bytes()); // memsz
    elf.extend(0x1000u64.to_le_bytes()); // align
    elf.extend(code);
    elf
}

/// Make cache directory `dir` under the cache mount `root` and prove it is usable as the run
/// account's private, executable cache: `ok`, or what failed.
fn cache_check(root: &str, dir: &str) -> String {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
    let step = |what: &str, r: std::io::Result<()>| r.map_err(|e| format!("{what}: {e}"));
    let check = || -> Result<(), String> {
        if !std::path::Path::new(dir).starts_with(root) {
            return Err(format!("{dir} is not under the cache mount {root}"));
        }
        step(
            "mkdir",
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir),
        )?;
        let m = std::fs::metadata(dir).map_err(|e| format!("stat: {e}"))?;
        let r = std::fs::metadata(root).map_err(|e| format!("stat {root}: {e}"))?;
        if m.uid() != nix::unistd::getuid().as_raw() {
            return Err(format!("owned by {}, not the run account", m.uid()));
        }
        if m.permissions().mode() & 0o7777 != 0o700 {
            return Err(format!(
                "mode {:o}, not 700",
                m.permissions().mode() & 0o7777
            ));
        }
        if m.dev() != r.dev() {
            return Err("not on the cache mount".into());
        }
        let (a, b) = (
            format!("{dir}/.cordon-probe-a"),
            format!("{dir}/.cordon-probe-b"),
        );
        step("write", std::fs::write(&a, b"probe"))?;
        step("rename", std::fs::rename(&a, &b))?;
        step("delete", std::fs::remove_file(&b))?;
        let exe = format!("{dir}/.cordon-probe-exec");
        step(
            "write the exec probe",
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o700)
                .open(&exe)
                .and_then(|mut f| f.write_all(&exit0_program())),
        )?;
        let ran = Command::new(&exe)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        step("delete", std::fs::remove_file(&exe))?;
        match ran {
            Ok(s) if s.success() => Ok(()),
            Ok(s) => Err(format!("exec: the probe ended with {s}")),
            Err(e) => Err(format!("exec: {e}")),
        }
    };
    check().map_or_else(|e| e, |()| "ok".to_owned())
}

/// The tree digest of the tree mounted at `root`, recomputed from inside: every regular file's
/// path, mode, size and sha256, sorted by path. Anything but directories and regular files (a
/// tree has neither links nor devices) or a name that is not UTF-8 is reported as a failure.
fn tree_digest(root: &str) -> Result<String, String> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    fn walk(dir: &std::path::Path, rel: &str, out: &mut Vec<Entry>) -> Result<(), String> {
        let e = |what: &str, err: std::io::Error| format!("{}: {what}: {err}", dir.display());
        for item in std::fs::read_dir(dir).map_err(|x| e("read_dir", x))? {
            let item = item.map_err(|x| e("read_dir", x))?;
            let name = item
                .file_name()
                .into_string()
                .map_err(|n| format!("{}: a name that is not UTF-8: {n:?}", dir.display()))?;
            let path = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            let meta = item.metadata().map_err(|x| e("stat", x))?;
            if meta.is_dir() {
                walk(&item.path(), &path, out)?;
            } else if meta.is_file() {
                let mut f = std::fs::File::open(item.path()).map_err(|x| e("open", x))?;
                let mut h = Sha256::new();
                std::io::copy(&mut f, &mut h).map_err(|x| e("read", x))?;
                out.push(Entry {
                    path,
                    mode: meta.permissions().mode() & 0o7777,
                    size: meta.size(),
                    sha256: cordon_canon::Digest::from_hasher(h),
                });
            } else {
                return Err(format!("{path} is neither a file nor a directory"));
            }
        }
        Ok(())
    }
    use cordon_canon::tree_digest::Entry;
    let mut entries = Vec::new();
    walk(std::path::Path::new(root), "", &mut entries)?;
    entries.sort();
    cordon_canon::tree_digest::digest(&entries)
        .map(|d| d.to_string())
        .map_err(|e| format!("the tree digest: {e}"))
}

/// Every name in directory `dir`, sorted (a control-only publication has none).
fn names_in(dir: &str) -> Result<Vec<String>, String> {
    let mut names = std::fs::read_dir(dir)
        .map_err(|e| format!("{dir}: {e}"))?
        .map(|i| {
            i.map(|i| i.file_name().to_string_lossy().into_owned())
                .map_err(|e| format!("{dir}: {e}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    names.sort();
    Ok(names)
}

/// Everything the posture frame reports, read from inside.
fn posture(args: &Args) -> Result<Posture, String> {
    let exe = std::fs::read("/proc/self/exe").map_err(|e| format!("/proc/self/exe: {e}"))?;
    let worker_sha256 = hex::encode(Sha256::digest(&exe));
    let status = read("/proc/self/status")?;
    let interfaces = read("/proc/net/dev")?
        .lines()
        .skip(2)
        .filter_map(|l| l.split(':').next().map(|n| n.trim().to_owned()))
        .collect();
    let routes = read("/proc/net/route")?.lines().skip(1).count();
    // A documentation address (RFC 5737): with only loopback the kernel has no route to it.
    let target = std::net::SocketAddr::from(([192, 0, 2, 1], 80));
    let connect_errno =
        match std::net::TcpStream::connect_timeout(&target, std::time::Duration::from_secs(2)) {
            Ok(_) => None,
            Err(e) => Some(e.raw_os_error().unwrap_or(-1)),
        };
    let mut read_only = BTreeMap::new();
    for path in &args.read_only {
        if let Ok(v) = nix::sys::statvfs::statvfs(path.as_str()) {
            let ro = v.flags().contains(nix::sys::statvfs::FsFlags::ST_RDONLY);
            read_only.insert(path.clone(), ro);
        }
    }
    Ok(Posture {
        protocol: PROTOCOL,
        sealed_matches: worker_sha256 == args.sealed,
        worker_sha256,
        uid: nix::unistd::getuid().as_raw(),
        gid: nix::unistd::getgid().as_raw(),
        cap_eff: hex_field(&status, "CapEff")?,
        cap_prm: hex_field(&status, "CapPrm")?,
        cap_bnd: hex_field(&status, "CapBnd")?,
        cap_amb: hex_field(&status, "CapAmb")?,
        no_new_privs: dec_field(&status, "NoNewPrivs")? == 1,
        seccomp_mode: dec_field(&status, "Seccomp")?,
        seccomp_filters: dec_field(&status, "Seccomp_filters")?,
        interfaces,
        routes: u32::try_from(routes).unwrap_or(u32::MAX),
        connect_errno,
        read_only,
        seen: match (&args.tree, &args.publication) {
            (Some(tree), Some(publication)) => Some(Seen {
                tree: tree_digest(tree)?,
                publication: names_in(publication)?,
            }),
            _ => None,
        },
        caches: match &args.cache_root {
            Some(root) => args
                .caches
                .iter()
                .map(|d| (d.clone(), cache_check(root, d)))
                .collect(),
            None => BTreeMap::new(),
        },
    })
}

/// Read the host's stream until one frame arrives (`None`: the host closed it first).
fn next_from_host(
    input: &mut impl Read,
    d: &mut Decoder,
    queue: &mut Vec<Frame>,
) -> Result<Option<Frame>, String> {
    let mut buf = [0u8; 64 * 1024];
    loop {
        if !queue.is_empty() {
            return Ok(Some(queue.remove(0)));
        }
        let n = match input.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("reading from the host: {e}")),
        };
        if n == 0 {
            d.finish().map_err(|e| format!("the host's stream: {e}"))?;
            return Ok(None);
        }
        queue.extend(
            d.push(&buf[..n])
                .map_err(|e| format!("the host's stream: {e}"))?,
        );
    }
}

/// Forward the host's requests to the engine until the host closes its stream; then close the
/// engine's stdin, which is how the engine learns the workload is over.
fn forward_requests(
    mut input: std::io::Stdin,
    mut d: Decoder,
    mut queue: Vec<Frame>,
    mut engine: ChildStdin,
    (limits, workload_over): (Limits, &AtomicBool),
) -> Result<(), String> {
    loop {
        let Some(f) = next_from_host(&mut input, &mut d, &mut queue)? else {
            // The host closed its workload; only now may the engine end (its stdin closes when
            // this returns, after the flag is set).
            workload_over.store(true, Ordering::SeqCst);
            return Ok(());
        };
        if f.kind != Kind::Request {
            return Err(format!("the host sent a {:?} frame after start", f.kind));
        }
        let bytes = encode(LANE, Kind::Request, &f.payload, limits).map_err(|e| e.to_string())?;
        // The engine may have stopped reading: that is its own failure, seen on its stream.
        if engine
            .write_all(&bytes)
            .and_then(|()| engine.flush())
            .is_err()
        {
            break;
        }
    }
    Ok(())
}

/// The host's stream, shared by the relay and the main thread; once `closed` (the worker has
/// reported `ended` or a fault) nothing more is relayed.
struct Shared {
    host: Mutex<Host>,
    closed: AtomicBool,
}

impl Shared {
    fn host(&self) -> Result<std::sync::MutexGuard<'_, Host>, String> {
        self.host
            .lock()
            .map_err(|_| "the host stream's lock is poisoned".to_owned())
    }
}

/// Relay the engine's frames to the host until its output ends; the first violation stops the
/// relay (the caller ends the engine).
fn relay_engine(
    mut out: ChildStdout,
    shared: &Shared,
    limits: Limits,
) -> Result<Option<String>, String> {
    let mut d = Decoder::new(LANE, limits);
    let mut buf = [0u8; 64 * 1024];
    loop {
        let n = match out.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("reading the engine: {e}")),
        };
        if n == 0 {
            return Ok(d.finish().err().map(|e| e.to_string()));
        }
        let frames = match d.push(&buf[..n]) {
            Ok(f) => f,
            Err(e) => return Ok(Some(e.to_string())),
        };
        for f in frames {
            if !f.kind.from_engine() {
                return Ok(Some(format!("the engine sent a {:?} frame", f.kind)));
            }
            let mut host = shared.host()?;
            if shared.closed.load(Ordering::SeqCst) {
                return Ok(None);
            }
            host.send(f.kind, &f.payload)?;
        }
    }
}

/// The filter the worker installs on itself before the engine exists (inherited by it, as every
/// seccomp filter is): `prlimit64` on a pid other than 0 (the caller) fails with EPERM, so the
/// engine cannot lower the worker's limits. The container's own profile stays in force; filters
/// stack and the stricter answer wins.
fn no_foreign_limits() -> Result<(), String> {
    use seccompiler::{
        BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
        SeccompRule,
    };
    let e = |e: seccompiler::Error| format!("the worker's seccomp filter: {e}");
    let arch =
        seccompiler::TargetArch::try_from(std::env::consts::ARCH).map_err(|x| e(x.into()))?;
    let foreign = SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, 0)
        .and_then(|c| SeccompRule::new(vec![c]))
        .map_err(|x| e(x.into()))?;
    let program: BpfProgram = SeccompFilter::new(
        [(nix::libc::SYS_prlimit64, vec![foreign])].into(),
        SeccompAction::Allow,
        SeccompAction::Errno(u32::try_from(nix::libc::EPERM).unwrap_or(1)),
        arch,
    )
    .and_then(TryInto::try_into)
    .map_err(|x| e(x.into()))?;
    seccompiler::apply_filter(&program).map_err(e)
}

/// What the member socket brought: the reports, and why reading them stopped early.
type Reports = Arc<Mutex<(Vec<Member>, Option<String>)>>;

/// The name of the variable that gives engine processes the member socket's number.
const MEMBERS_FD: &str = "CORDON_MEMBERS_FD";

/// The member socket pair: the worker's end, reporting each datagram's sender (`SO_PASSCRED`),
/// and the engine's end, inherited across exec (every other descriptor the worker holds is
/// close-on-exec).
fn member_socket() -> Result<(std::os::fd::OwnedFd, std::os::fd::OwnedFd), String> {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, setsockopt, socketpair, sockopt};
    let e = |what: &str, err: nix::Error| format!("the member socket: {what}: {err}");
    let (worker, engine) = socketpair(
        AddressFamily::Unix,
        SockType::Datagram,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(|x| e("socketpair", x))?;
    setsockopt(&worker, sockopt::PassCred, &true).map_err(|x| e("SO_PASSCRED", x))?;
    nix::fcntl::fcntl(
        &engine,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
    )
    .map_err(|x| e("F_SETFD", x))?;
    Ok((worker, engine))
}

/// Read member reports from `socket` into `into` until one is not a report or there are more
/// than [`MAX_MEMBERS`] (then the fault says why and reading stops for good) — or, unless
/// `wait`, until none is queued (the last reports, read when the engine has ended).
fn collect_members(socket: &std::os::fd::OwnedFd, into: &Reports, wait: bool) {
    use nix::sys::socket::{ControlMessageOwned, MsgFlags, UnixCredentials, recvmsg};
    use std::os::fd::AsRawFd;
    let stop = |why: String| {
        if let Ok(mut r) = into.lock() {
            r.1 = Some(why);
        }
    };
    let flags = if wait {
        MsgFlags::empty()
    } else {
        MsgFlags::MSG_DONTWAIT
    };
    loop {
        if into.lock().map_or(true, |r| r.1.is_some()) {
            return;
        }
        let mut buf = [0u8; 64];
        let mut cmsg = nix::cmsg_space!(UnixCredentials);
        let (bytes, truncated, pid) = {
            let mut iov = [std::io::IoSliceMut::new(&mut buf)];
            let msg = match recvmsg::<()>(socket.as_raw_fd(), &mut iov, Some(&mut cmsg), flags) {
                Ok(m) => m,
                Err(nix::Error::EINTR) => continue,
                Err(nix::Error::EAGAIN) if !wait => return,
                Err(err) => return stop(format!("reading the member socket: {err}")),
            };
            let pid = msg.cmsgs().ok().and_then(|mut c| {
                c.find_map(|m| match m {
                    ControlMessageOwned::ScmCredentials(u) => u32::try_from(u.pid()).ok(),
                    _ => None,
                })
            });
            (msg.bytes, msg.flags.contains(MsgFlags::MSG_TRUNC), pid)
        };
        let Some(pid) = pid else {
            return stop("a member report without its sender's credentials".into());
        };
        if truncated {
            return stop(format!(
                "process {pid} sent a member report of over {} bytes",
                buf.len()
            ));
        }
        let (role, rank) = match message::member_report(&buf[..bytes]) {
            Ok(r) => r,
            Err(why) => return stop(format!("process {pid} sent {why}")),
        };
        let Ok(mut r) = into.lock() else { return };
        if r.0.len() == MAX_MEMBERS {
            r.1 = Some(format!("more than {MAX_MEMBERS} member reports"));
            return;
        }
        r.0.push(Member { pid, role, rank });
    }
}

fn run(args: &Args, shared: &Arc<Shared>) -> Result<(), String> {
    let (protocol, limits) = {
        let host = shared.host()?;
        (host.protocol, host.limits)
    };
    let report = posture(args)?;
    shared.host()?.message(Kind::Posture, &report)?;
    // Nothing of the candidate starts until the host has compared the posture and said so.
    let mut input = std::io::stdin();
    let mut d = Decoder::new(protocol, limits);
    let mut queue = Vec::new();
    match next_from_host(&mut input, &mut d, &mut queue)? {
        Some(f) if f.kind == Kind::Start => {}
        Some(f) => return Err(format!("the host sent a {:?} frame before start", f.kind)),
        // The host refused the posture: nothing runs.
        None => return Ok(()),
    }
    no_foreign_limits()?;
    let (members, engine_end) = member_socket()?;
    let reports: Reports = Arc::new(Mutex::new((Vec::new(), None)));
    let (into, socket) = (Arc::clone(&reports), Arc::new(members));
    let reader = Arc::clone(&socket);
    // Detached, so no sender ever waits on a full queue; whatever is still queued when the
    // engine ends is read then, below.
    std::thread::spawn(move || collect_members(&reader, &into, true));
    let mut child = Command::new(&args.engine[0])
        .args(&args.engine[1..])
        .env(
            MEMBERS_FD,
            std::os::fd::AsRawFd::as_raw_fd(&engine_end).to_string(),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("starting the engine {:?}: {e}", args.engine[0]))?;
    // Only the engine's processes hold the engine's end now.
    drop(engine_end);
    let (Some(engine_in), Some(engine_out)) = (child.stdin.take(), child.stdout.take()) else {
        return Err("the engine's stdin and stdout are not pipes".into());
    };
    // Detached: when the engine has ended, the host closes its stream and the worker exits.
    let workload_over = Arc::new(AtomicBool::new(false));
    let over = Arc::clone(&workload_over);
    std::thread::spawn(move || forward_requests(input, d, queue, engine_in, (limits, &over)));
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
    let (done, relayed) = std::sync::mpsc::channel();
    let relay = Arc::clone(shared);
    std::thread::spawn(move || {
        let r = relay_engine(engine_out, &relay, limits);
        if !matches!(r, Ok(None)) {
            // The engine broke the wire: it ends now (whatever it left dies with the
            // container when this worker exits).
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        }
        let _ = done.send(r);
    });
    let status = child
        .wait()
        .map_err(|e| format!("waiting for the engine: {e}"))?;
    // Read at its exit, before anything it left could be drained: a registered process that
    // ends while the workload is open leaves any later answer to a process that is not it.
    let early = !workload_over.load(Ordering::SeqCst);
    // The engine has exited; its output ends with it unless a process it left holds it open,
    // which gets a moment to be drained and is then cut off.
    let violation = match relayed.recv_timeout(DRAIN) {
        Ok(r) => r?,
        // A process the engine left holds its output open: cut off, it dies with the container.
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => None,
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            return Err("the relay ended without a report".into());
        }
    };
    collect_members(&socket, &reports, false);
    let (members, member_fault) = reports
        .lock()
        .map(|r| r.clone())
        .map_err(|_| "the member reports' lock is poisoned".to_owned())?;
    let mut host = shared.host()?;
    shared.closed.store(true, Ordering::SeqCst);
    host.message(
        Kind::Ended,
        &Ended {
            code: status.code(),
            signal: status.signal(),
            violation,
            early,
            members,
            member_fault,
        },
    )
}

/// Open the start gate and read its line: the host writes it only once it has read this
/// process's posture (and closes the gate without it otherwise).
fn wait_at_gate(gate: &str) -> std::io::Result<()> {
    let mut line = [0u8; 1];
    let n = std::fs::File::open(gate)?.read(&mut line)?;
    if n == 1 && line == *b"\n" {
        Ok(())
    } else {
        Err(std::io::Error::other("closed without its line"))
    }
}

fn main() -> ExitCode {
    // First, before reading anything: a non-dumpable process cannot be traced or have its
    // /proc files opened by another process of the same account (the engine).
    if nix::sys::prctl::set_dumpable(false).is_err() {
        return ExitCode::from(70);
    }
    // Every signal blocked before any thread exists, so every thread inherits the mask (the
    // engine does not: a spawned child starts with an empty mask).
    if nix::sys::signal::SigSet::all().thread_block().is_err() {
        return ExitCode::from(70);
    }
    let args = match parse(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("cordon-worker: {e}");
            return ExitCode::from(64);
        }
    };
    let (Some(limits), Some(protocol)) = (args.limits, args.protocol) else {
        return ExitCode::from(64);
    };
    if let Some(gate) = &args.gate
        && let Err(e) = wait_at_gate(gate)
    {
        eprintln!("cordon-worker: the start gate {gate}: {e}");
        return ExitCode::from(70);
    }
    let shared = Arc::new(Shared {
        host: Mutex::new(Host {
            out: std::io::stdout(),
            protocol,
            limits,
        }),
        closed: AtomicBool::new(false),
    });
    match run(&args, &shared) {
        Ok(()) => ExitCode::SUCCESS,
        Err(what) => {
            // If even this cannot be written, the host sees a stream without `ended`: a
            // no-decision either way.
            if let Ok(mut host) = shared.host() {
                shared.closed.store(true, Ordering::SeqCst);
                let _ = host.message(Kind::Fault, &Fault { what });
            }
            ExitCode::from(70)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exec_probe_is_a_program_that_exits_zero() {
        use std::os::unix::fs::OpenOptionsExt;
        let dir = std::env::temp_dir().join(format!("cordon-exit0-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let exe = dir.join("exit0");
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o700)
            .open(&exe)
            .and_then(|mut f| f.write_all(&exit0_program()))
            .unwrap();
        let status = Command::new(&exe).status().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(status.success(), "{status}");
        assert_eq!(exit0_program().len(), 129);
    }

    #[test]
    fn the_argv_needs_a_seal_bounds_an_engine_and_caches_with_their_root() {
        let argv = |s: &str| parse(format!("--protocol lane {s}").split(' ').map(str::to_owned));
        // Each refusal for its own reason.
        let refused = |r: Result<Args, String>, why: &str| match r {
            Err(e) => assert_eq!(e, why),
            Ok(a) => panic!("accepted: {a:?}"),
        };
        let seal = "0".repeat(64);
        argv(&format!(
            "--sealed {seal} --max-bytes 9 --max-frames 9 -- /e"
        ))
        .unwrap();
        refused(
            argv(&format!("--sealed {seal} --max-bytes 9 -- /e")),
            "--max-frames is required",
        );
        let sealed_and_engine = "--sealed HEX and an engine argv after -- are required";
        refused(
            argv(&format!("--sealed {seal} --max-bytes 9 --max-frames 9")),
            sealed_and_engine,
        );
        refused(
            argv("--sealed 00 --max-bytes 9 --max-frames 9 -- /e"),
            sealed_and_engine,
        );
        refused(
            argv(&format!(
                "--sealed {seal} --max-bytes 9 --max-frames 9 --cache /c/x -- /e"
            )),
            "--cache needs --cache-root, and --cache-root a --cache",
        );
        refused(
            argv(&format!("--sealed {seal} --bogus 1 -- /e")),
            "unknown flag --bogus",
        );
        let bare = |s: &str| parse(s.split(' ').map(str::to_owned));
        let rest = format!("--sealed {seal} --max-bytes 9 --max-frames 9");
        refused(bare(&format!("{rest} -- /e")), "--protocol is required");
        refused(
            bare(&format!("--protocol bogus {rest} -- /e")),
            "unknown protocol bogus",
        );
        let t = "--tree /engine --publication /native";
        bare(&format!("--protocol reference {t} {rest} -- /e")).unwrap();
        let pristine = "--tree and --publication go with --protocol reference, and only";
        refused(
            bare(&format!("--protocol reference {rest} -- /e")),
            pristine,
        );
        refused(bare(&format!("--protocol lane {t} {rest} -- /e")), pristine);
    }

    #[test]
    fn the_worker_goes_on_only_after_the_gates_line() {
        let dir = std::env::temp_dir().join(format!("cordon-gate-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let gate = dir.join("gate");
        let path = gate.to_str().unwrap().to_owned();
        let args = parse(
            format!(
                "--gate {path} --protocol lane --sealed {} --max-bytes 9 --max-frames 9 -- /e",
                "0".repeat(64)
            )
            .split(' ')
            .map(str::to_owned),
        )
        .unwrap();
        assert_eq!(args.gate.as_deref(), Some(path.as_str()));
        for (written, passes) in [(&b"\n"[..], true), (&b""[..], false), (&b"x"[..], false)] {
            nix::unistd::mkfifo(&gate, nix::sys::stat::Mode::S_IRWXU).unwrap();
            let waiting = std::thread::spawn({
                let path = path.clone();
                move || wait_at_gate(&path)
            });
            std::fs::OpenOptions::new()
                .write(true)
                .open(&gate)
                .and_then(|mut f| f.write_all(written))
                .unwrap();
            assert_eq!(waiting.join().unwrap().is_ok(), passes, "{written:?}");
            std::fs::remove_file(&gate).unwrap();
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
