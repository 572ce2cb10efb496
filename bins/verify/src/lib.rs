//! `cordon-verify`: the offline replay of a receipt chain, and its export.
//!
//! [`verify`] walks from a head receipt back to the start of every chain it rests on — along
//! `prev`, and from a qualify receipt also to its three session receipts — and establishes at
//! every hop: the stored bytes hash to the receipt's name; the host's detached signature over
//! that digest verifies under the trusted public key (the host's published one, never a key a
//! bundle brings); the authority is the head's; the stage is the one its successor consumes
//! (a chain starts at intake or at an incumbent's registration, nowhere else); every hop below
//! the head is `ok`; every tree and publication a hop names still exists and re-hashes; a
//! session's tree and publication are its prebuild's; and a qualify receipt's windows are its
//! sessions' and its speed verdict recomputes from them, under the speed section it records
//! (whose digest it also records), to exactly what it says. A final verdict rests on its
//! qualification, its reference session T and the quiescence receipt T started after; every
//! outputs object a session or T names re-hashes and decodes, and the verdict recomputes from
//! those objects — each read graded against T under the quality rule it records (whose digest
//! it also records), and the candidate's audit regraded against T's outputs for the requests
//! it sampled — to exactly what it says. An audit receipt is its own stage: a qualify receipt
//! whose session is one is refused (no speed computation reads an audit).
//!
//! It needs no root, no runtime and no network: only a store, or a copy of one made by
//! [`export`] (the receipts, their signatures, the trees and publications they name and the
//! evidence they name, which travels with them but is never part of what verifies).
//!
//! What it does not own: intake records (a fetch receipt's content is not re-hashed here; its
//! tree, materialized from it, is), the audit's plan object (the sampled requests it sent: its
//! digest is recorded, not re-read), the key set's history (`cordon::keyset`: rotation and
//! compromise are the host's; this checks each signature against the set it is given).

pub mod cli;
mod referee;

use std::collections::BTreeSet;

use cordon::canonical::Digest;
use cordon::chain::{self, ChainError, starts_incumbent_chain};
use cordon::keyset::{KeyEntry, KeySet};
use cordon::receipt::{
    IncumbentOutputs, LaneOutputs, MaterializeOutputs, Outcome, PrebuildOutputs, Receipt, StageName,
};
use cordon::signing::{self, SigningError};
use cordon::store::{Store, StoreError};
use cordon::tree::{self, PUBLICATIONS, Section, TREES, TreeError};
use cordon_evidence::inputs::PrebuildInputs;
use cordon_evidence::qualify::{QualifyOutputs, speed_policy_digest, unsettled};
use cordon_evidence::speed::{self, Verdict};

/// The most receipts one walk visits.
pub const MAX_HOPS: usize = 256;

/// Why a chain did not verify: each names the receipt and what is wrong with it.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum VerifyError {
    /// The receipt is missing, unreadable, or its bytes hash to another name.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Receipt(#[from] ChainError),
    /// Its signature is missing or does not verify.
    #[error("receipt {digest}'s signature")]
    #[diagnostic(
        code(cordon::verify::signature),
        help(
            "verify with the signing host's published key (--key ed25519:…) or key set (--keys FILE); a signature that does not verify under the right key is evidence that fails"
        )
    )]
    Signature {
        /// The receipt.
        digest: Digest,
        /// Why.
        #[source]
        source: SigningError,
    },
    /// It was made under another authority than the head's.
    #[error("receipt {digest} ({stage}) is under authority {found}, the head under {expected}")]
    #[diagnostic(code(cordon::verify::authority))]
    Authority {
        /// The receipt.
        digest: Digest,
        /// Its stage.
        stage: StageName,
        /// Its authority.
        found: Digest,
        /// The head's.
        expected: Digest,
    },
    /// Out of order, not ok below the head, or of a shape its stage does not have.
    #[error("receipt {digest} ({stage}): {why}")]
    #[diagnostic(code(cordon::verify::order))]
    Order {
        /// The receipt.
        digest: Digest,
        /// Its stage.
        stage: StageName,
        /// What is wrong.
        why: String,
    },
    /// A tree or publication it names is missing or does not re-hash.
    #[error("receipt {digest} names {what} {object}, which does not verify")]
    #[diagnostic(code(cordon::verify::object))]
    Object {
        /// The receipt.
        digest: Digest,
        /// A tree or a publication.
        what: &'static str,
        /// Its digest.
        object: Digest,
        /// Why.
        #[source]
        source: Box<TreeError>,
    },
    /// A recomputed value differs from the recorded one.
    #[error("receipt {digest}: {why}")]
    #[diagnostic(code(cordon::verify::recompute))]
    Recompute {
        /// The receipt.
        digest: Digest,
        /// What differs.
        why: String,
    },
    /// The walk passed [`MAX_HOPS`].
    #[error("the chain from {head} has more than {MAX_HOPS} receipts")]
    #[diagnostic(code(cordon::verify::too_long))]
    TooLong {
        /// The head.
        head: Digest,
    },
    /// The export could not be written.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Store(#[from] StoreError),
    /// The export could not publish a tree.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Tree(Box<TreeError>),
}

impl cordon::exit::ExitClass for VerifyError {
    /// A chain that does not verify — a receipt or signature missing, edited, forged, out of
    /// order, under another authority, an object that does not re-hash, a verdict that does not
    /// recompute — is 1: the evidence fails. A store that cannot be read or an export that
    /// cannot be written is 3: nothing was established either way.
    fn exit_class(&self) -> cordon::ExitCode {
        use cordon::ExitCode::{NoDecision, Rejected};
        match self {
            Self::Receipt(ChainError::Missing {
                source: StoreError::Io { source, .. },
                ..
            })
            | Self::Signature {
                source: SigningError::Store(StoreError::Io { source, .. }),
                ..
            } if source.kind() != std::io::ErrorKind::NotFound => NoDecision,
            Self::Receipt(_)
            | Self::Signature { .. }
            | Self::Authority { .. }
            | Self::Order { .. }
            | Self::Object { .. }
            | Self::Recompute { .. }
            | Self::TooLong { .. } => Rejected,
            Self::Store(_) | Self::Tree(_) => NoDecision,
        }
    }
}

/// One receipt the walk established, with the objects it names.
#[derive(Debug, Clone)]
pub struct Hop {
    /// Its digest.
    pub digest: Digest,
    /// The receipt.
    pub receipt: Receipt,
    /// The trees and publications it names, all verified.
    pub objects: Vec<(Section, Digest)>,
    /// The outputs objects (a session's or T's tokens) it names, all re-hashed and decoded.
    pub outputs: Vec<Digest>,
    /// The key of the set its signature verified under.
    pub signed_by: KeyEntry,
    /// The receipts it rests on (its `prev`, the receipts it links), each also a hop.
    pub rests_on: Vec<Digest>,
}

/// What one receipt names and rests on.
#[derive(Debug, Default)]
struct Names {
    objects: Vec<(Section, Digest)>,
    outputs: Vec<Digest>,
    edges: Edges,
    /// Receipts it rests on as evidence of the candidate's own failure: each must be
    /// `rejected` (the final verdict's FAIL over an audit the candidate broke).
    rejected: Edges,
}

impl Names {
    fn edges(edges: Edges) -> Self {
        Self {
            edges,
            ..Self::default()
        }
    }

    fn objects(objects: Vec<(Section, Digest)>, edges: Edges) -> Self {
        Self {
            objects,
            edges,
            ..Self::default()
        }
    }
}

/// An outputs object from the store, re-hashed and decoded.
pub(crate) fn tokens(
    store: &Store,
    digest: &Digest,
    object: &Digest,
) -> Result<Vec<Vec<u32>>, VerifyError> {
    let bad = |why: String| VerifyError::Recompute {
        digest: *digest,
        why: format!("its outputs object {object}: {why}"),
    };
    let bytes = store.read_object_checked(object).map_err(|e| match e {
        // A store that cannot be read establishes nothing either way.
        StoreError::Io { ref source, .. } if source.kind() != std::io::ErrorKind::NotFound => {
            VerifyError::Store(e)
        }
        e => bad(e.to_string()),
    })?;
    cordon_evidence::outputs::decode(&bytes).map_err(|e| bad(e.to_string()))
}

/// What one receipt leads to: the receipts it rests on, each with the stage it must be.
pub(crate) type Edges = Vec<(Digest, StageName)>;

/// Verify the chain under `head` with the trusted key set `keys` (each receipt's signature by
/// a key of the set, made inside that key's window: [`KeySet::verify`]); the hops, head first.
///
/// # Errors
/// The first thing that does not verify.
pub fn verify(store: &Store, head: &Digest, keys: &KeySet) -> Result<Vec<Hop>, VerifyError> {
    let mut hops: Vec<Hop> = Vec::new();
    let mut seen = BTreeSet::new();
    // Each receipt still to verify, with the stage and outcome its successor rests on.
    let mut todo: Vec<(Digest, Option<(StageName, Outcome)>)> = vec![(*head, None)];
    let mut authority = None;
    while let Some((digest, expected)) = todo.pop() {
        if !seen.insert(digest) {
            continue;
        }
        if seen.len() > MAX_HOPS {
            return Err(VerifyError::TooLong { head: *head });
        }
        let r = chain::load(store, &digest)?;
        let sig = signing::stored(store, &digest)
            .map_err(|source| VerifyError::Signature { digest, source })?;
        let signed_by = keys
            .verify(&digest, &sig, &r.finished_at)
            .map_err(|source| VerifyError::Signature { digest, source })?
            .clone();
        let expected_authority = *authority.get_or_insert(r.authority);
        if r.authority != expected_authority {
            return Err(VerifyError::Authority {
                digest,
                stage: r.stage,
                found: r.authority,
                expected: expected_authority,
            });
        }
        let order = |why: String| VerifyError::Order {
            digest,
            stage: r.stage,
            why,
        };
        if let Some((stage, _)) = expected
            && r.stage != stage
        {
            return Err(order(format!("its successor consumes a {stage} receipt")));
        }
        // Below the head, only an ok receipt can be rested on, except by a pass-on receipt,
        // which rests on one of its own outcome.
        if let Some((_, may)) = expected
            && r.outcome != may
        {
            return Err(order(format!(
                "is {}, and its successor rests only on a receipt that is {}",
                r.outcome.as_str(),
                may.as_str()
            )));
        }
        let Names {
            objects,
            outputs,
            edges,
            rejected,
        } = hop(store, &digest, &r)?;
        for object in &outputs {
            tokens(store, &digest, object)?;
        }
        let rests_on = if r.passes_on() {
            r.outcome
        } else {
            Outcome::Ok
        };
        for (section, object) in &objects {
            tree::verify_in(store, *section, object).map_err(|source| VerifyError::Object {
                digest,
                what: if section.dir == TREES.dir {
                    "tree"
                } else {
                    "publication"
                },
                object: *object,
                source: Box::new(source),
            })?;
        }
        let named: Vec<Digest> = edges.iter().chain(&rejected).map(|(d, _)| *d).collect();
        todo.extend(edges.into_iter().map(|(d, s)| (d, Some((s, rests_on)))));
        todo.extend(
            rejected
                .into_iter()
                .map(|(d, s)| (d, Some((s, Outcome::Rejected)))),
        );
        hops.push(Hop {
            digest,
            receipt: r,
            objects,
            outputs,
            signed_by,
            rests_on: named,
        });
    }
    Ok(hops)
}

/// A receipt's own checks: the objects it names and the receipts it rests on.
#[allow(clippy::too_many_lines)]
fn hop(store: &Store, digest: &Digest, r: &Receipt) -> Result<Names, VerifyError> {
    let order = |why: String| VerifyError::Order {
        digest: *digest,
        stage: r.stage,
        why,
    };
    let shape = |e: cordon::receipt::ReceiptError| order(e.to_string());
    let prev = |stage: StageName| -> Result<Edges, VerifyError> {
        r.prev
            .map(|p| vec![(p, stage)])
            .ok_or_else(|| order(format!("names no {stage} receipt before it")))
    };
    // A pass-on receipt establishes nothing: it names only the verdict it passes on.
    if r.passes_on() {
        return match r.stage.predecessor() {
            Some(p) => Ok(Names::edges(prev(p)?)),
            None => Err(order(
                "passes on a verdict but has no stage before it".into(),
            )),
        };
    }
    // A rejected or no-decision head has no outputs of its stage to check.
    let established =
        r.outcome == Outcome::Ok || matches!(r.stage, StageName::Qualify | StageName::Verdict);
    match r.stage {
        StageName::Fetch => match r.prev {
            None => Ok(Names::default()),
            Some(_) => Err(order("starts a chain but names a receipt before it".into())),
        },
        StageName::Materialize if starts_incumbent_chain(r) => {
            let o = r.outputs_as::<IncumbentOutputs>().map_err(shape)?;
            Ok(Names::objects(vec![(TREES, o.tree_digest)], Vec::new()))
        }
        StageName::Materialize => {
            let objects = if established {
                vec![(
                    TREES,
                    r.outputs_as::<MaterializeOutputs>()
                        .map_err(shape)?
                        .tree_digest,
                )]
            } else {
                Vec::new()
            };
            Ok(Names::objects(objects, prev(StageName::Fetch)?))
        }
        StageName::Prebuild => {
            let mut objects = vec![(TREES, r.inputs_as::<PrebuildInputs>().map_err(shape)?.tree)];
            if established {
                let o = r.outputs_as::<PrebuildOutputs>().map_err(shape)?;
                objects.push((PUBLICATIONS, o.publication));
            }
            Ok(Names::objects(objects, prev(StageName::Materialize)?))
        }
        StageName::Lane => {
            let edges = prev(StageName::Prebuild)?;
            if !established {
                return Ok(Names::edges(edges));
            }
            let o = r.outputs_as::<LaneOutputs>().map_err(shape)?;
            // A session mounts exactly what its prebuild established.
            let built = chain::load(store, &edges[0].0)?;
            let publication = built
                .outputs_as::<PrebuildOutputs>()
                .map_err(shape)?
                .publication;
            let built_tree = built.inputs_as::<PrebuildInputs>().map_err(shape)?.tree;
            if (built_tree, publication) != (o.tree, o.publication) {
                return Err(order(
                    "its tree or publication is not its prebuild's".into(),
                ));
            }
            Ok(Names {
                objects: vec![(TREES, o.tree), (PUBLICATIONS, o.publication)],
                outputs: vec![o.outputs],
                edges,
                ..Names::default()
            })
        }
        StageName::Qualify => {
            let mut edges = prev(StageName::Prebuild)?;
            if r.outcome == Outcome::NoDecision {
                return Ok(Names::edges(edges));
            }
            let o = match r.outputs_as::<QualifyOutputs>() {
                Ok(o) => o,
                // A candidate that broke its own session: the evidence names that session,
                // not a verdict to recompute.
                Err(_) if r.outcome == Outcome::Rejected => return Ok(Names::edges(edges)),
                Err(e) => return Err(shape(e)),
            };
            recompute(store, digest, r, &o)?;
            edges.extend(
                [o.sessions.b, o.sessions.c, o.sessions.b2]
                    .into_iter()
                    .map(|d| (d, StageName::Lane)),
            );
            Ok(Names::edges(edges))
        }
        // A surface run and a quiescence check rest on nothing and name no tree: each receipt is
        // its own evidence.
        StageName::Surface | StageName::Reap => match r.prev {
            None => Ok(Names::default()),
            Some(_) => Err(order(format!(
                "a {} receipt names a receipt before it",
                r.stage
            ))),
        },
        StageName::Reference => {
            referee::reference(store, r, prev(StageName::Qualify)?, established).map_err(&order)
        }
        StageName::Audit => {
            referee::audit(store, r, prev(StageName::Qualify)?, established).map_err(&order)
        }
        StageName::Verdict => referee::verdict(store, digest, r, prev(StageName::Qualify)?),
        StageName::Policy => Err(order(
            "this build cannot verify a receipt of this stage".into(),
        )),
    }
}

/// A qualify receipt against its sessions: their windows and builds, and the speed verdict
/// recomputed under the section it records.
fn recompute(
    store: &Store,
    digest: &Digest,
    r: &Receipt,
    o: &QualifyOutputs,
) -> Result<(), VerifyError> {
    let differs = |why: String| VerifyError::Recompute {
        digest: *digest,
        why,
    };
    let session = |d: &Digest| -> Result<Receipt, VerifyError> { Ok(chain::load(store, d)?) };
    let (b, c, b2) = (
        session(&o.sessions.b)?,
        session(&o.sessions.c)?,
        session(&o.sessions.b2)?,
    );
    let outputs = |s: &Receipt| {
        s.outputs_as::<LaneOutputs>()
            .map_err(|e| differs(format!("a session's outputs: {e}")))
    };
    let (ob, oc, ob2) = (outputs(&b)?, outputs(&c)?, outputs(&b2)?);
    if [&ob.windows, &oc.windows, &ob2.windows] != [&o.windows.b, &o.windows.c, &o.windows.b2] {
        return Err(differs("its windows are not its sessions'".into()));
    }
    if c.prev != r.prev || b.prev != b2.prev || b.prev == c.prev {
        return Err(differs(
            "its sessions do not continue the candidate's and the incumbent's prebuilds".into(),
        ));
    }
    if [&ob.devices, &oc.devices, &ob2.devices] != [&o.devices.b, &o.devices.c, &o.devices.b2] {
        return Err(differs("its device receipts are not its sessions'".into()));
    }
    // Settling, replayed from the device receipts under the section it records.
    let again = unsettled(
        o.guard.as_ref(),
        [
            ("B", &o.orientation.baseline.name, &ob.devices),
            ("C", &o.orientation.candidate.name, &oc.devices),
            ("B′", &o.orientation.baseline.name, &ob2.devices),
        ],
    );
    if (again.is_none(), &again) != (o.settling, &o.non_settling) {
        return Err(differs(format!(
            "its settling recomputes to {again:?}, the receipt says {} ({:?})",
            o.settling, o.non_settling
        )));
    }
    let section = speed_policy_digest(&o.speed_section)
        .map_err(|e| differs(format!("the speed section: {e}")))?;
    if section != o.speed_policy {
        return Err(differs(
            "the speed section it records is not the one its digest names".into(),
        ));
    }
    let again = speed::decide(&o.speed_section, &o.windows.b, &o.windows.c, &o.windows.b2);
    if again != o.speed {
        return Err(differs(format!(
            "the speed verdict recomputes to {:?} ({}), the receipt says {:?} ({})",
            again.verdict, again.code, o.speed.verdict, o.speed.code
        )));
    }
    let outcome = match again.verdict {
        Verdict::Pass => Outcome::Ok,
        Verdict::Fail => Outcome::Rejected,
        Verdict::NoDecision => Outcome::NoDecision,
    };
    if r.outcome != outcome {
        return Err(differs(format!(
            "its outcome is {}, the verdict it records is {:?}",
            r.outcome.as_str(),
            again.verdict
        )));
    }
    Ok(())
}

fn boxed(e: TreeError) -> VerifyError {
    VerifyError::Tree(Box::new(e))
}

/// Verify the chain under `head`, then copy it into a fresh store at `dest`: every receipt and
/// its signature, every tree and publication they name (records and content objects), every
/// outputs object and every piece of evidence a receipt names, so
/// [`verify`] runs there alone. Returns the hops copied.
///
/// # Errors
/// The chain does not verify, or the copy cannot be written.
pub fn export(
    store: &Store,
    head: &Digest,
    keys: &KeySet,
    dest: &Store,
) -> Result<Vec<Hop>, VerifyError> {
    let hops = verify(store, head, keys)?;
    let mut copied = BTreeSet::new();
    for hop in &hops {
        for name in [
            format!("{}.json", hop.digest.hex()),
            signing::signature_name(&hop.digest),
        ] {
            dest.put_document("receipts", &name, &store.read_document("receipts", &name)?)?;
        }
        for object in &hop.outputs {
            if copied.insert(("objects", *object)) {
                dest.put_object(&store.read_object_checked(object)?)?;
            }
        }
        // The evidence it names travels with it, checked against its name (never verified
        // as part of the chain: no verdict rests on it).
        for named in &hop.receipt.evidence {
            if copied.insert((cordon::store::EVIDENCE, named.sha256)) {
                dest.put_evidence(&store.read_evidence(&named.sha256)?)?;
            }
        }
        for (section, object) in &hop.objects {
            if !copied.insert((section.dir, *object)) {
                continue;
            }
            let record = tree::load_in(store, *section, object).map_err(boxed)?;
            let mut batch = dest.batch()?;
            for e in &record.entries {
                let bytes = store.read_object(&e.sha256, e.executable())?;
                batch.add_reader(bytes.as_slice(), e.executable())?;
            }
            batch.commit()?;
            tree::publish_in(dest, *section, record.entries, record.origin).map_err(boxed)?;
        }
    }
    Ok(hops)
}
