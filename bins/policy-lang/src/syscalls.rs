//! The x86_64 system call table and the builtin seccomp baselines.
//!
//! The table is the kernel's `arch/x86/entry/syscalls/syscall_64.tbl` (common and 64-bit
//! entries), through Linux 6.15. Policy syscall names are checked against it. The baseline
//! `docker-default` is modelled on Moby's default profile: every syscall in the table except
//! those Moby blocks by default ([`DOCKER_DEFAULT_BLOCKED`]), unconditionally, except two that
//! Moby also treats specially: `clone` is admitted only without namespace flags
//! ([`CLONE_NAMESPACE_FLAGS`] masked to zero) and `clone3`, whose flags live in memory seccomp
//! cannot read, is answered with `ENOSYS` so libc falls back to `clone`. Moby's
//! `personality` value list is not reproduced: it is blocked, and a policy that needs it adds it.

/// Every x86_64 syscall name, in the order of their numbers: `read` (0) to `uretprobe` (335),
/// then, past the table's one gap, `pidfd_send_signal` (424) on ([`number`]).
pub const X86_64: &[&str] = &[
    "read",
    "write",
    "open",
    "close",
    "stat",
    "fstat",
    "lstat",
    "poll",
    "lseek",
    "mmap",
    "mprotect",
    "munmap",
    "brk",
    "rt_sigaction",
    "rt_sigprocmask",
    "rt_sigreturn",
    "ioctl",
    "pread64",
    "pwrite64",
    "readv",
    "writev",
    "access",
    "pipe",
    "select",
    "sched_yield",
    "mremap",
    "msync",
    "mincore",
    "madvise",
    "shmget",
    "shmat",
    "shmctl",
    "dup",
    "dup2",
    "pause",
    "nanosleep",
    "getitimer",
    "alarm",
    "setitimer",
    "getpid",
    "sendfile",
    "socket",
    "connect",
    "accept",
    "sendto",
    "recvfrom",
    "sendmsg",
    "recvmsg",
    "shutdown",
    "bind",
    "listen",
    "getsockname",
    "getpeername",
    "socketpair",
    "setsockopt",
    "getsockopt",
    "clone",
    "fork",
    "vfork",
    "execve",
    "exit",
    "wait4",
    "kill",
    "uname",
    "semget",
    "semop",
    "semctl",
    "shmdt",
    "msgget",
    "msgsnd",
    "msgrcv",
    "msgctl",
    "fcntl",
    "flock",
    "fsync",
    "fdatasync",
    "truncate",
    "ftruncate",
    "getdents",
    "getcwd",
    "chdir",
    "fchdir",
    "rename",
    "mkdir",
    "rmdir",
    "creat",
    "link",
    "unlink",
    "symlink",
    "readlink",
    "chmod",
    "fchmod",
    "chown",
    "fchown",
    "lchown",
    "umask",
    "gettimeofday",
    "getrlimit",
    "getrusage",
    "sysinfo",
    "times",
    "ptrace",
    "getuid",
    "syslog",
    "getgid",
    "setuid",
    "setgid",
    "geteuid",
    "getegid",
    "setpgid",
    "getppid",
    "getpgrp",
    "setsid",
    "setreuid",
    "setregid",
    "getgroups",
    "setgroups",
    "setresuid",
    "getresuid",
    "setresgid",
    "getresgid",
    "getpgid",
    "setfsuid",
    "setfsgid",
    "getsid",
    "capget",
    "capset",
    "rt_sigpending",
    "rt_sigtimedwait",
    "rt_sigqueueinfo",
    "rt_sigsuspend",
    "sigaltstack",
    "utime",
    "mknod",
    "uselib",
    "personality",
    "ustat",
    "statfs",
    "fstatfs",
    "sysfs",
    "getpriority",
    "setpriority",
    "sched_setparam",
    "sched_getparam",
    "sched_setscheduler",
    "sched_getscheduler",
    "sched_get_priority_max",
    "sched_get_priority_min",
    "sched_rr_get_interval",
    "mlock",
    "munlock",
    "mlockall",
    "munlockall",
    "vhangup",
    "modify_ldt",
    "pivot_root",
    "_sysctl",
    "prctl",
    "arch_prctl",
    "adjtimex",
    "setrlimit",
    "chroot",
    "sync",
    "acct",
    "settimeofday",
    "mount",
    "umount2",
    "swapon",
    "swapoff",
    "reboot",
    "sethostname",
    "setdomainname",
    "iopl",
    "ioperm",
    "create_module",
    "init_module",
    "delete_module",
    "get_kernel_syms",
    "query_module",
    "quotactl",
    "nfsservctl",
    "getpmsg",
    "putpmsg",
    "afs_syscall",
    "tuxcall",
    "security",
    "gettid",
    "readahead",
    "setxattr",
    "lsetxattr",
    "fsetxattr",
    "getxattr",
    "lgetxattr",
    "fgetxattr",
    "listxattr",
    "llistxattr",
    "flistxattr",
    "removexattr",
    "lremovexattr",
    "fremovexattr",
    "tkill",
    "time",
    "futex",
    "sched_setaffinity",
    "sched_getaffinity",
    "set_thread_area",
    "io_setup",
    "io_destroy",
    "io_getevents",
    "io_submit",
    "io_cancel",
    "get_thread_area",
    "lookup_dcookie",
    "epoll_create",
    "epoll_ctl_old",
    "epoll_wait_old",
    "remap_file_pages",
    "getdents64",
    "set_tid_address",
    "restart_syscall",
    "semtimedop",
    "fadvise64",
    "timer_create",
    "timer_settime",
    "timer_gettime",
    "timer_getoverrun",
    "timer_delete",
    "clock_settime",
    "clock_gettime",
    "clock_getres",
    "clock_nanosleep",
    "exit_group",
    "epoll_wait",
    "epoll_ctl",
    "tgkill",
    "utimes",
    "vserver",
    "mbind",
    "set_mempolicy",
    "get_mempolicy",
    "mq_open",
    "mq_unlink",
    "mq_timedsend",
    "mq_timedreceive",
    "mq_notify",
    "mq_getsetattr",
    "kexec_load",
    "waitid",
    "add_key",
    "request_key",
    "keyctl",
    "ioprio_set",
    "ioprio_get",
    "inotify_init",
    "inotify_add_watch",
    "inotify_rm_watch",
    "migrate_pages",
    "openat",
    "mkdirat",
    "mknodat",
    "fchownat",
    "futimesat",
    "newfstatat",
    "unlinkat",
    "renameat",
    "linkat",
    "symlinkat",
    "readlinkat",
    "fchmodat",
    "faccessat",
    "pselect6",
    "ppoll",
    "unshare",
    "set_robust_list",
    "get_robust_list",
    "splice",
    "tee",
    "sync_file_range",
    "vmsplice",
    "move_pages",
    "utimensat",
    "epoll_pwait",
    "signalfd",
    "timerfd_create",
    "eventfd",
    "fallocate",
    "timerfd_settime",
    "timerfd_gettime",
    "accept4",
    "signalfd4",
    "eventfd2",
    "epoll_create1",
    "dup3",
    "pipe2",
    "inotify_init1",
    "preadv",
    "pwritev",
    "rt_tgsigqueueinfo",
    "perf_event_open",
    "recvmmsg",
    "fanotify_init",
    "fanotify_mark",
    "prlimit64",
    "name_to_handle_at",
    "open_by_handle_at",
    "clock_adjtime",
    "syncfs",
    "sendmmsg",
    "setns",
    "getcpu",
    "process_vm_readv",
    "process_vm_writev",
    "kcmp",
    "finit_module",
    "sched_setattr",
    "sched_getattr",
    "renameat2",
    "seccomp",
    "getrandom",
    "memfd_create",
    "kexec_file_load",
    "bpf",
    "execveat",
    "userfaultfd",
    "membarrier",
    "mlock2",
    "copy_file_range",
    "preadv2",
    "pwritev2",
    "pkey_mprotect",
    "pkey_alloc",
    "pkey_free",
    "statx",
    "io_pgetevents",
    "rseq",
    "uretprobe",
    "pidfd_send_signal",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "open_tree",
    "move_mount",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "pidfd_open",
    "clone3",
    "close_range",
    "openat2",
    "pidfd_getfd",
    "faccessat2",
    "process_madvise",
    "epoll_pwait2",
    "mount_setattr",
    "quotactl_fd",
    "landlock_create_ruleset",
    "landlock_add_rule",
    "landlock_restrict_self",
    "memfd_secret",
    "process_mrelease",
    "futex_waitv",
    "set_mempolicy_home_node",
    "cachestat",
    "fchmodat2",
    "map_shadow_stack",
    "futex_wake",
    "futex_wait",
    "futex_requeue",
    "statmount",
    "listmount",
    "lsm_get_self_attr",
    "lsm_set_self_attr",
    "lsm_list_modules",
    "mseal",
    "setxattrat",
    "getxattrat",
    "listxattrat",
    "removexattrat",
    "open_tree_attr",
];

/// What `docker-default` leaves out of [`X86_64`]: Moby's default-blocked syscalls, plus those
/// Moby admits only to holders of a capability (cordon stages hold none by default), plus the
/// new mount API and io_uring, which Moby also blocks, and `uretprobe`, which only the kernel's
/// own trampoline calls (and which the kernel lets past every filter anyway).
pub const DOCKER_DEFAULT_BLOCKED: &[&str] = &[
    "_sysctl",
    "acct",
    "add_key",
    "afs_syscall",
    "bpf",
    "chroot",
    "clock_adjtime",
    "clock_settime",
    "create_module",
    "delete_module",
    "epoll_ctl_old",
    "epoll_wait_old",
    "fanotify_init",
    "finit_module",
    "fsconfig",
    "fsmount",
    "fsopen",
    "fspick",
    "get_kernel_syms",
    "get_mempolicy",
    "getpmsg",
    "init_module",
    "io_uring_enter",
    "io_uring_register",
    "io_uring_setup",
    "ioperm",
    "iopl",
    "kcmp",
    "kexec_file_load",
    "kexec_load",
    "keyctl",
    "listmount",
    "lookup_dcookie",
    "lsm_set_self_attr",
    "mbind",
    "memfd_secret",
    "mount",
    "mount_setattr",
    "move_mount",
    "move_pages",
    "name_to_handle_at",
    "nfsservctl",
    "open_by_handle_at",
    "open_tree",
    "open_tree_attr",
    "perf_event_open",
    "personality",
    "pivot_root",
    "process_vm_readv",
    "process_vm_writev",
    "ptrace",
    "putpmsg",
    "query_module",
    "quotactl",
    "quotactl_fd",
    "reboot",
    "request_key",
    "security",
    "set_mempolicy",
    "set_mempolicy_home_node",
    "setdomainname",
    "sethostname",
    "setns",
    "settimeofday",
    "statmount",
    "swapoff",
    "swapon",
    "syslog",
    "sysfs",
    "tuxcall",
    "umount2",
    "unshare",
    "uretprobe",
    "uselib",
    "userfaultfd",
    "ustat",
    "vhangup",
    "vserver",
];

/// `CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID |
/// CLONE_NEWNET`: `clone` with any of these creates a namespace, which no stage may do.
pub const CLONE_NAMESPACE_FLAGS: u64 = 0x7E02_0000;

/// `ENOSYS`, the answer `docker-default` gives `clone3`.
pub const ENOSYS: u32 = 38;

/// The argument widths, in bits, of the syscalls a policy may put argument conditions on: how
/// many bits the x86_64 kernel actually *reads* — the signature's type (`int` and `unsigned int`
/// are 32 bits, `long`, pointers and `size_t` 64), narrowed where the kernel truncates a wider
/// one (`clone` keeps the low 32 bits of its flags, `mmap` reads its fd as an `unsigned int`,
/// `fcntl` its argument as an `int` for the commands that take a number). The kernel reads a
/// 32-bit argument from the low half of its register; seccomp compares all 64 bits. A
/// condition on a syscall not listed here is refused: cordon cannot say what it means.
const ARG_WIDTHS: &[(&str, &[u32])] = &[
    // clone(unsigned long flags, …): kernel_clone_args takes lower_32_bits(flags)
    ("clone", &[32, 64, 64, 64, 64]),
    // fcntl(unsigned int fd, unsigned int cmd, unsigned long arg): numeric args read as int
    ("fcntl", &[32, 32, 32]),
    // flock(unsigned int fd, unsigned int cmd)
    ("flock", &[32, 32]),
    // ioctl(unsigned int fd, unsigned int cmd, unsigned long arg)
    ("ioctl", &[32, 32, 64]),
    // mmap(unsigned long addr, len, prot, flags, fd, off): the fd is fget(unsigned int)
    ("mmap", &[64, 64, 64, 64, 32, 64]),
    // mprotect(unsigned long start, size_t len, unsigned long prot)
    ("mprotect", &[64, 64, 64]),
    // personality(unsigned int personality)
    ("personality", &[32]),
    // prctl(int option, unsigned long arg2, arg3, arg4, arg5)
    ("prctl", &[32, 64, 64, 64, 64]),
    // setns(int fd, int nstype)
    ("setns", &[32, 32]),
    // setsockopt(int fd, int level, int optname, char *optval, int optlen)
    ("setsockopt", &[32, 32, 32, 64, 32]),
    // socket(int family, int type, int protocol)
    ("socket", &[32, 32, 32]),
    // socketpair(int family, int type, int protocol, int *usockvec)
    ("socketpair", &[32, 32, 32, 64]),
    // unshare(unsigned long unshare_flags)
    ("unshare", &[64]),
];

/// The argument widths of `name` (one entry per argument), or `None` when cordon does not
/// model its arguments and so refuses conditions on them.
#[must_use]
pub fn arg_widths(name: &str) -> Option<&'static [u32]> {
    ARG_WIDTHS.iter().find(|(n, _)| *n == name).map(|(_, w)| *w)
}

/// The syscalls [`arg_widths`] knows, for diagnostics.
pub fn modelled_arguments() -> impl Iterator<Item = &'static str> {
    ARG_WIDTHS.iter().map(|(n, _)| *n)
}

/// The builtin baselines a seccomp profile may start from.
pub const BASELINES: &[&str] = &["docker-default"];

/// Where [`X86_64`]'s one gap falls: the entry at this index is number [`AFTER_GAP`], and
/// x86_64 assigns nothing between `uretprobe` (335) and it.
const GAP_AT: usize = 336;
/// The number of the first syscall after the gap (`pidfd_send_signal`, the first number every
/// architecture shares).
const AFTER_GAP: usize = 424;

/// The x86_64 number of syscall `name`: what a filter compares (the runtime resolves names
/// itself through libseccomp; a test's own compiler needs the number).
#[must_use]
pub fn number(name: &str) -> Option<u32> {
    let i = X86_64.iter().position(|n| *n == name)?;
    let nr = if i < GAP_AT {
        i
    } else {
        i - GAP_AT + AFTER_GAP
    };
    u32::try_from(nr).ok()
}

/// Whether `name` is an x86_64 syscall.
#[must_use]
pub fn is_syscall(name: &str) -> bool {
    X86_64.contains(&name)
}

/// How a builtin baseline treats one syscall.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BaselineEntry {
    /// Allowed unconditionally.
    Allow,
    /// Allowed only when argument `index` masked with `mask` is zero.
    AllowIfMaskedZero {
        /// Zero-based argument index.
        index: u32,
        /// The argument's width, from [`arg_widths`].
        bits: u32,
        /// The bits that must be clear.
        mask: u64,
    },
    /// Answered with this errno.
    Errno(u32),
}

/// The entries of a builtin baseline, or `None` for an unknown baseline.
#[must_use]
pub fn baseline(name: &str) -> Option<Vec<(&'static str, BaselineEntry)>> {
    match name {
        "docker-default" => Some(
            X86_64
                .iter()
                .copied()
                .filter(|s| !DOCKER_DEFAULT_BLOCKED.contains(s))
                .map(|s| {
                    let entry = match s {
                        "clone" => BaselineEntry::AllowIfMaskedZero {
                            index: 0,
                            bits: 32,
                            mask: CLONE_NAMESPACE_FLAGS,
                        },
                        "clone3" => BaselineEntry::Errno(ENOSYS),
                        _ => BaselineEntry::Allow,
                    };
                    (s, entry)
                })
                .collect(),
        ),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_has_no_duplicates_and_knows_recent_calls() {
        let mut names = X86_64.to_vec();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), X86_64.len());
        for name in [
            "read",
            "clone3",
            "io_uring_setup",
            "mseal",
            "open_tree_attr",
        ] {
            assert!(is_syscall(name), "{name}");
        }
    }

    #[test]
    fn numbers_are_the_kernels_on_both_sides_of_the_gap() {
        // arch/x86/entry/syscalls/syscall_64.tbl
        for (name, nr) in [
            ("read", 0),
            ("clone", 56),
            ("socket", 41),
            ("seccomp", 317),
            ("rseq", 334),
            ("uretprobe", 335),
            ("pidfd_send_signal", 424),
            ("clone3", 435),
            ("futex_waitv", 449),
            ("mseal", 462),
            ("open_tree_attr", 467),
        ] {
            assert_eq!(number(name), Some(nr), "{name}");
        }
        assert_eq!(X86_64[GAP_AT - 1], "uretprobe");
        assert_eq!(number("nope"), None);
    }

    #[test]
    fn modelled_arguments_are_real_syscalls_with_at_most_six_arguments() {
        for (name, widths) in ARG_WIDTHS {
            assert!(is_syscall(name), "{name}");
            assert!(!widths.is_empty() && widths.len() <= 6, "{name}");
            assert!(widths.iter().all(|w| *w == 32 || *w == 64), "{name}");
        }
        assert_eq!(arg_widths("socket"), Some(&[32, 32, 32][..]));
        assert_eq!(arg_widths("read"), None);
    }

    #[test]
    fn baseline_conditions_carry_the_modelled_width() {
        for (name, entry) in baseline("docker-default").unwrap() {
            if let BaselineEntry::AllowIfMaskedZero { index, bits, mask } = entry {
                let widths = arg_widths(name).expect("a baseline condition is on a modelled call");
                assert_eq!(widths[index as usize], bits, "{name}");
                assert!(bits == 64 || mask <= u64::from(u32::MAX), "{name}");
            }
        }
    }

    #[test]
    fn every_blocked_name_is_a_real_syscall() {
        for name in DOCKER_DEFAULT_BLOCKED {
            assert!(is_syscall(name), "{name} is not in the table");
        }
    }

    #[test]
    fn docker_default_allows_ordinary_calls_and_blocks_escapes() {
        let entries = baseline("docker-default").unwrap();
        let get = |n: &str| entries.iter().find(|(s, _)| *s == n).map(|(_, e)| *e);
        for name in ["read", "write", "openat", "execve", "exit_group", "futex"] {
            assert_eq!(get(name), Some(BaselineEntry::Allow), "{name}");
        }
        for name in [
            "ptrace",
            "mount",
            "unshare",
            "keyctl",
            "bpf",
            "io_uring_setup",
            "perf_event_open",
        ] {
            assert_eq!(get(name), None, "{name}");
        }
        assert_eq!(
            get("clone"),
            Some(BaselineEntry::AllowIfMaskedZero {
                index: 0,
                bits: 32,
                mask: CLONE_NAMESPACE_FLAGS
            })
        );
        assert_eq!(get("clone3"), Some(BaselineEntry::Errno(ENOSYS)));
        assert!(baseline("nope").is_none());
    }
}
