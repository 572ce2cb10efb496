use std::sync::Arc;

use cordon::host::fake::Fake;
use cordon_policy_lang::StageKind;

use super::*;
use crate::bundle::{example_inputs, plan};

fn planned(kind: StageKind) -> Spec {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../policy/evaluator.kdl");
    let p = cordon_policy_lang::parse("evaluator.kdl", &std::fs::read_to_string(path).unwrap())
        .unwrap();
    plan(&p, kind, &example_inputs(&p, kind)).unwrap().spec
}

/// The container's mount table as the kernel would show it for `spec`, every flag, type and
/// size as planned, but with the read-only flag of `flip` flipped.
fn table(spec: &Spec, flip: Option<&str>) -> String {
    let root_ro = spec
        .root()
        .as_ref()
        .and_then(|r| r.readonly())
        .unwrap_or(false);
    let flag = |point: &str, ro: bool| {
        let ro = if flip == Some(point) { !ro } else { ro };
        if ro { "ro" } else { "rw" }
    };
    let mut t = format!(
        "1 0 0:1 / / {},relatime - overlay overlay rw,lowerdir=/x\n",
        flag("/", root_ro)
    );
    for (i, m) in spec.mounts().iter().flatten().enumerate() {
        let point = m.destination().to_string_lossy().replace(' ', "\\040");
        let options: Vec<&str> = m.options().iter().flatten().map(String::as_str).collect();
        let flags: String = ["nosuid", "nodev", "noexec"]
            .iter()
            .filter(|f| options.contains(f))
            .map(|f| format!(",{f}"))
            .collect();
        let typ = match m.typ().as_deref() {
            Some("bind") | None => "ext4",
            Some(t) => t,
        };
        let size = options
            .iter()
            .find_map(|o| o.strip_prefix("size="))
            .map(|s| format!(",size={}k", size_kib(s, 4096).unwrap()))
            .unwrap_or_default();
        t += &format!(
            "{} 1 0:{i} / {point} {}{flags},relatime shared:{i} - {typ} x rw{size},mode=755\n",
            i + 2,
            flag(&point, options.contains(&"ro")),
        );
    }
    t
}

/// The init's `/proc/<pid>/limits` as the kernel shows it for `spec`: every planned limit as
/// planned, the rest as a supervisor's.
fn limits(spec: &Spec) -> String {
    let planned = planned_limits(spec);
    let mut t = "Limit                     Soft Limit           Hard Limit           Units     \n"
        .to_owned();
    for (row, unit) in [
        ("Max cpu time", "seconds"),
        ("Max file size", "bytes"),
        ("Max stack size", "bytes"),
        ("Max core file size", "bytes"),
        ("Max processes", "processes"),
        ("Max open files", "files"),
        ("Max locked memory", "bytes"),
        ("Max nice priority", ""),
        ("Max realtime priority", ""),
        ("Max realtime timeout", "us"),
    ] {
        let (soft, hard) = planned
            .iter()
            .find(|l| limit_row(l.typ()) == row)
            .map_or(("unlimited".to_owned(), "unlimited".to_owned()), |l| {
                (l.soft().to_string(), l.hard().to_string())
            });
        t += &format!("{row:<26}{soft:<21}{hard:<21}{unit:<10}\n");
    }
    t
}

/// A host whose created init `pid` has the posture `spec` plans, its mount table `table`.
fn host(spec: &Spec, pid: u32, table: &str) -> Arc<Fake> {
    let user = spec.process().as_ref().unwrap().user().clone();
    let (u, g) = (user.uid(), user.gid());
    let fake = Arc::new(Fake::new());
    fake.file(
        format!("/proc/{pid}/status"),
        &format!(
            "Name:\trunc:[2:INIT]\nUid:\t{u}\t{u}\t{u}\t{u}\nGid:\t{g}\t{g}\t{g}\t{g}\nGroups:\t\n\
             CapInh:\t0000000000000000\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\n\
             CapBnd:\t0000000000000000\nCapAmb:\t0000000000000000\nNoNewPrivs:\t1\nSeccomp:\t2\n\
             Seccomp_filters:\t2\n"
        ),
    )
    .file(
        // The supervisor itself runs under one filter (systemd's, say): the init inherits it.
        "/proc/self/status",
        "Name:\tsupervisor\nSeccomp:\t2\nSeccomp_filters:\t1\n",
    )
    .file(format!("/proc/{pid}/net/route"), "Iface\tDestination\n")
    .file(format!("/proc/{pid}/limits"), &limits(spec))
    .file(format!("/proc/{pid}/mountinfo"), table);
    // Every namespace the plan makes is another than the supervisor's; the rest are shared.
    for (i, (kind, typ)) in NAMESPACES.iter().enumerate() {
        let own = spec
            .linux()
            .as_ref()
            .unwrap()
            .namespaces()
            .iter()
            .flatten()
            .any(|n| n.typ() == *typ);
        fake.file(format!("/proc/self/ns/{kind}"), &format!("{}", 100 + i));
        let theirs = if own { 200 + i } else { 100 + i };
        fake.file(format!("/proc/{pid}/ns/{kind}"), &format!("{theirs}"));
    }
    fake
}

#[test]
fn a_container_as_planned_shows_no_difference_and_each_control_missing_shows_one() {
    for kind in [StageKind::Prebuild, StageKind::Lane, StageKind::Reference] {
        let spec = planned(kind);
        let fake = host(&spec, 4242, &table(&spec, None));
        let o = read(&*fake, 4242, &spec).unwrap();
        assert_eq!(differences(&spec, &o), Vec::<String>::new(), "{kind}");
        // Only the filter above the supervisor's counts as the runtime's.
        assert_eq!(o.seccomp, (2, 1), "{kind}");
        assert!(
            o.mounts.len() >= 5 && o.others.is_empty(),
            "{kind}: the root and every mount: {:?}",
            o.mounts
        );
        // Each control the runtime could drop, alone: exactly one difference naming it.
        type Change = Box<dyn Fn(&mut Outside)>;
        let changes: Vec<(&str, Change)> = vec![
            ("uids", Box::new(|o| o.uids[3] = 0)),
            ("gids", Box::new(|o| o.gids[0] = 0)),
            ("groups", Box::new(|o| o.groups.push(0))),
            (
                "CapInh",
                Box::new(|o| *o.caps.get_mut("CapInh").unwrap() = 1),
            ),
            (
                "CapPrm",
                Box::new(|o| *o.caps.get_mut("CapPrm").unwrap() = 1 << 21),
            ),
            (
                "CapEff",
                Box::new(|o| *o.caps.get_mut("CapEff").unwrap() = 1),
            ),
            (
                "CapBnd",
                Box::new(|o| *o.caps.get_mut("CapBnd").unwrap() = 1 << 21),
            ),
            (
                "CapAmb",
                Box::new(|o| *o.caps.get_mut("CapAmb").unwrap() = 1),
            ),
            ("no_new_privs", Box::new(|o| o.no_new_privs = false)),
            ("seccomp mode", Box::new(|o| o.seccomp = (0, 0))),
            // A filter the supervisor had is no filter of the runtime's.
            ("seccomp mode", Box::new(|o| o.seccomp = (2, 0))),
            ("seccomp mode", Box::new(|o| o.seccomp = (2, 2))),
            (
                "namespaces",
                Box::new(|o| *o.namespaces.get_mut("pid").unwrap() = false),
            ),
            (
                "namespaces",
                Box::new(|o| *o.namespaces.get_mut("net").unwrap() = false),
            ),
            (
                "namespaces",
                Box::new(|o| *o.namespaces.get_mut("ipc").unwrap() = false),
            ),
            (
                "namespaces",
                Box::new(|o| *o.namespaces.get_mut("user").unwrap() = true),
            ),
            ("a private network namespace", Box::new(|o| o.routes = 1)),
            (
                "RLIMIT_NOFILE is ",
                Box::new(|o| {
                    o.limits.get_mut("RLIMIT_NOFILE").unwrap().1 = u64::MAX;
                }),
            ),
            (
                "RLIMIT_RTPRIO is 99 soft",
                Box::new(|o| *o.limits.get_mut("RLIMIT_RTPRIO").unwrap() = (99, 99)),
            ),
            (
                "RLIMIT_NICE is not shown",
                Box::new(|o| {
                    o.limits.remove("RLIMIT_NICE");
                }),
            ),
            (
                "RLIMIT_CORE is 1 soft",
                Box::new(|o| o.limits.get_mut("RLIMIT_CORE").unwrap().0 = 1),
            ),
            (
                "mount /:",
                Box::new(|o| {
                    let root = o.mounts.get_mut("/").unwrap().as_mut().unwrap();
                    if root.has("ro") {
                        root.flags.retain(|f| f != "ro");
                    } else {
                        root.flags.insert(0, "ro".to_owned());
                    }
                }),
            ),
            (
                "mount /proc: without nosuid",
                Box::new(|o| {
                    let proc = o.mounts.get_mut("/proc").unwrap().as_mut().unwrap();
                    proc.flags.retain(|f| f != "nosuid");
                }),
            ),
            (
                "mount /dev: a sysfs mount, not tmpfs",
                Box::new(|o| {
                    let dev = o.mounts.get_mut("/dev").unwrap().as_mut().unwrap();
                    "sysfs".clone_into(&mut dev.fstype);
                }),
            ),
            (
                "mount /dev: 65540k size, not 65536k",
                Box::new(|o| {
                    o.mounts.get_mut("/dev").unwrap().as_mut().unwrap().size_kib = Some(65540)
                }),
            ),
            (
                "mount /dev: no size, not 65536k",
                Box::new(|o| o.mounts.get_mut("/dev").unwrap().as_mut().unwrap().size_kib = None),
            ),
            (
                "mount /tmp: nothing mounted there",
                Box::new(|o| *o.mounts.get_mut("/tmp").unwrap() = None),
            ),
        ];
        for (name, change) in changes {
            let mut changed = o.clone();
            change(&mut changed);
            let d = differences(&spec, &changed);
            assert!(
                d.len() == 1 && d[0].starts_with(name),
                "{kind}: {name} changed gives {d:?}"
            );
        }
    }
}

#[test]
fn every_mount_is_read_from_the_table_and_a_missing_fact_is_no_posture() {
    let spec = planned(StageKind::Lane);
    // Each bind's flag flipped in the kernel's table is that bind's difference.
    for (point, is) in [
        ("/", "ro"),
        ("/engine", "rw"),
        ("/native", "rw"),
        ("/model", "rw"),
        ("/cache", "ro"),
    ] {
        let fake = host(&spec, 4242, &table(&spec, Some(point)));
        let o = read(&*fake, 4242, &spec).unwrap();
        let d = differences(&spec, &o);
        assert_eq!(
            d,
            [format!(
                "mount {point}: {is}, not {}",
                if is == "ro" { "rw" } else { "ro" }
            )]
        );
    }
    // Each flag the kernel's table lacks is that mount's difference; one it adds is none.
    let planned_table = table(&spec, None);
    for (point, flag) in [
        ("/engine", "noexec"),
        ("/model", "nodev"),
        ("/tmp", "nosuid"),
        ("/dev/shm", "noexec"),
        ("/proc", "nodev"),
    ] {
        let lacking: String = planned_table
            .lines()
            .map(|l| if l.contains(&format!(" {point} ")) { l.replacen(&format!(",{flag}"), "", 1) } else { l.to_owned() } + "\n")
            .collect();
        let o = read(&*host(&spec, 4242, &lacking), 4242, &spec).unwrap();
        assert_eq!(
            differences(&spec, &o),
            [format!("mount {point}: without {flag}")]
        );
    }
    let wider = planned_table.replace(
        " ro,nosuid,nodev,relatime",
        " ro,nosuid,nodev,noexec,relatime",
    );
    assert_ne!(wider, planned_table);
    let o = read(&*host(&spec, 4242, &wider), 4242, &spec).unwrap();
    assert_eq!(differences(&spec, &o), Vec::<String>::new());
    // The shm bound shown other than planned (4 GiB is 4194304 KiB).
    let unbounded = planned_table.replace("size=4194304k", "size=12582912k");
    assert_ne!(unbounded, planned_table);
    let o = read(&*host(&spec, 4242, &unbounded), 4242, &spec).unwrap();
    assert_eq!(
        differences(&spec, &o),
        ["mount /dev/shm: 12582912k size, not 4294967296"]
    );
    // A bind the runtime did not make is a difference too (never "nothing there").
    let lacking: String = planned_table
        .lines()
        .filter(|l| !l.contains(" /model "))
        .map(|l| format!("{l}\n"))
        .collect();
    let o = read(&*host(&spec, 4242, &lacking), 4242, &spec).unwrap();
    assert_eq!(o.mounts["/model"], None);
    assert_eq!(
        differences(&spec, &o),
        ["mount /model: nothing mounted there"]
    );
    // A later mount at a point covers an earlier one.
    let covered =
        format!("{planned_table}99 1 0:99 / /engine rw,nosuid,nodev,noexec - ext4 x rw\n");
    let o = read(&*host(&spec, 4242, &covered), 4242, &spec).unwrap();
    assert_eq!(differences(&spec, &o), ["mount /engine: rw, not ro"]);
    // An unreadable status, a field it lacks, a namespace that cannot be looked at, a limit
    // the table does not show or shows garbled: the posture is not established.
    let fake = host(&spec, 4242, &planned_table);
    let without: String = limits(&spec)
        .lines()
        .filter(|l| !l.starts_with("Max realtime priority"))
        .map(|l| format!("{l}\n"))
        .collect();
    fake.file("/proc/4242/limits", &without);
    let e = read(&*fake, 4242, &spec).unwrap_err();
    assert_eq!(e, "a limits table without Max realtime priority");
    let garbled: String = limits(&spec)
        .lines()
        .map(|l| match l.strip_prefix("Max open files") {
            Some(_) => {
                "Max open files            10x4                 10x4                 files\n"
                    .to_owned()
            }
            None => format!("{l}\n"),
        })
        .collect();
    fake.file("/proc/4242/limits", &garbled);
    let e = read(&*fake, 4242, &spec).unwrap_err();
    assert!(e.starts_with("Max open files: "), "{e}");
    let fake = host(&spec, 4242, &table(&spec, None));
    fake.file("/proc/4242/status", "Uid:\t1\t1\t1\t1\n");
    let e = read(&*fake, 4242, &spec).unwrap_err();
    assert!(e.starts_with("a process status without "), "{e}");
    fake.unreadable("/proc/4242/status");
    let e = read(&*fake, 4242, &spec).unwrap_err();
    assert!(e.starts_with("/proc/4242/status: "), "{e}");
    let fake = host(&spec, 4242, &table(&spec, None));
    fake.unreadable("/proc/4242/ns/ipc");
    let e = read(&*fake, 4242, &spec).unwrap_err();
    assert!(e.starts_with("/proc/4242/ns/ipc: "), "{e}");
}

/// Every mount the plan does not name is accounted for: the runtime's masks (any flags), its
/// read-only paths (read-only), a submount an `rbind` carried beneath a bind (as narrow as the
/// bind: runc 1.1 narrows only the top one); anything else is a mount nobody planned.
#[test]
fn every_other_mount_is_a_mask_a_read_only_path_or_a_submount_as_narrow_as_its_bind() {
    let spec = planned(StageKind::Lane);
    let planned_table = table(&spec, None);
    let with = |spec: &Spec, lines: &str| {
        let o = read(
            &*host(spec, 4242, &format!("{}{lines}", table(spec, None))),
            4242,
            spec,
        )
        .unwrap();
        (differences(spec, &o), o)
    };
    // As narrow as its bind, or narrower; a mask; a read-only path: no difference, but recorded.
    let (d, o) = with(
        &spec,
        "90 9 0:90 / /engine/sub ro,nosuid,nodev,noexec - ext4 x rw\n\
         91 9 0:91 / /tmp/sub rw,nosuid,nodev,noexec - tmpfs x rw,size=8k\n\
         92 9 0:92 / /proc/kcore rw,nosuid - tmpfs x rw,size=8k\n\
         93 9 0:93 / /proc/sys ro,nosuid,nodev,noexec - proc x rw\n",
    );
    assert_eq!(d, Vec::<String>::new());
    assert_eq!(
        o.others.keys().collect::<Vec<_>>(),
        ["/engine/sub", "/proc/kcore", "/proc/sys", "/tmp/sub"]
    );
    // Wider than its bind: each flag it lacks; a read-only path left writable; a mount under
    // the root, `/proc` or `/dev` that nothing planned (masks are exact paths).
    let (d, _) = with(
        &spec,
        "90 9 0:90 / /engine/a/b rw,nosuid - ext4 x rw\n\
         91 9 0:91 / /cache/x rw,nodev - tmpfs x rw,size=8k\n\
         92 9 0:92 / /proc/sysrq-trigger rw,nosuid - proc x rw\n\
         93 9 0:93 / /host rw - ext4 x rw\n\
         94 9 0:94 / /proc/kcore/x rw - ext4 x rw\n\
         95 9 0:95 / /dev/sda rw - devtmpfs x rw\n",
    );
    assert_eq!(
        d,
        [
            "mount /cache/x beneath /cache: without nosuid",
            "mount /dev/sda: not planned",
            "mount /engine/a/b beneath /engine: rw, not ro",
            "mount /engine/a/b beneath /engine: without nodev",
            "mount /engine/a/b beneath /engine: without noexec",
            "mount /host: not planned",
            "mount /proc/kcore/x: not planned",
            "mount /proc/sysrq-trigger: a read-only path, rw",
        ]
    );
    // Beneath the read-only root of the prebuild, even read-only.
    let (d, _) = with(
        &planned(StageKind::Prebuild),
        "50 1 0:50 / /opt ro,nosuid,nodev,noexec - ext4 x rw\n",
    );
    assert_eq!(d, ["mount /opt: not planned"]);
    // A table read of another plan is no evidence for this one: its mounts are unplanned here.
    let o = read(&*host(&spec, 4242, &planned_table), 4242, &spec).unwrap();
    let prebuild = planned(StageKind::Prebuild);
    assert!(
        differences(&prebuild, &o)
            .iter()
            .any(|d| d == "mount /model: not planned"),
        "{:?}",
        differences(&prebuild, &o)
    );
}

/// The planner's tmpfs sizes as the kernel shows them: whole pages, in KiB; a size at the
/// kernel's default (half its memory) is shown by no `size=` at all.
#[test]
fn tmpfs_sizes_are_compared_in_the_kernels_units() {
    for (planned, page, kib) in [
        ("65536k", 4096, Some(65536)),
        ("4294967296", 4096, Some(4_194_304)),
        ("1", 4096, Some(4)),
        ("4097", 4096, Some(8)),
        ("4097", 65536, Some(64)),
        ("100000k", 65536, Some(100_032)),
        ("2m", 4096, Some(2048)),
        ("1G", 16384, Some(1_048_576)),
        ("0", 4096, Some(0)),
        ("", 4096, None),
        ("k", 4096, None),
        ("10%", 4096, None),
        ("1t", 4096, None),
        ("99999999999999999999", 4096, None),
        ("18446744073709551615k", 4096, None),
    ] {
        assert_eq!(size_kib(planned, page), kib, "{planned} in pages of {page}");
    }
    // On a kernel of 64 KiB pages a planned size is shown rounded up to them.
    let spec = planned(StageKind::Lane);
    let o = read(&*host(&spec, 4242, &table(&spec, None)), 4242, &spec).unwrap();
    let mut big_pages = o.clone();
    big_pages.page_size = 65536;
    assert_eq!(differences(&spec, &big_pages), Vec::<String>::new());
    big_pages
        .mounts
        .get_mut("/dev")
        .unwrap()
        .as_mut()
        .unwrap()
        .size_kib = Some(65600);
    assert_eq!(
        differences(&spec, &big_pages),
        ["mount /dev: 65600k size, not 65536k"]
    );
    // A planned size the planner would not write is a difference, never skipped.
    let mut v = serde_json::to_value(&spec).unwrap();
    for m in v["mounts"].as_array_mut().unwrap() {
        if m["destination"] == "/dev" {
            for o in m["options"].as_array_mut().unwrap() {
                if o.as_str().unwrap().starts_with("size=") {
                    *o = serde_json::json!("size=10%");
                }
            }
        }
    }
    let odd: Spec = serde_json::from_value(v).unwrap();
    assert_eq!(differences(&odd, &o), ["mount /dev: 65536k size, not 10%"]);
    // No `size=`: the kernel's default, half of MemTotal in whole pages.
    let fake = host(&spec, 4242, &table(&spec, None).replace(",size=65536k", ""));
    fake.file(
        "/proc/meminfo",
        "MemTotal:       24579476 kB\nMemFree: 1 kB\n",
    );
    let o = read(&*fake, 4242, &spec).unwrap();
    assert_eq!(
        o.mounts["/dev"].as_ref().unwrap().size_kib,
        Some(12_289_736)
    );
    assert_eq!(
        differences(&spec, &o),
        ["mount /dev: 12289736k size, not 65536k"]
    );
    fake.file("/proc/meminfo", "MemFree: 1 kB\n");
    assert_eq!(
        read(&*fake, 4242, &spec).unwrap_err(),
        "a memory table without MemTotal"
    );
}

/// A plan that grants capabilities is compared set by set: each set's bits, and no other.
#[test]
fn planned_capabilities_are_compared_set_by_set() {
    let mut v = serde_json::to_value(planned(StageKind::Prebuild)).unwrap();
    let caps = &mut v["process"]["capabilities"];
    caps["bounding"] = serde_json::json!(["CAP_CHOWN", "CAP_KILL"]);
    caps["permitted"] = serde_json::json!(["CAP_CHOWN", "CAP_KILL"]);
    caps["effective"] = serde_json::json!(["CAP_CHOWN"]);
    caps["inheritable"] = serde_json::json!(["CAP_CHOWN", "CAP_KILL"]);
    caps["ambient"] = serde_json::json!(["CAP_KILL"]);
    let spec: Spec = serde_json::from_value(v).unwrap();
    let (chown, kill) = (1u64 << 0, 1u64 << 5);
    let fake = host(&spec, 4242, &table(&spec, None));
    let mut o = read(&*fake, 4242, &spec).unwrap();
    for (set, bits) in [
        ("CapBnd", chown | kill),
        ("CapPrm", chown | kill),
        ("CapEff", chown),
        ("CapInh", chown | kill),
        ("CapAmb", kill),
    ] {
        o.caps.insert(set.to_owned(), bits);
    }
    assert_eq!(differences(&spec, &o), Vec::<String>::new());
    // One bit more or less in any one set is that set's difference.
    for set in ["CapBnd", "CapPrm", "CapEff", "CapInh", "CapAmb"] {
        for flip in [chown, kill, 1 << 21] {
            let mut changed = o.clone();
            *changed.caps.get_mut(set).unwrap() ^= flip;
            let d = differences(&spec, &changed);
            assert!(
                d.len() == 1 && d[0].starts_with(set),
                "{set} ^ {flip:x}: {d:?}"
            );
        }
    }
}
