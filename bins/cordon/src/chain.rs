//! Receipts in the store, and the chains they form.
//!
//! It owns loading a receipt by its digest (the stored text is re-hashed: a receipt whose bytes
//! do not hash to the name it is stored under is refused) and walking a chain from its head back
//! along `prev`: at every hop the receipt must be in the store, be `ok`, carry the one authority
//! the walk was asked for, and come from the stage that its successor consumes
//! ([`StageName::predecessor`]); the walk ends at a stage that starts a chain (intake, or an
//! incumbent's registration: [`starts_incumbent_chain`]), and nowhere else. A stage accepts an input receipt only when this walk succeeds; the reference
//! session and the offline replay build on it.
//!
//! It does not store receipts (the stage's receipt wrapper does, and only `ok` ones) and does
//! not interpret their outputs.

use crate::canonical::Digest;
use crate::receipt::{IncumbentOutputs, Outcome, Receipt, ReceiptError, StageName};
use crate::store::{Store, StoreError};

/// The longest chain walked; a longer one is refused rather than followed.
pub const MAX_CHAIN: usize = 64;

/// Why a receipt or a chain could not be established. A stage refuses such an input (exit 2).
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum ChainError {
    /// The store does not hold the receipt (or cannot read it).
    #[error("the store holds no receipt {digest}")]
    #[diagnostic(
        code(cordon::chain::missing),
        help("only receipts a stage of this store established can continue a chain")
    )]
    Missing {
        /// The receipt.
        digest: Digest,
        /// The store's error.
        #[source]
        source: StoreError,
    },
    /// The stored text is not a receipt.
    #[error("stored receipt {digest} is unreadable")]
    #[diagnostic(code(cordon::chain::unreadable))]
    Unreadable {
        /// The receipt.
        digest: Digest,
        /// Why.
        #[source]
        source: ReceiptError,
    },
    /// The stored text hashes to another digest than its name.
    #[error("stored receipt {digest} hashes to {found}")]
    #[diagnostic(code(cordon::chain::tampered))]
    Tampered {
        /// Its name.
        digest: Digest,
        /// What it hashes to.
        found: Digest,
    },
    /// The stored bytes hash to its name only once re-encoded: they are not the canonical text
    /// that was stored (an edited file, a duplicated key, reordered or added bytes).
    #[error("stored receipt {digest} is not the canonical text its digest names")]
    #[diagnostic(code(cordon::chain::not_canonical))]
    NotCanonical {
        /// Its name.
        digest: Digest,
    },
    /// A receipt in the chain is not an established result.
    #[error("receipt {digest} ({stage}) is {outcome:?}, not ok")]
    #[diagnostic(code(cordon::chain::not_ok))]
    NotOk {
        /// The receipt.
        digest: Digest,
        /// Its stage.
        stage: StageName,
        /// Its outcome.
        outcome: Outcome,
    },
    /// A receipt in the chain was made under another authority.
    #[error(
        "receipt {digest} ({stage}) was made under authority {found}, the chain is under {expected}"
    )]
    #[diagnostic(code(cordon::chain::foreign_authority))]
    ForeignAuthority {
        /// The receipt.
        digest: Digest,
        /// Its stage.
        stage: StageName,
        /// Its authority.
        found: Digest,
        /// The chain's.
        expected: Digest,
    },
    /// A hop goes to the wrong stage, or a chain ends (or goes on) where it may not.
    #[error("receipt {digest} ({stage}) {why}")]
    #[diagnostic(code(cordon::chain::order))]
    Order {
        /// The receipt.
        digest: Digest,
        /// Its stage.
        stage: StageName,
        /// What is out of order.
        why: String,
    },
    /// The chain is longer than [`MAX_CHAIN`].
    #[error("the chain from {head} is longer than {MAX_CHAIN} receipts")]
    #[diagnostic(code(cordon::chain::too_long))]
    TooLong {
        /// Its head.
        head: Digest,
    },
}

impl crate::exit::ExitClass for ChainError {
    /// A receipt the store does not hold, or a chain out of order, under another authority or
    /// not `ok`, is an input-wiring error (2); a store that cannot be read, or a stored receipt
    /// that is unreadable or does not hash to its name, is a no-decision (3): the store itself
    /// is in doubt.
    fn exit_class(&self) -> crate::ExitCode {
        match self {
            Self::Missing {
                source: StoreError::Io { source, .. },
                ..
            } if source.kind() == std::io::ErrorKind::NotFound => crate::ExitCode::Usage,
            Self::Missing { .. }
            | Self::Unreadable { .. }
            | Self::Tampered { .. }
            | Self::NotCanonical { .. } => crate::ExitCode::NoDecision,
            Self::NotOk { .. }
            | Self::ForeignAuthority { .. }
            | Self::Order { .. }
            | Self::TooLong { .. } => crate::ExitCode::Usage,
        }
    }
}

/// Load the receipt stored as `digest`, re-hashing it.
///
/// # Errors
/// Not in the store, not a receipt, or its bytes hash to another digest.
pub fn load(store: &Store, digest: &Digest) -> Result<Receipt, ChainError> {
    let bytes = store
        .read_document("receipts", &format!("{}.json", digest.hex()))
        .map_err(|source| ChainError::Missing {
            digest: *digest,
            source,
        })?;
    let unreadable = |source| ChainError::Unreadable {
        digest: *digest,
        source,
    };
    let text =
        std::str::from_utf8(&bytes).map_err(|_| ChainError::NotCanonical { digest: *digest })?;
    let receipt = Receipt::parse(text).map_err(unreadable)?;
    let found = receipt.digest().map_err(unreadable)?;
    if found != *digest {
        return Err(ChainError::Tampered {
            digest: *digest,
            found,
        });
    }
    // The digest is taken over the parsed receipt re-encoded: the bytes themselves must be that
    // encoding, or an edited file (a duplicated key, whose last value the parser keeps) would
    // pass under the original's name.
    if receipt.to_canonical_json().map_err(unreadable)?.as_bytes() != bytes.as_slice() {
        return Err(ChainError::NotCanonical { digest: *digest });
    }
    Ok(receipt)
}

/// Walk the chain whose head is `head` back to its start under `authority`: the receipts from
/// the head to the chain's first, each checked at its hop.
///
/// # Errors
/// The first hop that cannot be established.
pub fn walk(store: &Store, head: &Digest, authority: &Digest) -> Result<Vec<Receipt>, ChainError> {
    walk_from(store, head, authority, Outcome::Ok)
}

/// [`walk`] from a head that records a verdict (`rejected` or `no-decision`, or `ok`): the
/// chain a stage passes on. Below the head, a receipt that is not `ok` may stand only under
/// a pass-on receipt of the same outcome ([`Receipt::passes_on`]).
///
/// # Errors
/// The first hop that cannot be established.
pub fn walk_verdict(
    store: &Store,
    head: &Digest,
    authority: &Digest,
) -> Result<Vec<Receipt>, ChainError> {
    let r = load(store, head)?;
    walk_from(store, head, authority, r.outcome)
}

fn walk_from(
    store: &Store,
    head: &Digest,
    authority: &Digest,
    head_outcome: Outcome,
) -> Result<Vec<Receipt>, ChainError> {
    let mut out: Vec<Receipt> = Vec::new();
    let mut next = Some(*head);
    while let Some(digest) = next {
        if out.len() == MAX_CHAIN {
            return Err(ChainError::TooLong { head: *head });
        }
        let r = load(store, &digest)?;
        // What this receipt may record: the head's outcome for the head, its successor's for a
        // receipt a pass-on rests on, else an established result.
        let may = match out.last() {
            None => head_outcome,
            Some(successor) if successor.passes_on() => successor.outcome,
            Some(_) => Outcome::Ok,
        };
        if r.outcome != may {
            return Err(ChainError::NotOk {
                digest,
                stage: r.stage,
                outcome: r.outcome,
            });
        }
        if r.authority != *authority {
            return Err(ChainError::ForeignAuthority {
                digest,
                stage: r.stage,
                found: r.authority,
                expected: *authority,
            });
        }
        if let Some(successor) = out.last()
            && successor.stage.predecessor() != Some(r.stage)
        {
            return Err(ChainError::Order {
                digest,
                stage: r.stage,
                why: format!("cannot precede a {} receipt", successor.stage),
            });
        }
        next = match (r.stage.predecessor(), r.prev) {
            (Some(_), Some(prev)) => Some(prev),
            (None, None) => None,
            // An incumbent's registration starts role B's chain, as intake starts a candidate's.
            (Some(_), None) if starts_incumbent_chain(&r) => None,
            (Some(p), None) => {
                return Err(ChainError::Order {
                    digest,
                    stage: r.stage,
                    why: format!("names no {p} receipt before it"),
                });
            }
            (None, Some(_)) => {
                return Err(ChainError::Order {
                    digest,
                    stage: r.stage,
                    why: "starts a chain but names a receipt before it".into(),
                });
            }
        };
        out.push(r);
    }
    Ok(out)
}

/// Whether `r` is an incumbent's registration: a materialize receipt with no predecessor and
/// [`IncumbentOutputs`], the one other receipt a chain may start at.
#[must_use]
pub fn starts_incumbent_chain(r: &Receipt) -> bool {
    r.prev.is_none() && r.outputs_as::<IncumbentOutputs>().is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exit::ExitClass;

    fn put(store: &Store, r: &Receipt) -> Digest {
        let d = r.digest().unwrap();
        let text = r.to_canonical_json().unwrap();
        store
            .put_document("receipts", &format!("{}.json", d.hex()), text.as_bytes())
            .unwrap();
        d
    }

    fn receipt(stage: StageName, authority: Digest, prev: Option<Digest>) -> Receipt {
        let mut r = Receipt::new(stage, authority, Outcome::Ok);
        r.prev = prev;
        r
    }

    /// fetch → materialize → prebuild under `a`, stored; returns the digests.
    fn chain(store: &Store, a: Digest) -> [Digest; 3] {
        let f = put(store, &receipt(StageName::Fetch, a, None));
        let m = put(store, &receipt(StageName::Materialize, a, Some(f)));
        let p = put(store, &receipt(StageName::Prebuild, a, Some(m)));
        [f, m, p]
    }

    #[test]
    fn a_whole_chain_walks_back_to_intake() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("store")).unwrap();
        let a = Digest::of_bytes(b"a");
        let [f, _, p] = chain(&store, a);
        let walked = walk(&store, &p, &a).unwrap();
        let stages: Vec<StageName> = walked.iter().map(|r| r.stage).collect();
        assert_eq!(
            stages,
            [
                StageName::Prebuild,
                StageName::Materialize,
                StageName::Fetch
            ]
        );
        assert_eq!(walk(&store, &f, &a).unwrap().len(), 1);
    }

    #[test]
    fn an_incumbent_registration_starts_a_chain_and_a_delta_without_intake_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("store")).unwrap();
        let a = Digest::of_bytes(b"a");
        let mut registration = receipt(StageName::Materialize, a, None);
        registration
            .set_outputs(&IncumbentOutputs {
                tree_digest: Digest::of_bytes(b"tree"),
                incumbent: "engine".into(),
                step: Some("build-native".into()),
                files: 1,
                bytes: 1,
            })
            .unwrap();
        let r = put(&store, &registration);
        let p = put(&store, &receipt(StageName::Prebuild, a, Some(r)));
        let walked = walk(&store, &p, &a).unwrap();
        assert_eq!(walked.len(), 2);
        assert!(starts_incumbent_chain(walked.last().unwrap()));
        // The same outputs after a fetch are not a registration: nothing starts mid-chain.
        let [f, ..] = chain(&store, a);
        registration.prev = Some(f);
        assert!(!starts_incumbent_chain(&registration));
    }

    #[test]
    fn every_broken_hop_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("store")).unwrap();
        let a = Digest::of_bytes(b"a");
        let b = Digest::of_bytes(b"b");
        let [f, m, p] = chain(&store, a);
        // Another authority, at the head or in the middle.
        assert!(matches!(
            walk(&store, &p, &b),
            Err(ChainError::ForeignAuthority { .. })
        ));
        let foreign_m = put(&store, &receipt(StageName::Materialize, b, Some(f)));
        let head = put(&store, &receipt(StageName::Prebuild, a, Some(foreign_m)));
        assert!(matches!(
            walk(&store, &head, &a),
            Err(ChainError::ForeignAuthority {
                stage: StageName::Materialize,
                ..
            })
        ));
        // A prebuild directly over a fetch: out of order.
        let skip = put(&store, &receipt(StageName::Prebuild, a, Some(f)));
        assert!(matches!(
            walk(&store, &skip, &a),
            Err(ChainError::Order { .. })
        ));
        // A materialize that names nothing before it does not reach intake.
        let orphan = put(&store, &receipt(StageName::Materialize, a, None));
        let head = put(&store, &receipt(StageName::Prebuild, a, Some(orphan)));
        assert!(matches!(
            walk(&store, &head, &a),
            Err(ChainError::Order { .. })
        ));
        // A fetch that names a predecessor.
        let odd = put(&store, &receipt(StageName::Fetch, a, Some(m)));
        assert!(matches!(
            walk(&store, &odd, &a),
            Err(ChainError::Order { .. })
        ));
        // A receipt the store does not hold.
        let absent = receipt(StageName::Prebuild, a, Some(m)).digest().unwrap();
        let missing = walk(&store, &Digest::of_bytes(b"nothing"), &a);
        assert!(matches!(missing, Err(ChainError::Missing { .. })));
        assert!(matches!(
            walk(&store, &absent, &a),
            Err(ChainError::Missing { .. })
        ));
        // A rejected receipt (were one ever stored) does not continue a chain.
        let mut rejected = receipt(StageName::Materialize, a, Some(f));
        rejected.outcome = Outcome::Rejected;
        let rejected = put(&store, &rejected);
        let head = put(&store, &receipt(StageName::Prebuild, a, Some(rejected)));
        assert!(matches!(
            walk(&store, &head, &a),
            Err(ChainError::NotOk { .. })
        ));
    }

    #[test]
    fn a_verdict_walks_back_through_its_pass_ons_and_nothing_else_rests_on_one() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("store")).unwrap();
        let a = Digest::of_bytes(b"a");
        let mut fetch = receipt(StageName::Fetch, a, None);
        fetch.outcome = Outcome::Rejected;
        let f = put(&store, &fetch);
        let materialize = Receipt::pass_on(StageName::Materialize, &fetch, f);
        assert!(materialize.passes_on());
        let m = put(&store, &materialize);
        let prebuild = Receipt::pass_on(StageName::Prebuild, &materialize, m);
        let p = put(&store, &prebuild);
        assert_eq!(walk_verdict(&store, &p, &a).unwrap().len(), 3);
        // Not as an established chain.
        assert!(matches!(
            walk(&store, &p, &a),
            Err(ChainError::NotOk { .. })
        ));
        // A pass-on that changes the outcome, or a receipt that is not a pass-on, over a
        // verdict: refused.
        let mut flipped = Receipt::pass_on(StageName::Prebuild, &materialize, m);
        flipped.outcome = Outcome::NoDecision;
        let flipped = put(&store, &flipped);
        assert!(matches!(
            walk_verdict(&store, &flipped, &a),
            Err(ChainError::NotOk { .. })
        ));
        let mut own = receipt(StageName::Prebuild, a, Some(m));
        own.outcome = Outcome::Rejected;
        own.reasons.push(crate::receipt::Reason {
            code: "prebuild.exit".into(),
            message: "m".into(),
        });
        assert!(!own.passes_on());
        let own = put(&store, &own);
        assert!(matches!(
            walk_verdict(&store, &own, &a),
            Err(ChainError::NotOk { .. })
        ));
        // A verdict head the store does not hold is refused as any forged receipt is.
        let absent = Receipt::pass_on(StageName::Lane, &prebuild, p)
            .digest()
            .unwrap();
        let e = walk_verdict(&store, &absent, &a).unwrap_err();
        assert_eq!(e.exit_class(), crate::ExitCode::Usage);
    }

    #[test]
    fn a_stored_receipt_that_does_not_hash_to_its_name_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("store")).unwrap();
        let a = Digest::of_bytes(b"a");
        let real = receipt(StageName::Fetch, a, None);
        let other = Digest::of_bytes(b"not its digest");
        store
            .put_document(
                "receipts",
                &format!("{}.json", other.hex()),
                real.to_canonical_json().unwrap().as_bytes(),
            )
            .unwrap();
        let tampered = load(&store, &other).unwrap_err();
        assert!(matches!(tampered, ChainError::Tampered { .. }));
        assert_eq!(tampered.exit_class(), crate::ExitCode::NoDecision);
        let missing = load(&store, &Digest::of_bytes(b"absent")).unwrap_err();
        assert_eq!(missing.exit_class(), crate::ExitCode::Usage);
        // A receipt the store holds but cannot open (here a symbolic link under its name: the
        // no-follow open fails with ELOOP) is not "absent": the store is in doubt, a no-decision.
        let odd = Digest::of_bytes(b"odd");
        let name = format!("{}.json", odd.hex());
        std::os::unix::fs::symlink("/etc/hostname", store.root().join("receipts").join(name))
            .unwrap();
        let unreadable = load(&store, &odd).unwrap_err();
        assert!(
            matches!(&unreadable, ChainError::Missing { source: StoreError::Io { source, .. }, .. } if source.kind() != std::io::ErrorKind::NotFound),
            "{unreadable:?}"
        );
        assert_eq!(unreadable.exit_class(), crate::ExitCode::NoDecision);
        // The original's bytes, edited so they still parse and hash to its name: a key twice
        // (the parser keeps the last), or a byte of white space.
        let mut original = receipt(StageName::Fetch, a, None);
        original.outputs = serde_json::json!({"files": 1});
        let d = put(&store, &original);
        let text = original.to_canonical_json().unwrap();
        assert!(text.contains(r#""outputs":{"files":1}"#), "{text}");
        let name = format!("{}.json", d.hex());
        for edited in [
            text.replacen(
                r#""outputs":{"files":1}"#,
                r#""outputs":{"files":999,"files":1}"#,
                1,
            ),
            format!("{text} "),
        ] {
            let path = store.root().join("receipts").join(&name);
            std::fs::remove_file(&path).unwrap();
            store
                .put_document("receipts", &name, edited.as_bytes())
                .unwrap();
            let e = load(&store, &d).unwrap_err();
            assert!(
                matches!(e, ChainError::NotCanonical { .. }),
                "{edited}: {e:?}"
            );
            assert_eq!(e.exit_class(), crate::ExitCode::NoDecision);
        }
        store
            .put_document(
                "receipts",
                &format!("{}.json", Digest::of_bytes(b"x").hex()),
                b"{",
            )
            .unwrap();
        assert!(matches!(
            load(&store, &Digest::of_bytes(b"x")),
            Err(ChainError::Unreadable { .. })
        ));
    }
}
