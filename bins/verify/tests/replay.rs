//! The offline replay against a whole qualification chain built in a store — the incumbent's
//! registration and prebuild, the candidate's fetch, materialize and prebuild, three lane
//! sessions and the qualify receipt, each stored and signed by the real stage wrapper — and
//! against each way of tampering with it: every one is caught, with its own message.
//! Receipts are signed with a key of the test's own (beside its store), through the one path
//! every stage signs with; only the unprivileged-auditor test needs root.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use cordon::keyset::KeySet;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use cordon::canonical::Digest;
use cordon::receipt::{IncumbentOutputs, Outcome, PrebuildOutputs, Receipt, StageName};
use cordon::signing::HostKey;
use cordon::store::Store;
use cordon::tree::{self, PUBLICATIONS, TREES};
use cordon_evidence::examples;
use cordon_evidence::qualify::QualifyOutputs;
use cordon_verify::{VerifyError, export, verify};
use serde_json::json;

mod common;

use common::{AUTHORITY, Chain, chain, emit, keys, publish};

/// Overwrite a stored (read-only) file.
fn rewrite(path: &Path, bytes: &[u8]) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::write(path, bytes).unwrap();
}

fn receipt_file(c: &Chain, d: &Digest) -> std::path::PathBuf {
    c.store
        .root()
        .join("receipts")
        .join(format!("{}.json", d.hex()))
}

#[test]
fn a_qualification_chain_verifies_here_and_from_its_export_alone() {
    let c = chain();
    let hops = verify(&c.store, &c.head, &KeySet::single(&c.key)).unwrap();
    // Qualify, three sessions, two prebuilds, materialize, fetch, the registration.
    assert_eq!(hops.len(), 9);
    let bundle = Store::open(&c.dir.path().join("bundle")).unwrap();
    assert_eq!(
        export(&c.store, &c.head, &KeySet::single(&c.key), &bundle)
            .unwrap()
            .len(),
        9
    );
    let hops = verify(&bundle, &c.head, &KeySet::single(&c.key)).unwrap();
    assert_eq!(hops.len(), 9);
    // The evidence every hop names travels with it.
    for hop in &hops {
        for named in &hop.receipt.evidence {
            bundle.read_evidence(&named.sha256).unwrap();
        }
    }
    // No verdict rests on evidence: without it the chain still verifies, but an export that
    // would lose it fails, naming it.
    let named = hops[0].receipt.evidence[0].sha256;
    std::fs::remove_file(c.store.path(cordon::store::EVIDENCE, &named.hex())).unwrap();
    verify(&c.store, &c.head, &KeySet::single(&c.key)).unwrap();
    let again = Store::open(&c.dir.path().join("again")).unwrap();
    let e = export(&c.store, &c.head, &KeySet::single(&c.key), &again).unwrap_err();
    assert!(e.to_string().contains(&named.hex()), "{e}");
    // The bundle holds no key: only receipts, signatures, records and objects.
    assert!(
        !c.dir
            .path()
            .join("bundle")
            .join(cordon::signing::KEY_FILE)
            .exists()
    );
}

#[test]
fn every_tampering_is_caught_with_its_own_message() {
    // Another trusted key: every signature fails.
    let c = chain();
    let other = HostKey::load_or_create(&c.dir.path().join("other-key")).unwrap();
    let e = verify(&c.store, &c.head, &KeySet::single(&other.public())).unwrap_err();
    assert!(matches!(e, VerifyError::Signature { .. }), "{e}");

    // A receipt's bytes changed: it no longer hashes to its name.
    let c = chain();
    let path = receipt_file(&c, &c.prebuild_c);
    let text = std::fs::read_to_string(&path).unwrap();
    rewrite(&path, text.replace("\"files\":1", "\"files\":7").as_bytes());
    let e = verify(&c.store, &c.head, &KeySet::single(&c.key)).unwrap_err();
    assert!(e.to_string().contains("hashes to"), "{e}");

    // A receipt's bytes edited so that they still parse to the signed receipt: a key given
    // twice (the parser keeps the last value). The digest of the parse is the name, the bytes
    // are not what was signed.
    let c = chain();
    let path = receipt_file(&c, &c.prebuild_c);
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains("\"files\":1"), "{text}");
    rewrite(
        &path,
        text.replacen("\"files\":1", "\"files\":7,\"files\":1", 1)
            .as_bytes(),
    );
    let e = verify(&c.store, &c.head, &KeySet::single(&c.key)).unwrap_err();
    assert!(e.to_string().contains("not the canonical text"), "{e}");

    // A signature removed.
    let c = chain();
    let sig = c
        .store
        .root()
        .join("receipts")
        .join(cordon::signing::signature_name(&c.session_c));
    std::fs::remove_file(&sig).unwrap();
    let e = verify(&c.store, &c.head, &KeySet::single(&c.key)).unwrap_err();
    assert!(
        matches!(e, VerifyError::Signature { digest, .. } if digest == c.session_c),
        "{e}"
    );

    // A signature made by another key, under that key's name.
    let c = chain();
    let forged = serde_json::to_vec(&other.sign(&c.session_c)).unwrap();
    rewrite(
        &c.store
            .root()
            .join("receipts")
            .join(cordon::signing::signature_name(&c.session_c)),
        &forged,
    );
    let e = verify(&c.store, &c.head, &KeySet::single(&c.key)).unwrap_err();
    assert!(matches!(e, VerifyError::Signature { .. }), "{e}");

    // A read's outputs object edited in place: it no longer hashes to its name.
    let c = chain();
    let outputs = c.store.object_path(&c.qualify.outputs.c, false);
    let mut bytes = std::fs::read(&outputs).unwrap();
    *bytes.last_mut().unwrap() ^= 1;
    rewrite(&outputs, &bytes);
    let e = verify(&c.store, &c.head, &KeySet::single(&c.key)).unwrap_err();
    assert!(
        matches!(&e, VerifyError::Recompute { digest, why } if *digest == c.session_c && why.contains("outputs object")),
        "{e}"
    );

    // A publication's content object changed.
    let c = chain();
    let record = tree::load_in(&c.store, PUBLICATIONS, &c.publication_c).unwrap();
    let object = c.store.object_path(&record.entries[0].sha256, false);
    rewrite(&object, b"px");
    let e = verify(&c.store, &c.head, &KeySet::single(&c.key)).unwrap_err();
    assert!(
        matches!(
            e,
            VerifyError::Object {
                what: "publication",
                ..
            }
        ),
        "{e}"
    );

    // A qualify receipt, properly signed, whose verdict does not follow from its windows.
    let c = chain();
    let mut lie = c.qualify.clone();
    lie.windows.c = examples::windows(39);
    let a = Digest::of_bytes(AUTHORITY);
    let head = emit(
        &c.store,
        StageName::Qualify,
        a,
        Some(c.prebuild_c),
        json!({}),
        &lie,
    );
    let e = verify(&c.store, &head, &KeySet::single(&c.key)).unwrap_err();
    assert!(
        e.to_string().contains("windows are not its sessions'"),
        "{e}"
    );
    let mut lie = c.qualify.clone();
    lie.speed.speedup_bp += 1;
    let head = emit(
        &c.store,
        StageName::Qualify,
        a,
        Some(c.prebuild_c),
        json!({}),
        &lie,
    );
    let e = verify(&c.store, &head, &KeySet::single(&c.key)).unwrap_err();
    assert!(e.to_string().contains("recomputes to"), "{e}");
    let mut lie = c.qualify.clone();
    lie.speed_section.min_margin_bp = 1;
    let head = emit(
        &c.store,
        StageName::Qualify,
        a,
        Some(c.prebuild_c),
        json!({}),
        &lie,
    );
    let e = verify(&c.store, &head, &KeySet::single(&c.key)).unwrap_err();
    assert!(
        e.to_string().contains("not the one its digest names"),
        "{e}"
    );

    // A CPU-lane qualification that claims to settle; one that claims a guard its sessions'
    // device receipts do not prove; device receipts that are not its sessions'.
    let settles = |lie: &QualifyOutputs, why: &str| {
        let head = emit(
            &c.store,
            StageName::Qualify,
            a,
            Some(c.prebuild_c),
            json!({}),
            lie,
        );
        let e = verify(&c.store, &head, &KeySet::single(&c.key)).unwrap_err();
        assert!(e.to_string().contains(why), "{why}: {e}");
    };
    let mut lie = c.qualify.clone();
    lie.settling = true;
    lie.non_settling = None;
    settles(
        &lie,
        "its settling recomputes to Some(\"the lanes are CPU sets",
    );
    let mut lie = c.qualify.clone();
    let pins = [(
        cordon_testkit::LANE_GPUS[0].to_owned(),
        examples::device_config(),
    )]
    .into();
    lie.guard = Some(cordon_evidence::qualify::GuardSection {
        lanes: [("a".to_owned(), pins)].into(),
        drain: cordon_evidence::device::DrainRule {
            samples: 1,
            interval_ms: 10,
            sample_timeout_ms: 10,
            timeout_ms: 10,
            idle_memory: 0,
        },
        envelope: cordon_evidence::device::Envelope {
            max_temperature_c: 90,
            max_power_mw: 1,
            min_graphics_mhz: 0,
            forbidden_throttle: 0,
        },
    });
    lie.settling = true;
    lie.non_settling = None;
    settles(
        &lie,
        "the pre receipt does not cover exactly the lane's GPUs",
    );
    let mut lie = c.qualify.clone();
    lie.devices.c.post.note = "edited".into();
    settles(&lie, "its device receipts are not its sessions'");

    // A receipt of another authority in the middle of a chain.
    let c = chain();
    let b = Digest::of_bytes(b"another authority");
    let t = publish(&c.store, TREES, "x");
    let foreign = emit(
        &c.store,
        StageName::Materialize,
        b,
        None,
        json!({}),
        &IncumbentOutputs {
            tree_digest: t,
            incumbent: "engine".into(),
            step: None,
            files: 1,
            bytes: 1,
        },
    );
    let foreign = emit(
        &c.store,
        StageName::Prebuild,
        a,
        Some(foreign),
        json!({"tree": t}),
        &PrebuildOutputs {
            publication: c.publication_c,
            files: 1,
            bytes: 1,
            cached: false,
            meta: None,
        },
    );
    let e = verify(&c.store, &foreign, &KeySet::single(&c.key)).unwrap_err();
    assert!(matches!(e, VerifyError::Authority { .. }), "{e}");
}

/// A rejected pipeline's last receipt verifies: a rejected fetch, the materialize and prebuild
/// receipts that passed its verdict on. A receipt that is not a pass-on does not rest on a
/// verdict, nor a pass-on on a receipt of another outcome.
#[test]
fn the_last_receipt_of_a_rejected_pipeline_verifies_through_its_pass_ons() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("store")).unwrap();
    let key = HostKey::load_or_create(&keys(&store)).unwrap();
    let put = |r: &Receipt| key.store_receipt(&store, r).unwrap().0;
    let mut fetch = Receipt::new(
        StageName::Fetch,
        Digest::of_bytes(AUTHORITY),
        Outcome::Rejected,
    );
    fetch.reasons.push(cordon::receipt::Reason {
        code: "intake.digest".into(),
        message: "the archive is not the one named".into(),
    });
    let f = put(&fetch);
    let materialize = Receipt::pass_on(StageName::Materialize, &fetch, f);
    let m = put(&materialize);
    let prebuild = Receipt::pass_on(StageName::Prebuild, &materialize, m);
    let p = put(&prebuild);
    let hops = verify(&store, &p, &KeySet::single(&key.public())).unwrap();
    assert_eq!(hops.len(), 3);

    // A prebuild receipt of its own (not a pass-on) over the rejected materialize: refused.
    let mut own = prebuild.clone();
    own.reasons[0].code = "prebuild.exit".into();
    let own = put(&own);
    let e = verify(&store, &own, &KeySet::single(&key.public())).unwrap_err();
    assert!(matches!(e, VerifyError::Order { .. }), "{e}");
    // A pass-on that turns a rejection into a no-decision: refused.
    let mut flipped = prebuild.clone();
    flipped.outcome = Outcome::NoDecision;
    let flipped = put(&flipped);
    let e = verify(&store, &flipped, &KeySet::single(&key.public())).unwrap_err();
    assert!(
        e.to_string()
            .contains("rests only on a receipt that is no-decision"),
        "{e}"
    );
}

/// A head the operator mistyped is theirs (exit 2), never failed evidence, and says what to give:
/// a digest with or without its `sha256:`, a receipt file, or `-` for stdin.
#[test]
fn a_mistyped_head_says_what_to_give_and_stdin_is_a_receipt_file() {
    let c = chain();
    let run = |head: &str, stdin: &[u8]| {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_cordon-verify"))
            .arg("--store")
            .arg(c.store.root())
            .args(["--key", &c.key, head])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), stdin).unwrap();
        let out = child.wait_with_output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let hex = c.head.hex();
    assert_eq!(run(&hex, b"").0, Some(0), "its bare hex digits name it too");
    let receipt = std::fs::read(c.store.path("receipts", &format!("{hex}.json"))).unwrap();
    assert_eq!(
        run("-", &receipt).0,
        Some(0),
        "- reads the receipt from stdin"
    );
    let (code, err) = run("sha256:XYZ", b"");
    assert_eq!(code, Some(2));
    assert!(
        err.contains("is not a receipt digest: give sha256:"),
        "{err}"
    );
    let (code, err) = run(&Digest::of_bytes(b"no such receipt").to_string(), b"");
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("holds no receipt") && err.contains("check --store"),
        "{err}"
    );
    let (code, err) = run("nope.json", b"");
    assert_eq!(code, Some(2));
    assert!(err.contains("give a receipt file a stage printed"), "{err}");
}

/// How `cordon-verify` ends: evidence that does not verify is 1, a store it cannot read is 3.
/// Seed 001's checklist, step 6: an auditor verifies against the host's published key set.
/// A chain signed inside its key's window verifies; a retired key's signatures after its
/// retirement, or a compromised key's after its compromise, do not; one accepted under a key
/// later declared compromised is said on stderr.
#[test]
fn a_key_set_bounds_what_each_key_signed() {
    let c = chain();
    let set_file = c.dir.path().join("keys.json");
    let replay = |entry: serde_json::Value| {
        let set = json!({"schema": 1, "keys": [entry]});
        std::fs::write(&set_file, set.to_string()).unwrap();
        std::process::Command::new(env!("CARGO_BIN_EXE_cordon-verify"))
            .arg("--store")
            .arg(c.store.root())
            .arg("--keys")
            .arg(&set_file)
            .arg(c.head.to_string())
            .output()
            .unwrap()
    };
    let stderr = |o: &std::process::Output| String::from_utf8_lossy(&o.stderr).into_owned();
    // Inside its window: verifies, quietly.
    let out = replay(json!({"key": c.key, "valid_from": "2000-01-01T00:00:00Z"}));
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(stderr(&out).is_empty(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&format!("signed by {}", c.key)),
        "{out:?}"
    );
    // Declared compromised later than the chain: verifies, with the warning.
    let out = replay(json!({"key": c.key, "valid_until": "2100-01-01T00:00:00Z",
        "compromised_at": "2099-01-01T00:00:00Z"}));
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        stderr(&out).contains("declared compromised from 2099"),
        "{out:?}"
    );
    // Retired, or compromised, before the chain was signed: a failed verification (exit 1).
    for (entry, why) in [
        (
            json!({"key": c.key, "valid_until": "2001-01-01T00:00:00Z"}),
            "after the key was retired",
        ),
        (
            json!({"key": c.key, "compromised_at": "2001-01-01T00:00:00Z"}),
            "after the key was declared compromised",
        ),
        (
            json!({"key": c.key, "valid_from": "2099-01-01T00:00:00Z"}),
            "before the key's window opens",
        ),
    ] {
        let out = replay(entry);
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        assert!(stderr(&out).contains(why), "{why}: {out:?}");
    }
    // A key set that is not one: the auditor's wiring (exit 2).
    let out = replay(json!({"key": c.key, "trusted": true}));
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}

#[test]
fn a_chain_that_does_not_verify_is_1_and_a_store_that_cannot_be_read_is_3() {
    use cordon::exit::ExitClass;
    let c = chain();
    let path = receipt_file(&c, &c.prebuild_c);
    let text = std::fs::read_to_string(&path).unwrap();
    rewrite(&path, text.replace("\"files\":1", "\"files\":7").as_bytes());
    let e = verify(&c.store, &c.head, &KeySet::single(&c.key)).unwrap_err();
    assert_eq!(e.exit_class(), cordon::ExitCode::Rejected, "{e}");
    let absent = verify(
        &c.store,
        &Digest::of_bytes(b"absent"),
        &KeySet::single(&c.key),
    )
    .unwrap_err();
    assert_eq!(absent.exit_class(), cordon::ExitCode::Rejected, "{absent}");
    // A receipt the store holds but cannot open (a link under its name: the no-follow open
    // fails with ELOOP) is not evidence either way.
    let c = chain();
    let path = receipt_file(&c, &c.prebuild_c);
    std::fs::remove_file(&path).unwrap();
    std::os::unix::fs::symlink("/etc/hostname", &path).unwrap();
    let e = verify(&c.store, &c.head, &KeySet::single(&c.key)).unwrap_err();
    assert_eq!(e.exit_class(), cordon::ExitCode::NoDecision, "{e}");
}

/// What needs root: handing an export to another user.
mod root_tests {
    use super::*;

    /// Give every entry under `dir` to `uid`:`gid` (links are not followed).
    fn chown_all(dir: &Path, uid: u32, gid: u32) {
        std::os::unix::fs::lchown(dir, Some(uid), Some(gid)).unwrap();
        if std::fs::symlink_metadata(dir).unwrap().is_dir() {
            for e in std::fs::read_dir(dir).unwrap() {
                chown_all(&e.unwrap().path(), uid, gid);
            }
        }
    }

    #[test]
    fn an_auditor_without_root_replays_an_export_with_the_binary() {
        cordon_testkit::require_root("the test hands an export to an unprivileged auditor");
        let setpriv = cordon_testkit::tool(
            "SETPRIV",
            "/usr/bin/setpriv",
            "apt-get install -y util-linux",
        );
        let c = chain();
        // A place the auditor can reach, holding the auditor's own copy.
        let base = tempfile::Builder::new().tempdir_in("/tmp").unwrap();
        std::fs::set_permissions(base.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let copy = base.path().join("bundle");
        export(
            &c.store,
            &c.head,
            &KeySet::single(&c.key),
            &Store::open(&copy).unwrap(),
        )
        .unwrap();
        let nobody = 65_534;
        chown_all(&copy, nobody, nobody);
        let auditor = |key: &str, head: &str| {
            std::process::Command::new(&setpriv)
                .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
                .arg(env!("CARGO_BIN_EXE_cordon-verify"))
                .arg("--store")
                .arg(&copy)
                .args(["--key", key, "--explain", head])
                .output()
                .unwrap()
        };
        let replay = |key: &str| auditor(key, &c.head.to_string());
        let out = replay(&c.key);
        assert!(out.status.success(), "{out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("verified: 9 receipts"), "{text}");
        assert!(text.contains("speed.pass"), "{text}");
        // The same replay under another key is a verification failure (exit 1), not a crash.
        let other = HostKey::load_or_create(&c.dir.path().join("other-key")).unwrap();
        assert_eq!(replay(&other.public()).status.code(), Some(1));
        // The head given as a receipt file: its printed text verifies; the same receipt with edited
        // bytes (they still parse to it) is not that receipt, a usage error.
        let printed =
            std::fs::read_to_string(copy.join("receipts").join(format!("{}.json", c.head.hex())))
                .unwrap();
        for (name, text, code) in [
            ("head.json", format!("{printed}\n"), 0),
            ("edited.json", format!(" {printed}\n"), 2),
        ] {
            let file = base.path().join(name);
            std::fs::write(&file, text).unwrap();
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
            let out = auditor(&c.key, file.to_str().unwrap());
            assert_eq!(out.status.code(), Some(code), "{name}: {out:?}");
        }
    }
}

/// The checks of a receipt against what it rests on, each with its own message: a lane session
/// that mounted another tree or publication than its prebuild's; a qualify receipt whose
/// candidate session is the incumbent's (its windows copied to match); an ok qualify receipt
/// whose outputs are not a qualification's.
#[test]
fn a_session_a_qualification_or_its_outputs_that_do_not_follow_from_what_they_rest_on_are_caught() {
    let c = chain();
    let a = Digest::of_bytes(AUTHORITY);
    let (b_session, b_prev) = {
        let r = cordon::chain::load(&c.store, &c.qualify.sessions.b).unwrap();
        (
            r.outputs_as::<cordon::receipt::LaneOutputs>().unwrap(),
            r.prev,
        )
    };
    // The incumbent's session presented as resting on the candidate's prebuild.
    let lane = emit(
        &c.store,
        StageName::Lane,
        a,
        Some(c.prebuild_c),
        json!({}),
        &b_session,
    );
    let e = verify(&c.store, &lane, &KeySet::single(&c.key)).unwrap_err();
    assert!(e.to_string().contains("not its prebuild's"), "{e}");
    assert_ne!(b_prev, Some(c.prebuild_c));

    // The incumbent's read as the candidate's, its windows copied so they match.
    let mut lie = c.qualify.clone();
    lie.sessions.c = lie.sessions.b;
    lie.windows.c = lie.windows.b.clone();
    let head = emit(
        &c.store,
        StageName::Qualify,
        a,
        Some(c.prebuild_c),
        json!({}),
        &lie,
    );
    let e = verify(&c.store, &head, &KeySet::single(&c.key)).unwrap_err();
    assert!(e.to_string().contains("do not continue"), "{e}");

    // An ok qualify receipt whose outputs are a prebuild's.
    let head = emit(
        &c.store,
        StageName::Qualify,
        a,
        Some(c.prebuild_c),
        json!({}),
        &PrebuildOutputs {
            publication: c.publication_c,
            files: 1,
            bytes: 1,
            cached: false,
            meta: None,
        },
    );
    let e = verify(&c.store, &head, &KeySet::single(&c.key)).unwrap_err();
    assert!(matches!(e, VerifyError::Order { .. }), "{e}");
}

/// `--diagnostics json` makes an error one JSON document on stderr, as every stage's; text is
/// one line naming the tool.
#[test]
fn errors_are_one_json_document_under_diagnostics_json() {
    let missing = tempfile::tempdir().unwrap().path().join("no-store");
    let head = format!("sha256:{}", "0".repeat(64));
    let run = |mode: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_cordon-verify"))
            .args(["--diagnostics", mode, "--store"])
            .arg(&missing)
            .arg(&head)
            .output()
            .unwrap()
    };
    let json = run("json");
    assert_eq!(json.status.code(), Some(2));
    let doc: serde_json::Value = serde_json::from_slice(&json.stderr).unwrap();
    assert_eq!(doc["code"], "cordon::verify");
    assert!(
        doc["message"].as_str().unwrap().contains("no store at"),
        "{doc}"
    );
    let text = String::from_utf8(run("text").stderr).unwrap();
    assert!(text.starts_with("cordon-verify: no store at"), "{text}");
}
