//! Registration of incumbents and materialization of one delta over one incumbent.
//!
//! Materialization is parse → plan → apply: read the incumbent's record and manifest and the
//! delta's intake record and manifest; run the tree guard and the Python AST policy on every
//! delta file, collecting every finding; only when there are none, write the rewritten files
//! and the target shim as content objects and publish the tree. The result is the incumbent
//! with exactly the one target replaced: every other entry is the incumbent's own, linked, not
//! copied, so the cost grows with the delta, not with the incumbent.
//!
//! For a Python target the candidate's package lives at the top-level namespace
//! `cordon_c_<12 hex of the delta digest>` (so it can never shadow an incumbent or standard
//! module), its own absolute imports are renamed to it, and the target's path holds a generated
//! `__init__.py` that makes the registered import name resolve to it.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cordon::canonical::Digest;
use cordon::intake::IntakeRecord;
use cordon::store::{Store, StoreError};
use cordon::tree::{self, Entry, TreeError, TreeRecord};
use cordon::walk::{Kind, Node, WalkError, walk};
use cordon_policy_lang::{BuildTier, TreeRules};
use serde_json::json;

use crate::analysis;
use crate::guard::{self, FileFacts, Finding, Position};
use crate::manifest::{self, DELTA_MANIFEST, INCUMBENT_MANIFEST, Target};
use crate::python::{self, PyRules};

/// Why materialization or registration produced no tree.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum MaterializeError {
    /// The delta breaks a rule: the candidate's fault (exit 1). Every finding is listed.
    #[error("the delta is rejected with {} finding(s)", .0.len())]
    #[diagnostic(code(cordon::materialize::rejected))]
    Rejected(Vec<Finding>, Vec<(String, Arc<String>)>),
    /// The incumbent directory given by the operator is not admissible (exit 2).
    #[error("incumbent {path}: {why}")]
    #[diagnostic(code(cordon::materialize::incumbent))]
    Incumbent {
        /// The path concerned.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// The incumbent's manifest, given by the operator, does not decode (exit 2): every
    /// problem, labelled on the manifest.
    #[error(transparent)]
    #[diagnostic(transparent)]
    IncumbentManifest(cordon_policy_lang::KdlError),
    /// The store failed (exit 3).
    #[error(transparent)]
    #[diagnostic(transparent)]
    Store(#[from] StoreError),
    /// The delta's intake record is missing or corrupt (exit 3).
    #[error(transparent)]
    #[diagnostic(transparent)]
    Intake(#[from] cordon::intake::IntakeError),
    /// A tree is missing or corrupt (exit 3).
    #[error(transparent)]
    #[diagnostic(transparent)]
    Tree(#[from] TreeError),
    /// A thread for the Python checks could not be started (exit 3).
    #[error("cannot start a thread for the python checks")]
    #[diagnostic(code(cordon::materialize::worker))]
    Worker {
        /// Why the thread was refused.
        #[source]
        source: std::io::Error,
    },
    /// The confined analysis child could not be started or confined, or was killed from
    /// outside (exit 3).
    #[error("the confined analysis failed: {0}")]
    #[diagnostic(code(cordon::materialize::child))]
    Child(String),
    /// The analysis child's lease could not be made or released (exit 3).
    #[error(transparent)]
    #[diagnostic(transparent)]
    Lease(#[from] cordon::lease::LeaseError),
    /// The receipt's outputs could not be encoded (exit 3).
    #[error(transparent)]
    #[diagnostic(transparent)]
    Receipt(#[from] cordon::receipt::ReceiptError),
}

impl cordon_stage::receipt_io::Infrastructure for MaterializeError {
    fn reason_code(&self) -> &'static str {
        "materialize.infrastructure"
    }
}

/// The finding for an analysis child that broke on the delta: crashed, exceeded its limits or
/// its deadline, tripped its seccomp filter, or answered what it could not honestly answer.
#[must_use]
pub fn parser_finding(why: impl std::fmt::Display) -> Finding {
    Finding::file(
        "tree.parser",
        DELTA_MANIFEST,
        format!("the confined parser failed on the delta: {why}"),
    )
}

/// A published candidate tree and what it is made of.
#[derive(Debug, Clone)]
pub struct Materialized {
    /// The tree record.
    pub record: TreeRecord,
    /// The delta's content digest.
    pub delta: Digest,
    /// The target replaced.
    pub target: String,
    /// The namespace, for Python targets.
    pub namespace: Option<String>,
    /// The build step the delta asks for.
    pub step: Option<String>,
}

/// Register an incumbent tree from a directory: walk it without following links, copy every
/// file into the store as a content object, publish the tree.
///
/// # Errors
/// The directory or its manifest is not admissible, or the store failed.
pub fn register_incumbent(
    store: &Store,
    dir: &Path,
    rules: &TreeRules,
) -> Result<TreeRecord, MaterializeError> {
    let bad = |path: &Path, why: String| MaterializeError::Incumbent {
        path: path.to_path_buf(),
        why,
    };
    // The likeliest mistakes first, each saying what to give instead.
    if !dir.is_dir() {
        return Err(bad(
            dir,
            "not a directory: give the incumbent's directory (the example's is checks/example/incumbent in the checkout; a relative path is from the current directory)".into(),
        ));
    }
    if dir.join(DELTA_MANIFEST).exists() && !dir.join(INCUMBENT_MANIFEST).exists() {
        return Err(bad(
            dir,
            format!(
                "this is a candidate's delta ({DELTA_MANIFEST}), not an incumbent: pack it as a tar and admit it with cordon-fetch, then pipe its receipt to cordon-materialize"
            ),
        ));
    }
    let manifest_path = dir.join(INCUMBENT_MANIFEST);
    let text = fs::read_to_string(&manifest_path).map_err(|e| {
        bad(
            &manifest_path,
            format!("cannot read the manifest: {e} (an incumbent's directory holds {INCUMBENT_MANIFEST} at its top)"),
        )
    })?;
    let incumbent = manifest::incumbent(&text).map_err(MaterializeError::IncumbentManifest)?;
    let mut entries = Vec::new();
    let mut total = 0u64;
    let mut batch = store.batch()?;
    let mut admit = |n: &Node<'_>| -> Result<(), Unfit> {
        let unfit = |why: String| Unfit::Bad(n.path.to_owned(), why);
        match n.stat.kind {
            Kind::Dir => return Ok(()),
            Kind::File if n.stat.mode & 0o7000 != 0 => {
                return Err(unfit("a setuid, setgid or sticky bit is set".into()));
            }
            Kind::File => {}
            Kind::Symlink | Kind::Fifo | Kind::Socket | Kind::Device => {
                return Err(unfit(
                    "only regular files and directories are admitted".into(),
                ));
            }
        }
        if entries.len() as u64 >= rules.max_files {
            return Err(Unfit::Bad(
                String::new(),
                format!("more than {} files", rules.max_files),
            ));
        }
        if n.stat.size > rules.max_file_bytes {
            return Err(unfit(format!("larger than {} bytes", rules.max_file_bytes)));
        }
        total += n.stat.size;
        if total > rules.max_total_bytes {
            return Err(Unfit::Bad(
                String::new(),
                format!("larger than {} bytes", rules.max_total_bytes),
            ));
        }
        let executable = n.stat.mode & 0o111 != 0;
        // The file read is the inode examined: opened without following, checked again.
        let (sha, size) = batch.add_reader(n.open()?, executable)?;
        entries.push(Entry {
            path: n.path.to_owned(),
            mode: if executable { 0o555 } else { 0o444 },
            size,
            sha256: sha,
        });
        Ok(())
    };
    match walk(dir, &mut admit) {
        Ok(()) => {}
        Err(Unfit::Bad(rel, why)) if rel.is_empty() => return Err(bad(dir, why)),
        Err(Unfit::Bad(rel, why)) => return Err(bad(&dir.join(rel), why)),
        Err(Unfit::Store(e)) => return Err(e.into()),
    }
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    for target in incumbent.targets.values() {
        let p = dir.join(&target.path);
        if !fs::symlink_metadata(&p).is_ok_and(|m| m.is_dir()) {
            return Err(bad(
                &p,
                format!("target {:?} is not a directory", target.name),
            ));
        }
    }
    batch.commit()?;
    let origin = json!({
        "kind": "incumbent",
        "name": incumbent.name,
        "targets": incumbent.targets.values().collect::<Vec<_>>(),
        "build": incumbent.step,
    });
    Ok(tree::publish(store, entries, origin)?)
}

/// Why an incumbent directory cannot be registered: one of its entries (by relative path, `""`
/// for the directory as a whole) is not admissible, or the store failed.
enum Unfit {
    Bad(String, String),
    Store(StoreError),
}

impl From<WalkError> for Unfit {
    fn from(e: WalkError) -> Self {
        let path = match &e {
            WalkError::Host { path, .. }
            | WalkError::Unreadable { path, .. }
            | WalkError::Changed { path }
            | WalkError::Mount { path }
            | WalkError::UnknownKind { path }
            | WalkError::Past { path, .. } => path.clone(),
            WalkError::NonUtf8 { dir } => dir.clone(),
        };
        Self::Bad(path, e.to_string())
    }
}

impl From<StoreError> for Unfit {
    fn from(e: StoreError) -> Self {
        Self::Store(e)
    }
}

/// The namespace of a delta: a name no incumbent or standard module has.
#[must_use]
pub fn namespace(delta: &Digest) -> String {
    format!("cordon_c_{}", &delta.hex()[..12])
}

/// The generated module at a Python target's path.
fn shim(target: &Target, namespace: &str, factory: Option<&str>) -> String {
    // The factory is named here so the tree's digest covers it: two deltas whose trees share
    // a digest share their factory too (a tree's origin record is descriptive, not covered).
    let factory = factory.map_or_else(String::new, |f| {
        format!("# The sealed-direct-artifact factory the compile child calls: {f}.\n")
    });
    format!(
        "# Generated by cordon-materialize; not candidate code.\n\
         # The registered import name {:?} of target {:?} resolves to the candidate's package,\n\
         # renamed to {namespace}.\n\
         {factory}\
         import sys\n\
         import {namespace} as _cordon_candidate\n\
         sys.modules[__name__] = _cordon_candidate\n",
        target.python.as_deref().unwrap_or(""),
        target.name
    )
}

fn under(path: &str, dir: &str) -> bool {
    path.len() > dir.len() && path.starts_with(dir) && path.as_bytes()[dir.len()] == b'/'
}

/// The incumbent's registered targets, from the manifest it carries (written by the operator
/// at registration, so a problem here is a corrupt tree, not a finding).
fn registered_targets(
    store: &Store,
    base: &TreeRecord,
    incumbent: &Digest,
) -> Result<manifest::Incumbent, MaterializeError> {
    let corrupt = |why: String| TreeError::Corrupt {
        digest: *incumbent,
        why,
    };
    let entry = base
        .entries
        .iter()
        .find(|e| e.path == INCUMBENT_MANIFEST)
        .ok_or_else(|| corrupt(format!("it has no {INCUMBENT_MANIFEST}")))?;
    let text = store.read_object(&entry.sha256, entry.executable())?;
    String::from_utf8(text)
        .ok()
        .and_then(|t| manifest::incumbent(&t).ok())
        .ok_or_else(|| corrupt(format!("its {INCUMBENT_MANIFEST} does not parse")).into())
}

/// The delta's manifest text: candidate-written, so every problem is a rejection.
fn delta_manifest(store: &Store, intake: &IntakeRecord) -> Result<String, MaterializeError> {
    let Some(file) = intake.files.iter().find(|f| f.path == DELTA_MANIFEST) else {
        return Err(reject(Finding::file(
            "tree.manifest",
            DELTA_MANIFEST,
            "the delta carries no manifest",
        )));
    };
    String::from_utf8(store.read_object(&file.sha256, file.executable)?)
        .map_err(|_| reject(Finding::file("tree.manifest", DELTA_MANIFEST, "not UTF-8")))
}

fn reject(f: Finding) -> MaterializeError {
    MaterializeError::Rejected(vec![f], Vec::new())
}

/// The candidate's sources a rejection's findings point into, by path.
type Sources = Vec<(String, Arc<String>)>;

/// path → its text, for every UTF-8 `.py` file of the delta; `None` for one that is not UTF-8.
type PythonTexts<'a> = BTreeMap<&'a str, Option<String>>;

/// What the analysis child is asked: the manifest and every UTF-8 Python source, with the
/// rules they are checked against.
fn analysis_request(
    intake: &IntakeRecord,
    rules: &TreeRules,
    registered: &manifest::Incumbent,
    manifest: &str,
    python_texts: &PythonTexts<'_>,
) -> analysis::Request {
    let local_cutlass = intake.files.iter().any(|f| {
        f.path
            .split('/')
            .any(|c| c == "cutlass" || c == "cutlass.py")
    });
    let rules = PyRules {
        ban_call: rules.ban_call.clone(),
        ban_import: rules.ban_import.clone(),
        ban_attribute_call: rules.ban_attribute_call.clone(),
        jit_entry_points: rules
            .jit_entry_points
            .iter()
            .filter_map(|e| e.rsplit_once('.'))
            .map(|(m, f)| (m.to_owned(), f.to_owned()))
            .collect(),
        local_cutlass,
    };
    analysis::Request {
        manifest: manifest.to_owned(),
        python_targets: registered
            .targets
            .iter()
            .map(|(name, t)| (name.clone(), t.python.is_some()))
            .collect(),
        namespace: namespace(&intake.content_digest),
        rules,
        files: python_texts
            .iter()
            .filter_map(|(path, text)| {
                Some(analysis::Source {
                    path: (*path).to_owned(),
                    text: text.clone()?,
                })
            })
            .collect(),
    }
}

/// The rejection for a delta manifest that does not decode: each problem a finding located on
/// the candidate's own manifest.
fn manifest_rejection(problems: Vec<analysis::Problem>, text: &str) -> MaterializeError {
    let findings = problems
        .into_iter()
        .map(|p| {
            let (at, label) = p
                .label
                .map_or((None, String::new()), |(label, start, end)| {
                    (Some(Position::of(text, start, end)), label)
                });
            Finding {
                code: "tree.manifest",
                path: DELTA_MANIFEST.to_owned(),
                at,
                label,
                message: format!("{} (cordon::manifest::{})", p.message, p.code),
            }
        })
        .collect();
    MaterializeError::Rejected(
        findings,
        vec![(DELTA_MANIFEST.to_owned(), Arc::new(text.to_owned()))],
    )
}

/// The registered target the delta names, else the rejection.
fn target_of<'a>(
    registered: &'a manifest::Incumbent,
    delta: &manifest::Delta,
) -> Result<&'a Target, MaterializeError> {
    registered.targets.get(&delta.target).ok_or_else(|| {
        reject(Finding::file(
            "tree.unknown-target",
            DELTA_MANIFEST,
            format!(
                "target {:?} is not registered by the incumbent (registered: {})",
                delta.target,
                registered
                    .targets
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ))
    })
}

/// The manifest's tier and step must name one registered patcher and its package must fit the
/// target (the rename itself is `analysis::rename_for`'s): the step that builds the delta, or
/// none for a delta with no native part.
fn check_manifest_fit(
    target: &Target,
    delta: &manifest::Delta,
    patchers: &BTreeMap<String, BuildTier>,
    findings: &mut Vec<Finding>,
) -> Option<String> {
    let mut finding = |code, why: String| findings.push(Finding::file(code, DELTA_MANIFEST, why));
    let step = match (&delta.step, delta.tier) {
        (None, None) => None,
        (Some(step), _) if !patchers.contains_key(step) => {
            finding(
                "tree.unknown-step",
                format!("step {step:?} is not a registered prebuild step of the policy"),
            );
            None
        }
        (Some(step), None) => {
            finding(
                "tree.tier-undeclared",
                format!(
                    "the delta asks for step {step:?} and declares no tier: write tier=\"{}\" (the tier whose patcher it is)",
                    patchers[step]
                ),
            );
            None
        }
        (Some(step), Some(tier)) if patchers[step] != tier => {
            finding(
                "tree.tier-mismatch",
                format!(
                    "the delta declares tier {tier:?} and step {step:?} is the patcher of tier {:?}",
                    patchers[step].as_str()
                ),
            );
            None
        }
        (Some(step), Some(_)) => Some(step.clone()),
        (None, Some(tier)) => {
            let step = patchers
                .iter()
                .find(|(_, t)| **t == tier)
                .map(|(s, _)| s.clone());
            if step.is_none() {
                finding(
                    "tree.tier-unregistered",
                    format!(
                        "the policy registers no patcher for tier {:?}",
                        tier.as_str()
                    ),
                );
            }
            step
        }
    };
    // What each tier builds from must be declared, and nothing another tier builds from: a
    // declaration no patcher reads would be a file reviewed as built and never built.
    let needs = [
        (
            BuildTier::NativeSources,
            !delta.native_sources.is_empty(),
            "native-source",
        ),
        (
            BuildTier::DependencyPatch,
            !delta.dependency_patches.is_empty(),
            "dependency-patch",
        ),
        (
            BuildTier::SealedDirectArtifact,
            delta.factory.is_some(),
            "factory",
        ),
    ];
    for (tier, declared, node) in needs {
        let ours = delta.tier == Some(tier)
            || (tier == BuildTier::NativeSources && delta.tier == Some(BuildTier::NativeRebuild));
        if declared && !ours {
            finding(
                "tree.tier-mismatch",
                format!(
                    "`{node}` belongs to tier {:?} and the delta declares {}",
                    tier.as_str(),
                    delta.tier.map_or_else(
                        || "no tier".to_owned(),
                        |t| format!("tier {:?}", t.as_str())
                    )
                ),
            );
        } else if !declared && delta.tier == Some(tier) {
            finding(
                "tree.tier-mismatch",
                format!(
                    "tier {:?} builds from its declared `{node}` and the manifest declares none",
                    tier.as_str()
                ),
            );
        }
    }
    match (&target.python, &delta.package) {
        (Some(_), Some(p)) if !p.contains('.') => {}
        (Some(_), _) => findings.push(Finding::file(
            "tree.manifest",
            DELTA_MANIFEST,
            format!(
                "target {:?} is a Python target: package= must name the delta's package (one identifier)",
                target.name
            ),
        )),
        (None, Some(_)) => findings.push(Finding::file(
            "tree.manifest",
            DELTA_MANIFEST,
            format!(
                "target {:?} is not a Python target; package= does not apply",
                target.name
            ),
        )),
        (None, None) => {}
    }
    // The compile child imports the factory from the tree: it must be in the delta's own
    // package of a Python target, which the tree holds renamed (a factory elsewhere would name
    // incumbent or standard code as the candidate's).
    if let Some(f) = &delta.factory {
        let why = match (&target.python, &delta.package) {
            (Some(_), Some(p)) if f.split(['.', ':']).next() == Some(p.as_str()) => None,
            (Some(_), Some(p)) => {
                Some(format!("factory {f:?} is not in the delta's package {p:?}"))
            }
            _ => Some(format!(
                "factory {f:?} needs a Python target and the delta's package= (it is imported from it)"
            )),
        };
        if let Some(why) = why {
            findings.push(Finding::file("tree.tier-mismatch", DELTA_MANIFEST, why));
        }
    }
    step
}

/// The declared factory as the tree holds it: its package renamed to the namespace `ns`
/// (checked in the package by [`check_manifest_fit`]).
fn factory_in_tree(delta: &manifest::Delta, ns: Option<&str>) -> Option<String> {
    let (factory, package, ns) = (delta.factory.as_ref()?, delta.package.as_ref()?, ns?);
    Some(format!("{ns}{}", &factory[package.len()..]))
}

/// One delta file's place in the new tree: its path, mode, digest, size, and its rewritten
/// contents when the rename changed it.
struct PlannedFile {
    dest: String,
    executable: bool,
    sha256: Digest,
    size: u64,
    rewritten: Option<String>,
}

/// The delta's files checked and placed: every finding goes to `findings`, the sources they
/// point into to the returned list.
struct Placement<'a> {
    store: &'a Store,
    rules: &'a TreeRules,
    target: &'a Target,
    delta: &'a manifest::Delta,
    namespace: &'a str,
    python_texts: &'a PythonTexts<'a>,
}

impl Placement<'_> {
    fn place(
        &self,
        files: &[&cordon::archive::Member],
        mut analysed: BTreeMap<&str, (Vec<python::Finding>, Option<String>)>,
        findings: &mut Vec<Finding>,
    ) -> Result<(Vec<PlannedFile>, Sources), MaterializeError> {
        let (target, ns) = (self.target, self.namespace);
        let rename = analysis::rename_for(target.python.is_some(), self.delta);
        let mut sources = Vec::new();
        let mut planned = Vec::new();
        for f in files {
            if !under(&f.path, &target.path) {
                findings.push(Finding::file(
                    "tree.outside-target",
                    &f.path,
                    format!(
                        "the delta may only change target {:?} ({}/)",
                        target.name, target.path
                    ),
                ));
                continue;
            }
            // A UTF-8 Python file was read for the analysis already; any other file is read
            // here.
            let read;
            let bytes: &[u8] = match self.python_texts.get(f.path.as_str()) {
                Some(Some(text)) => text.as_bytes(),
                _ => {
                    read = self.store.read_object(&f.sha256, f.executable)?;
                    &read
                }
            };
            guard::check_file(
                &FileFacts {
                    path: &f.path,
                    executable: f.executable,
                    size: f.size,
                    head: &bytes[..bytes.len().min(16)],
                },
                self.delta,
                self.rules,
                findings,
            );
            let rel = &f.path[target.path.len() + 1..];
            let dest = match (&target.python, rename.is_some()) {
                (Some(_), true) => format!("{ns}/{rel}"),
                _ => f.path.clone(),
            };
            let mut rewritten = None;
            match self.python_texts.get(f.path.as_str()) {
                Some(None) => findings.push(Finding::file(
                    "python.encoding",
                    &f.path,
                    "the file is not UTF-8",
                )),
                Some(Some(text)) => {
                    let (found, new_text) = analysed.remove(f.path.as_str()).unwrap_or_default();
                    let source = Arc::new(text.clone());
                    if !found.is_empty() {
                        sources.push((f.path.clone(), source.clone()));
                    }
                    for pf in found {
                        findings.push(Finding {
                            code: pf.code,
                            path: f.path.clone(),
                            at: Some(Position::of(&source, pf.start, pf.end)),
                            label: pf.label,
                            message: pf.message,
                        });
                    }
                    rewritten = new_text;
                }
                None => {}
            }
            planned.push(PlannedFile {
                dest,
                executable: self.delta.executables.contains(&f.path),
                sha256: f.sha256,
                size: f.size,
                rewritten,
            });
        }
        Ok((planned, sources))
    }
}

/// Bounds over the resulting tree: its file count and total size.
fn check_bounds(
    kept: &[&Entry],
    planned: &[PlannedFile],
    rules: &TreeRules,
    target: &Target,
    findings: &mut Vec<Finding>,
) {
    let count = kept.len() + planned.len() + 1;
    if count as u64 > rules.max_files {
        findings.push(Finding::file(
            "tree.too-many-files",
            &target.path,
            format!("the tree would hold more than {} files", rules.max_files),
        ));
    }
    let total: u64 =
        kept.iter().map(|e| e.size).sum::<u64>() + planned.iter().map(|p| p.size).sum::<u64>();
    if total > rules.max_total_bytes {
        findings.push(Finding::file(
            "tree.too-big",
            &target.path,
            format!("the tree would exceed {} bytes", rules.max_total_bytes),
        ));
    }
}

/// Apply: new objects for rewritten files, mode variants, the shim (naming the tree's
/// `factory`, when the delta declares one), in one store batch; the new tree's entries, and
/// the namespace the shim re-exports.
fn apply(
    store: &Store,
    mut entries: Vec<Entry>,
    planned: Vec<PlannedFile>,
    target: &Target,
    (ns, factory): (String, Option<&str>),
) -> Result<(Vec<Entry>, Option<String>), MaterializeError> {
    let mut batch = store.batch()?;
    for p in planned {
        let (sha256, size) = match p.rewritten {
            Some(text) => batch.add_reader(text.as_bytes(), p.executable)?,
            None => {
                batch.ensure_variant(&p.sha256, p.executable)?;
                (p.sha256, p.size)
            }
        };
        entries.push(Entry {
            path: p.dest,
            mode: if p.executable { 0o555 } else { 0o444 },
            size,
            sha256,
        });
    }
    let namespace = if target.python.is_some() {
        let text = shim(target, &ns, factory);
        let (sha256, size) = batch.add_reader(text.as_bytes(), false)?;
        entries.push(Entry {
            path: format!("{}/__init__.py", target.path),
            mode: 0o444,
            size,
            sha256,
        });
        Some(ns)
    } else {
        None
    };
    batch.commit()?;
    Ok((entries, namespace))
}

/// Materialize the delta of `intake` over the incumbent tree `incumbent`.
///
/// # Errors
/// [`MaterializeError::Rejected`] with every finding; the other variants for infrastructure.
pub fn materialize(
    store: &Store,
    incumbent: &Digest,
    intake: &IntakeRecord,
    rules: &TreeRules,
    patchers: &BTreeMap<String, BuildTier>,
    analyze: &dyn Fn(&analysis::Request) -> Result<analysis::Answer, MaterializeError>,
) -> Result<Materialized, MaterializeError> {
    let base = tree::load(store, incumbent)?;
    let registered = registered_targets(store, &base, incumbent)?;
    let delta_text = delta_manifest(store, intake)?;
    // Every candidate-written file a parser reads — the manifest and the Python sources — is
    // analysed by `analyze` (a confined child in production), and its answer checked here.
    let mut python_texts: PythonTexts<'_> = BTreeMap::new();
    for f in intake.files.iter().filter(|f| f.path.ends_with(".py")) {
        let bytes = store.read_object(&f.sha256, f.executable)?;
        python_texts.insert(&f.path, String::from_utf8(bytes).ok());
    }
    let request = analysis_request(intake, rules, &registered, &delta_text, &python_texts);
    let answer = analyze(&request)?;
    let accepted = analysis::accept(&request, answer).map_err(|why| reject(parser_finding(why)))?;
    let delta = accepted
        .manifest
        .map_err(|problems| manifest_rejection(problems, &delta_text))?;
    let analysed = request
        .files
        .iter()
        .map(|s| s.path.as_str())
        .zip(accepted.files)
        .collect();
    let target = target_of(&registered, &delta)?;
    let mut findings = Vec::new();
    let step = check_manifest_fit(target, &delta, patchers, &mut findings);
    let files: Vec<_> = intake
        .files
        .iter()
        .filter(|f| f.path != DELTA_MANIFEST)
        .collect();
    let carried: BTreeSet<&str> = files.iter().map(|f| f.path.as_str()).collect();
    guard::check_declarations(&delta, &|p| carried.contains(p), rules, &mut findings);
    let ns = request.namespace.clone();
    let (planned, sources) = Placement {
        store,
        rules,
        target,
        delta: &delta,
        namespace: &ns,
        python_texts: &python_texts,
    }
    .place(&files, analysed, &mut findings)?;
    if files.is_empty() {
        findings.push(Finding::file(
            "tree.empty-delta",
            DELTA_MANIFEST,
            format!("the delta carries no file for target {:?}", target.name),
        ));
    }
    let kept: Vec<&Entry> = base
        .entries
        .iter()
        .filter(|e| !under(&e.path, &target.path) && e.path != target.path)
        .collect();
    if kept.iter().any(|e| e.path == ns || under(&e.path, &ns)) {
        return Err(TreeError::Corrupt {
            digest: *incumbent,
            why: format!("the incumbent already holds {ns}"),
        }
        .into());
    }
    check_bounds(&kept, &planned, rules, target, &mut findings);
    if !findings.is_empty() {
        return Err(MaterializeError::Rejected(findings, sources));
    }
    let kept = kept.into_iter().cloned().collect();
    let factory = factory_in_tree(&delta, Some(&ns));
    let (entries, namespace) = apply(store, kept, planned, target, (ns, factory.as_deref()))?;
    let origin = json!({
        "kind": "candidate",
        "incumbent": incumbent,
        "delta": intake.content_digest,
        "target": target.name,
        "namespace": namespace,
        "step": step,
        "tier": delta.tier,
        // What the sealed-direct-artifact patcher imports and calls (the request's factory).
        "factory": factory,
    });
    let record = tree::publish(store, entries, origin)?;
    Ok(Materialized {
        record,
        delta: intake.content_digest,
        target: target.name.clone(),
        namespace,
        step,
    })
}
