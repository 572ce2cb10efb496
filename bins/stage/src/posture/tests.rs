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

/// The container's mount table as the kernel would show it for `spec`, every flag as planned.
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
        "1 0 0:1 / / {},relatime - overlay overlay rw\n",
        flag("/", root_ro)
    );
    for (i, m) in spec.mounts().iter().flatten().enumerate() {
        let point = m.destination().to_string_lossy().replace(' ', "\\040");
        let ro = m.options().iter().flatten().any(|o| o == "ro");
        t += &format!(
            "{} 1 0:{i} / {point} {},nosuid - tmpfs x rw\n",
            i + 2,
            flag(&point, ro)
        );
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
            o.read_only.len() >= 3,
            "{kind}: root and the binds: {:?}",
            o.read_only
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
                "read-only mounts",
                Box::new(|o| {
                    let root = o.read_only.get_mut("/").unwrap();
                    *root = root.map(|ro| !ro);
                }),
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
fn every_read_only_bind_is_read_from_the_table_and_a_missing_fact_is_no_posture() {
    let spec = planned(StageKind::Lane);
    // Each bind's flag flipped in the kernel's table is that bind's difference.
    for point in ["/", "/engine", "/native", "/model", "/cache"] {
        let fake = host(&spec, 4242, &table(&spec, Some(point)));
        let o = read(&*fake, 4242, &spec).unwrap();
        let d = differences(&spec, &o);
        assert!(
            d.len() == 1 && d[0].starts_with("read-only mounts"),
            "{point}: {d:?}"
        );
    }
    // A bind the runtime did not make is a difference too (never "nothing there").
    let lacking: String = table(&spec, None)
        .lines()
        .filter(|l| !l.contains(" /model "))
        .map(|l| format!("{l}\n"))
        .collect();
    let o = read(&*host(&spec, 4242, &lacking), 4242, &spec).unwrap();
    assert_eq!(o.read_only["/model"], None);
    let d = differences(&spec, &o);
    assert!(d.len() == 1 && d[0].contains("/model unmounted"), "{d:?}");
    // An unreadable status, a field it lacks, a namespace that cannot be looked at: the
    // posture is not established.
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
