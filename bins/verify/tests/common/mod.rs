//! The verify tests' chain: a qualification built in a store, every receipt stored and signed
//! through the one path every stage signs with, under a key of the test's own.

#![allow(clippy::unwrap_used, dead_code)]

use cordon::canonical::Digest;
use cordon::receipt::{
    FetchOutputs, IncumbentOutputs, LaneOutputs, MaterializeOutputs, Outcome, PrebuildOutputs,
    Receipt, Role, StageName, StageOutputs,
};
use cordon::signing::HostKey;
use cordon::store::Store;
use cordon::tree::{self, Entry, PUBLICATIONS, Section, TREES};
use cordon_evidence::examples;
use cordon_evidence::qualify::{QualifyOutputs, Reads};
use cordon_evidence::speed as speed_rule;
use serde_json::json;

pub const AUTHORITY: &[u8] = b"authority";

pub fn publish(store: &Store, section: Section, text: &str) -> Digest {
    let mut batch = store.batch().unwrap();
    let (sha256, size) = batch.add_reader(text.as_bytes(), false).unwrap();
    batch.commit().unwrap();
    let entries = vec![Entry {
        path: "a".into(),
        mode: 0o444,
        size,
        sha256,
    }];
    tree::publish_in(store, section, entries, json!({"kind": "test"}))
        .unwrap()
        .digest
}

/// The test's signing key directory, beside its store (never the host's key: these tests need
/// no root).
pub fn keys(store: &Store) -> std::path::PathBuf {
    store.root().with_file_name("keys")
}

/// Store and sign a receipt through the one path every stage uses; its digest.
pub fn emit<T: StageOutputs>(
    store: &Store,
    stage: StageName,
    authority: Digest,
    prev: Option<Digest>,
    inputs: serde_json::Value,
    outputs: &T,
) -> Digest {
    let mut r = Receipt::new(stage, authority, Outcome::Ok);
    r.prev = prev;
    r.inputs = inputs;
    r.set_outputs(outputs).unwrap();
    // Each hop names a piece of evidence, as a stage that ran something does.
    let log = format!("{} said this\n", stage.as_str());
    r.evidence.push(cordon::receipt::Evidence {
        name: "stderr".into(),
        sha256: store.put_evidence(log.as_bytes()).unwrap(),
        bytes: log.len() as u64,
    });
    HostKey::load_or_create(&keys(store))
        .unwrap()
        .store_receipt(store, &r)
        .unwrap()
        .0
}

/// The chain's parts the tampering tests reach for.
pub struct Chain {
    pub dir: tempfile::TempDir,
    pub store: Store,
    pub head: Digest,
    pub key: String,
    pub publication_c: Digest,
    pub session_c: Digest,
    pub prebuild_c: Digest,
    pub qualify: QualifyOutputs,
}

/// A qualification chain whose candidate (20 ms per window) passes against its incumbent
/// (40 ms), under authority `AUTHORITY`.
pub fn chain() -> Chain {
    chain_with(2)
}

/// [`chain`] whose candidate answers request `i` with `c_first + i` (the incumbent with `1 + i`).
pub fn chain_with(c_first: u32) -> Chain {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("store")).unwrap();
    let a = Digest::of_bytes(AUTHORITY);
    let (tree_b, tree_c) = (publish(&store, TREES, "b"), publish(&store, TREES, "c"));
    let (pub_b, pub_c) = (
        publish(&store, PUBLICATIONS, "pb"),
        publish(&store, PUBLICATIONS, "pc"),
    );
    let built = |publication| PrebuildOutputs {
        publication,
        files: 1,
        bytes: 2,
        cached: false,
        meta: None,
    };
    let registration = emit(
        &store,
        StageName::Materialize,
        a,
        None,
        json!({"incumbent_dir": "/x"}),
        &IncumbentOutputs {
            tree_digest: tree_b,
            incumbent: "engine".into(),
            step: Some("build-native".into()),
            files: 1,
            bytes: 1,
        },
    );
    let prebuild_b = emit(
        &store,
        StageName::Prebuild,
        a,
        Some(registration),
        json!({"tree": tree_b}),
        &built(pub_b),
    );
    let fetch = emit(
        &store,
        StageName::Fetch,
        a,
        None,
        json!({}),
        &FetchOutputs {
            archive_sha256: tree_c,
            content_digest: tree_c,
            files: 1,
            bytes: 1,
        },
    );
    let materialize = emit(
        &store,
        StageName::Materialize,
        a,
        Some(fetch),
        json!({}),
        &MaterializeOutputs {
            tree_digest: tree_c,
            delta_digest: tree_c,
            incumbent: tree_b,
            target: "attention".into(),
            namespace: None,
            step: None,
            findings: Vec::new(),
        },
    );
    let prebuild_c = emit(
        &store,
        StageName::Prebuild,
        a,
        Some(materialize),
        json!({"tree": tree_c}),
        &built(pub_c),
    );
    let lane = |prev, o: &LaneOutputs| emit(&store, StageName::Lane, a, Some(prev), json!({}), o);
    let (mut sb, mut sc, mut sb2) = (
        examples::session(Role::B, tree_b, pub_b, 40),
        examples::session(Role::C, tree_c, pub_c, 20),
        examples::session(Role::B, tree_b, pub_b, 40),
    );
    // Each read's tokens, kept as its outputs object.
    let kept = |first: u32| {
        let tokens: Vec<Vec<u32>> = (0..5).map(|i| vec![first + i; 3]).collect();
        store
            .put_object(&cordon_evidence::outputs::encode(&tokens).unwrap())
            .unwrap()
    };
    (sb.outputs, sc.outputs, sb2.outputs) = (kept(1), kept(c_first), kept(1));
    let (db, dc, db2) = (
        lane(prebuild_b, &sb),
        lane(prebuild_c, &sc),
        lane(prebuild_b, &sb2),
    );
    let qualify = examples::qualification(
        &Reads {
            b: sb,
            c: sc,
            b2: sb2,
        },
        Reads {
            b: db,
            c: dc,
            b2: db2,
        },
    );
    assert_eq!(qualify.speed.verdict, speed_rule::Verdict::Pass);
    let head = emit(
        &store,
        StageName::Qualify,
        a,
        Some(prebuild_c),
        json!({}),
        &qualify,
    );
    let key = HostKey::load(&keys(&store)).unwrap().public();
    Chain {
        dir,
        store,
        head,
        key,
        publication_c: pub_c,
        session_c: dc,
        prebuild_c,
        qualify,
    }
}
