//! The confined child's own side (REQ-117): [`enter`], which gives up everything before the
//! first byte of input is read (the order is the parent module's documentation), the seccomp
//! filter it installs on itself, [`run_child`], and the child's ends of the wire
//! ([`answer`], [`requested`]). Nothing here runs in the supervisor.

use std::ffi::OsString;
use std::io::{self, Write};

use nix::libc;
use nix::sys::resource::{Resource, setrlimit};
use nix::sys::signal::Signal;
use nix::unistd::{Gid, Uid};

use super::wire::{FrameReader, write_frame};
use super::{CHILD_ARG, CONFINED, Spec, THREADS, UNCONFINED_EXIT};

/// The child's side of [`exchange`]: read the request frame from stdin, write `answer`'s
/// frame to stdout. Returns the exit status.
pub fn answer(respond: impl FnOnce(Vec<u8>) -> Vec<u8>) -> i32 {
    let request = match FrameReader::new(io::stdin().lock(), u32::MAX, u64::MAX).frame() {
        Ok(Some((b'Q', payload))) => payload,
        _ => return 2,
    };
    let reply = respond(request);
    let mut out = io::stdout().lock();
    match write_frame(&mut out, b'A', &reply).and_then(|()| out.flush()) {
        Ok(()) => 0,
        Err(_) => 4,
    }
}

/// Whether this process was started as a confined child: its spec, when the arguments are a
/// child's. Called first thing in a stage binary's `main`.
#[must_use]
pub fn requested() -> Option<(Spec, u32)> {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    if args.first().is_some_and(|a| a == CHILD_ARG) {
        Spec::from_args(&args)
    } else {
        None
    }
}

/// A confinement step that failed, named.
#[derive(Debug, thiserror::Error)]
#[error("cannot confine the parser child: {step}: {why}")]
pub struct ConfineError {
    /// The step.
    pub step: &'static str,
    /// Why.
    pub why: String,
}

fn step<T, E: std::fmt::Display>(
    step: &'static str,
) -> impl FnOnce(Result<T, E>) -> Result<T, ConfineError> {
    move |r| {
        r.map_err(|e| ConfineError {
            step,
            why: e.to_string(),
        })
    }
}

/// Confine this process as `spec` says (see the module docs for the order). Must run before
/// the first byte of input is read; on error the caller exits [`UNCONFINED_EXIT`].
///
/// # Errors
/// The step that failed.
pub fn enter(spec: &Spec, parent: u32) -> Result<(), ConfineError> {
    use nix::sched::{CloneFlags, unshare};
    use nix::sys::prctl;
    // Die with the parent; a parent already gone leaves nobody to read the facts.
    step("PR_SET_PDEATHSIG")(prctl::set_pdeathsig(Signal::SIGKILL))?;
    if nix::unistd::getppid().as_raw() != i32::try_from(parent).unwrap_or(-1) {
        return Err(ConfineError {
            step: "parent",
            why: "the parent is gone".into(),
        });
    }
    if spec.uid == 0 || spec.gid == 0 {
        return Err(ConfineError {
            step: "account",
            why: "the run account may not be root".into(),
        });
    }
    // Only stdin, stdout and stderr: whatever the parent inherited without close-on-exec (a
    // supervisor's socket, an orchestrator's secret) must not reach a parser its input owns.
    close_inherited()?;
    // No network: the child decodes bytes it was handed, it fetches nothing.
    step("unshare")(unshare(CloneFlags::CLONE_NEWNET | CloneFlags::CLONE_NEWIPC))?;
    // An empty root: no store, no host file, nothing to open even if a call got through.
    step("chroot")(nix::unistd::chroot(&spec.jail))?;
    step("chdir")(nix::unistd::chdir("/"))?;
    // Clear the bounding set while still privileged, so nothing can ever regain a capability.
    for cap in caps::all() {
        step("drop bounding capability")(caps::drop(None, caps::CapSet::Bounding, cap))?;
    }
    step("clear ambient capabilities")(caps::clear(None, caps::CapSet::Ambient))?;
    step("setgroups")(nix::unistd::setgroups(&[]))?;
    let (uid, gid) = (Uid::from_raw(spec.uid), Gid::from_raw(spec.gid));
    step("setresgid")(nix::unistd::setresgid(gid, gid, gid))?;
    step("setresuid")(nix::unistd::setresuid(uid, uid, uid))?;
    // The kernel clears the parent-death signal when the credentials change: set it again,
    // and check again that the parent did not die in between.
    step("PR_SET_PDEATHSIG")(prctl::set_pdeathsig(Signal::SIGKILL))?;
    if nix::unistd::getppid().as_raw() != i32::try_from(parent).unwrap_or(-1) {
        return Err(ConfineError {
            step: "parent",
            why: "the parent is gone".into(),
        });
    }
    // Leaving uid 0 for a nonzero uid clears the permitted and effective sets; check it.
    for set in [
        caps::CapSet::Permitted,
        caps::CapSet::Effective,
        caps::CapSet::Inheritable,
    ] {
        let held = step("read capabilities")(caps::read(None, set))?;
        if !held.is_empty() {
            return Err(ConfineError {
                step: "capabilities",
                why: format!("{set:?} still holds {held:?}"),
            });
        }
    }
    step("PR_SET_NO_NEW_PRIVS")(prctl::set_no_new_privs())?;
    step("PR_SET_DUMPABLE")(prctl::set_dumpable(false))?;
    let l = spec.limits;
    for (resource, soft, hard) in [
        (Resource::RLIMIT_AS, l.address_space, l.address_space),
        (Resource::RLIMIT_CPU, l.cpu_seconds, l.cpu_seconds + 1),
        (Resource::RLIMIT_NPROC, THREADS, THREADS),
        // It writes no file: only its pipes.
        (Resource::RLIMIT_FSIZE, 0, 0),
        (Resource::RLIMIT_CORE, 0, 0),
        (Resource::RLIMIT_MEMLOCK, 0, 0),
        // stdin, stdout, stderr, and what the runtime may briefly need.
        (Resource::RLIMIT_NOFILE, 8, 8),
    ] {
        step("setrlimit")(setrlimit(resource, soft, hard))?;
    }
    // A child whose stdin is a connected socket (a transfer child: the parent made the
    // connection) also waits on it with an event loop. It still cannot make a socket, connect
    // one, or reach anything through its own empty network namespace.
    let socket = step("fstat stdin")(nix::sys::stat::fstat(io::stdin()))?;
    let socket = nix::sys::stat::SFlag::from_bits_truncate(socket.st_mode)
        .contains(nix::sys::stat::SFlag::S_IFSOCK);
    install_filter(socket)
}

/// Close every descriptor above 2, as listed in `/proc/self/fd` (read before the `chroot`).
fn close_inherited() -> Result<(), ConfineError> {
    let fds: Vec<i32> = step("list descriptors")(std::fs::read_dir("/proc/self/fd"))?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|fd| *fd > 2)
        .collect();
    for fd in fds {
        match nix::unistd::close(fd) {
            // The listing's own descriptor, closed when the listing ended.
            Ok(()) | Err(nix::errno::Errno::EBADF) => {}
            Err(e) => {
                return Err(ConfineError {
                    step: "close descriptor",
                    why: format!("{fd}: {e}"),
                });
            }
        }
    }
    Ok(())
}

/// The system calls a decoding child makes: I/O on the descriptors it was given, memory,
/// threads (a `clone` must carry `CLONE_THREAD`: no new process), signals for a panic's abort,
/// time, randomness for hash maps, exit.
const ALLOWED: &[i64] = &[
    libc::SYS_read,
    libc::SYS_write,
    libc::SYS_writev,
    libc::SYS_close,
    libc::SYS_mmap,
    libc::SYS_munmap,
    libc::SYS_mremap,
    libc::SYS_mprotect,
    libc::SYS_madvise,
    libc::SYS_brk,
    libc::SYS_futex,
    libc::SYS_sched_yield,
    libc::SYS_sched_getaffinity,
    libc::SYS_set_robust_list,
    libc::SYS_rseq,
    libc::SYS_clone3,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigreturn,
    libc::SYS_sigaltstack,
    libc::SYS_getpid,
    libc::SYS_gettid,
    libc::SYS_clock_gettime,
    libc::SYS_clock_nanosleep,
    libc::SYS_getrandom,
    libc::SYS_exit,
    libc::SYS_exit_group,
];

/// What a child whose stdin is a connected socket adds: I/O on that socket and waiting on it
/// with an event loop (and, below, `fcntl` for duplicating the descriptor alone and `sendto`
/// without an address). Never `socket`, `connect`, `bind`, `accept` or `listen`, and never a
/// send that names its destination: on a connected datagram socket the kernel would send it
/// there, so a resolver child could reach any address the host can.
const SOCKET_IO: &[i64] = &[
    libc::SYS_recvfrom,
    libc::SYS_recvmsg,
    libc::SYS_getsockopt,
    libc::SYS_shutdown,
    libc::SYS_epoll_create1,
    libc::SYS_epoll_ctl,
    libc::SYS_epoll_wait,
    libc::SYS_epoll_pwait,
    libc::SYS_eventfd2,
];

/// The `fcntl` commands a socket child may use: duplicate a descriptor close-on-exec, read
/// flags. Not `F_SETOWN`/`F_SETSIG`/`F_SETFL` (`O_ASYNC`), through which the kernel would send
/// a signal of its choosing to another process of the run account (the archive child beside it).
const FCNTL_COMMANDS: &[i32] = &[libc::F_DUPFD_CLOEXEC, libc::F_GETFD, libc::F_GETFL];

fn install_filter(socket: bool) -> Result<(), ConfineError> {
    use seccompiler::{
        BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
        SeccompRule,
    };
    use std::collections::BTreeMap;
    let arch =
        step("seccomp architecture")(seccompiler::TargetArch::try_from(std::env::consts::ARCH))?;
    let extra: &[i64] = if socket { SOCKET_IO } else { &[] };
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = ALLOWED
        .iter()
        .chain(OPENS)
        .chain(extra)
        .map(|n| (*n, Vec::new()))
        .collect();
    let flag = |arg: u8, mask: u64| {
        step("seccomp rule")(
            SeccompCondition::new(
                arg,
                SeccompCmpArgLen::Qword,
                SeccompCmpOp::MaskedEq(mask),
                mask,
            )
            .and_then(|c| SeccompRule::new(vec![c])),
        )
    };
    if socket {
        let commands = FCNTL_COMMANDS
            .iter()
            .map(|c| {
                step("seccomp rule")(
                    SeccompCondition::new(
                        1,
                        SeccompCmpArgLen::Dword,
                        SeccompCmpOp::Eq,
                        u64::try_from(*c).unwrap_or(u64::MAX),
                    )
                    .and_then(|c| SeccompRule::new(vec![c])),
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        rules.insert(libc::SYS_fcntl, commands);
        // `send` is `sendto` with no address (its fifth argument null): only that.
        rules.insert(
            libc::SYS_sendto,
            vec![step("seccomp rule")(
                SeccompCondition::new(4, SeccompCmpArgLen::Qword, SeccompCmpOp::Eq, 0)
                    .and_then(|c| SeccompRule::new(vec![c])),
            )?],
        );
    }
    // Threads only: a clone without CLONE_THREAD would be a new process.
    let thread = u64::try_from(libc::CLONE_THREAD).unwrap_or(u64::MAX);
    rules.insert(libc::SYS_clone, vec![flag(0, thread)?]);
    // A child may abort itself (a panic), not kill itself: a self-inflicted SIGKILL would read
    // as a kill from outside, a no-decision.
    let abrt = u64::try_from(libc::SIGABRT).unwrap_or(u64::MAX);
    rules.insert(
        libc::SYS_tgkill,
        vec![step("seccomp rule")(
            SeccompCondition::new(2, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, abrt)
                .and_then(|c| SeccompRule::new(vec![c])),
        )?],
    );
    // No handler for SIGXCPU: the CPU limit's signal always ends the child as itself.
    let xcpu = u64::try_from(libc::SIGXCPU).unwrap_or(u64::MAX);
    rules.insert(
        libc::SYS_rt_sigaction,
        vec![step("seccomp rule")(
            SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, xcpu)
                .and_then(|c| SeccompRule::new(vec![c])),
        )?],
    );
    // Naming a thread (PR_SET_NAME) is the one prctl.
    let pr_set_name = u64::try_from(libc::PR_SET_NAME).unwrap_or(u64::MAX);
    rules.insert(
        libc::SYS_prctl,
        vec![step("seccomp rule")(
            SeccompCondition::new(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, pr_set_name)
                .and_then(|c| SeccompRule::new(vec![c])),
        )?],
    );
    let allow: BpfProgram = step("seccomp filter")(
        SeccompFilter::new(
            rules,
            SeccompAction::KillProcess,
            SeccompAction::Allow,
            arch,
        )
        .and_then(TryInto::try_into),
    )?;
    // clone3 passes its flags in memory, where no filter can read them: it answers ENOSYS, so
    // the C library falls back to clone, whose flags the filter above checks. Filters stack
    // and the stricter action wins, so this ERRNO overrides that filter's Allow.
    let no_clone3 = refuse(&[libc::SYS_clone3], libc::ENOSYS, arch)?;
    // Opening a file answers EACCES instead of killing: the C library's own allocator opens
    // `/proc/sys/vm/overcommit_memory` when it first shrinks a thread's heap (and
    // `/sys/devices/system/cpu/online` when it sizes its arenas), and handles a refusal. A kill
    // there would make cordon's own allocation pattern the candidate's rejection. Nothing is
    // gained by the call: the root is an empty directory and the answer comes before the kernel
    // looks at the path.
    let no_open = refuse(OPENS, libc::EACCES, arch)?;
    // This order: installing a filter calls prctl(PR_SET_NO_NEW_PRIVS), which the allow-list
    // filter forbids once it is in place.
    step("seccomp install")(seccompiler::apply_filter(&no_clone3))?;
    step("seccomp install")(seccompiler::apply_filter(&no_open))?;
    step("seccomp install")(seccompiler::apply_filter(&allow))
}

/// The calls that open a file by name. The allow-list admits them only so that the filter of
/// [`refuse`] decides them: stacked filters take the strictest action, and a kill would beat
/// the errno.
const OPENS: &[i64] = &[
    #[cfg(target_arch = "x86_64")]
    libc::SYS_open,
    libc::SYS_openat,
    libc::SYS_openat2,
];

/// A filter that answers `calls` with `errno` and lets everything else through to the next.
fn refuse(
    calls: &[i64],
    errno: i32,
    arch: seccompiler::TargetArch,
) -> Result<seccompiler::BpfProgram, ConfineError> {
    use seccompiler::{SeccompAction, SeccompFilter};
    step("seccomp filter")(
        SeccompFilter::new(
            calls.iter().map(|n| (*n, Vec::new())).collect(),
            SeccompAction::Allow,
            SeccompAction::Errno(u32::try_from(errno).unwrap_or(1)),
            arch,
        )
        .and_then(TryInto::try_into),
    )
}

/// Run this process as the confined child `spec` asks for: confine, then hand stdin and
/// stdout to `parse` (given the spec: its kind, its argument), whose return value is the exit
/// status. Never returns.
pub fn run_child(spec: &Spec, parent: u32, parse: impl FnOnce(&Spec) -> i32) -> ! {
    if let Err(e) = enter(spec, parent) {
        let _ = writeln!(io::stderr(), "{e}");
        std::process::exit(UNCONFINED_EXIT);
    }
    // The marker: from here on, how the child ends is the input's doing.
    let mut out = io::stdout().lock();
    if write_frame(&mut out, CONFINED, b"")
        .and_then(|()| out.flush())
        .is_err()
    {
        std::process::exit(UNCONFINED_EXIT);
    }
    drop(out);
    std::process::exit(parse(spec))
}
