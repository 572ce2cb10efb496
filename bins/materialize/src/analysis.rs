//! The candidate-facing half of materialization as one request and one answer, so that it runs
//! in a confined child (REQ-117): decoding the delta's KDL manifest and the Python AST policy
//! with its rename, the two parsers a hostile delta aims at.
//!
//! The root parent builds a [`Request`] from what it has already read from the store (the
//! manifest text, every UTF-8 `.py` file of the delta, the rules, the namespace, which
//! incumbent targets are Python), the child answers with [`respond`], and the parent checks the
//! [`Answer`] with [`accept`] before it uses any of it: every finding's code is one the checks
//! use and its range lies on the file, every rewrite edit is a rename's own
//! ([`python::apply`]), the package is a dotted Python name, the answer covers exactly the
//! files asked about. An answer that fails a check is the child's fault on candidate input.
//!
//! What the parent cannot check is the absence of a finding: a parser subverted by its input
//! can stay silent about that input. The confinement bounds what such a child can do to the
//! host, not what it says about the file that subverted it; the container boundary that runs
//! the tree stays the control that holds either way.

use std::collections::BTreeMap;

use cordon::text::printable;
use serde::{Deserialize, Serialize};

use crate::manifest::{self, Delta};
use crate::python::{self, Edit, PyRules, Rename};

/// The dispatch key of the analysis child.
pub const ANALYSIS_CHILD: &str = "delta-analysis";

/// One file to analyse.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Source {
    /// Its path in the delta.
    pub path: String,
    /// Its text.
    pub text: String,
}

/// What the child is asked.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request {
    /// The delta manifest's text.
    pub manifest: String,
    /// Every incumbent target by name: whether it is a Python target.
    pub python_targets: BTreeMap<String, bool>,
    /// The candidate's namespace.
    pub namespace: String,
    /// The AST policy.
    pub rules: PyRules,
    /// The delta's Python files.
    pub files: Vec<Source>,
}

/// One problem with the manifest, located on it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Problem {
    /// The manifest diagnostic's short code ([`manifest::CODES`]).
    pub code: String,
    /// The sentence.
    pub message: String,
    /// The label, and the byte range it marks.
    pub label: Option<(String, usize, usize)>,
}

/// One Python finding, as the child reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reported {
    /// Its code ([`python::CODES`]).
    pub code: String,
    /// Byte range.
    pub start: usize,
    /// End of the byte range.
    pub end: usize,
    /// The label.
    pub label: String,
    /// The sentence.
    pub message: String,
}

/// What the child found in one file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileAnswer {
    /// Its findings.
    pub findings: Vec<Reported>,
    /// The rename's edits.
    pub edits: Vec<Edit>,
}

/// The child's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Answer {
    /// The decoded manifest, or its problems (then no file is analysed).
    pub manifest: Result<Delta, Vec<Problem>>,
    /// One answer per requested file, in order.
    pub files: Vec<FileAnswer>,
}

/// The package rename a delta asks for: its `package=` when the target is a Python target and
/// the package is one identifier. The child and the parent decide it with this one rule.
#[must_use]
pub fn rename_for(python_target: bool, delta: &Delta) -> Option<&str> {
    match (python_target, &delta.package) {
        (true, Some(p)) if !p.contains('.') => Some(p),
        _ => None,
    }
}

/// The rename `request` and its decoded manifest call for ([`rename_for`] on the target's kind).
fn rename<'a>(request: &'a Request, delta: &'a Delta) -> Option<Rename<'a>> {
    let python_target = request
        .python_targets
        .get(&delta.target)
        .copied()
        .unwrap_or(false);
    rename_for(python_target, delta).map(|package| Rename {
        package,
        namespace: &request.namespace,
    })
}

/// Answer a request: what the child runs once confined (and what tests run in process).
///
/// # Errors
/// A thread for the checks could not be started.
pub fn respond(request: &Request) -> std::io::Result<Answer> {
    let delta = match manifest::delta(&request.manifest) {
        Ok(d) => d,
        Err(e) => {
            let problems = e
                .problems()
                .iter()
                .map(|p| Problem {
                    code: p.short_code().to_owned(),
                    message: p.message().to_owned(),
                    label: p.primary().map(|(span, label)| {
                        (label.to_owned(), span.offset(), span.offset() + span.len())
                    }),
                })
                .collect();
            return Ok(Answer {
                manifest: Err(problems),
                files: Vec::new(),
            });
        }
    };
    let rename = rename(request, &delta);
    let check = |s: &Source| {
        let c = python::check(&s.text, &s.path, &request.rules, rename);
        FileAnswer {
            findings: c
                .findings
                .into_iter()
                .map(|f| Reported {
                    code: f.code.to_owned(),
                    start: f.start,
                    end: f.end,
                    label: f.label,
                    message: f.message,
                })
                .collect(),
            edits: c.edits,
        }
    };
    Ok(Answer {
        files: on_two_threads(&request.files, check)?,
        manifest: Ok(delta),
    })
}

/// `check` over `files` on two threads, each with the stack the Python check needs for any
/// input: parsing dominates the cost of a Python-heavy delta, and files are independent.
fn on_two_threads(
    files: &[Source],
    check: impl Fn(&Source) -> FileAnswer + Sync,
) -> std::io::Result<Vec<FileAnswer>> {
    let (first, second) = files.split_at(files.len().div_ceil(2));
    let check = &check;
    std::thread::scope(|scope| {
        let run = |part: &[Source]| part.iter().map(check).collect::<Vec<_>>();
        let start = |part| {
            std::thread::Builder::new()
                .name("python-policy".into())
                .stack_size(python::STACK_BYTES)
                .spawn_scoped(scope, move || run(part))
        };
        let (one, two) = (start(first)?, start(second)?);
        // A panicking parser thread is a defect in the parser, not a verdict: it propagates
        // (in the child, a crash the parent judges).
        let mut all = one.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
        all.extend(two.join().unwrap_or_else(|p| std::panic::resume_unwind(p)));
        Ok(all)
    })
}

/// The child's work, after it confined itself: answer the one request on stdin. A thread
/// that cannot start is not the candidate's doing: the child exits as unconfined would.
#[must_use]
pub fn child_main() -> i32 {
    let mut status = None;
    let code = cordon::confine::answer(|bytes| {
        let Ok(request) = serde_json::from_slice::<Request>(&bytes) else {
            return Vec::new();
        };
        match respond(&request) {
            Ok(answer) => serde_json::to_vec(&answer).unwrap_or_default(),
            Err(_) => {
                status = Some(cordon::confine::UNCONFINED_EXIT);
                Vec::new()
            }
        }
    });
    status.unwrap_or(code)
}

/// An answer the parent has checked.
#[derive(Debug)]
pub struct Accepted {
    /// The decoded manifest, or its problems (each with a code of [`manifest::CODES`] and a
    /// range on the manifest).
    pub manifest: Result<Delta, Vec<Problem>>,
    /// Per requested file: its findings and its rewritten text, if the rename changed it.
    pub files: Vec<(Vec<python::Finding>, Option<String>)>,
}

fn in_range(text: &str, start: usize, end: usize) -> bool {
    start <= end && text.is_char_boundary(start) && text.is_char_boundary(end) && end <= text.len()
}

/// Check `answer` against `request` (see the module docs).
///
/// # Errors
/// The first thing in it that the child could not have produced honestly.
pub fn accept(request: &Request, answer: Answer) -> Result<Accepted, String> {
    let delta = match answer.manifest {
        Err(mut problems) => {
            for p in &mut problems {
                p.message = printable(&p.message).into_owned();
                if let Some((label, _, _)) = &mut p.label {
                    *label = printable(label).into_owned();
                }
                if !manifest::CODES.iter().any(|(c, _)| *c == p.code) {
                    return Err(format!(
                        "manifest problem code {:?} is not one the decoder uses",
                        p.code
                    ));
                }
                if let Some((_, start, end)) = &p.label
                    && !in_range(&request.manifest, *start, *end)
                {
                    return Err(format!(
                        "a manifest problem's range {start}..{end} is not on the manifest"
                    ));
                }
            }
            if problems.is_empty() || !answer.files.is_empty() {
                return Err(
                    "a manifest that does not decode has no problems, or files were analysed"
                        .into(),
                );
            }
            return Ok(Accepted {
                manifest: Err(problems),
                files: Vec::new(),
            });
        }
        Ok(delta) => delta,
    };
    if let Some(p) = &delta.package
        && !manifest::is_python_name(p)
    {
        return Err(format!("package {p:?} is not a dotted Python name"));
    }
    if let Some(f) = &delta.factory
        && !manifest::is_factory(f)
    {
        return Err(format!(
            "factory {} is not `dotted.module:callable`",
            printable(f)
        ));
    }
    if answer.files.len() != request.files.len() {
        return Err(format!(
            "{} files were asked about and {} answered",
            request.files.len(),
            answer.files.len()
        ));
    }
    let rename = rename(request, &delta);
    let mut files = Vec::new();
    for (source, a) in request.files.iter().zip(answer.files) {
        let mut findings = Vec::new();
        for f in a.findings {
            let Some(code) = python::CODES.iter().copied().find(|c| *c == f.code) else {
                return Err(format!(
                    "{}: finding code {:?} is not one the checks use",
                    source.path, f.code
                ));
            };
            if !in_range(&source.text, f.start, f.end) {
                return Err(format!(
                    "{}: a finding's range {}..{} is not on the file",
                    source.path, f.start, f.end
                ));
            }
            findings.push(python::Finding {
                code,
                start: f.start,
                end: f.end,
                label: printable(&f.label).into_owned(),
                message: printable(&f.message).into_owned(),
            });
        }
        let rewritten = match rename {
            Some(r) => python::apply(&source.text, &a.edits, r)
                .map_err(|why| format!("{}: {why}", source.path))?,
            None if a.edits.is_empty() => None,
            None => return Err(format!("{}: edits where no rename applies", source.path)),
        };
        files.push((findings, rewritten));
    }
    Ok(Accepted {
        manifest: Ok(delta),
        files,
    })
}

#[cfg(test)]
mod tests {
    //! The parent's checks of an answer: each lie a subverted child could tell is caught.

    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn request() -> Request {
        Request {
            manifest: "delta target=\"attn\" package=\"fast_attn\"\n".into(),
            python_targets: BTreeMap::from([("attn".to_owned(), true)]),
            namespace: "cordon_c_0123456789ab".into(),
            rules: PyRules {
                ban_call: ["eval".to_owned()].into(),
                ban_import: ["subprocess".to_owned()].into(),
                ban_attribute_call: Default::default(),
                jit_entry_points: Vec::new(),
                local_cutlass: false,
            },
            files: vec![Source {
                path: "attn/a.py".into(),
                text: "import fast_attn.k\neval('1')\n".into(),
            }],
        }
    }

    #[test]
    fn an_honest_answer_is_accepted_with_its_findings_and_rename() {
        let r = request();
        let accepted = accept(&r, respond(&r).unwrap()).unwrap();
        let (findings, rewritten) = &accepted.files[0];
        assert_eq!(findings[0].code, "python.ban-call");
        assert_eq!(
            rewritten.as_deref(),
            Some("import cordon_c_0123456789ab.k; fast_attn = cordon_c_0123456789ab\neval('1')\n")
        );
    }

    #[test]
    fn every_lie_of_a_subverted_child_is_refused() {
        let r = request();
        let honest = respond(&r).unwrap();
        type Lie = Box<dyn Fn(&mut Answer)>;
        let lies: Vec<(&str, Lie)> = vec![
            (
                "an unknown code",
                Box::new(|a| a.files[0].findings[0].code = "python.not_a_code".into()),
            ),
            (
                "a range off the file",
                Box::new(|a| a.files[0].findings[0].end = 10_000),
            ),
            ("a file left out", Box::new(|a| a.files.clear())),
            (
                "code written by an edit",
                Box::new(|a| a.files[0].edits[0].replacement = "os; os.system('x')".into()),
            ),
            (
                "a package that is no Python name",
                Box::new(|a| {
                    if let Ok(d) = &mut a.manifest {
                        d.package = Some("x; import os".into());
                    }
                }),
            ),
            (
                "edits where no rename applies",
                Box::new(|a| {
                    if let Ok(d) = &mut a.manifest {
                        d.package = None;
                    }
                }),
            ),
            (
                "a manifest problem with an unknown code",
                Box::new(|a| {
                    a.manifest = Err(vec![Problem {
                        code: "fine".into(),
                        message: String::new(),
                        label: None,
                    }]);
                    a.files.clear();
                }),
            ),
            (
                "a manifest that failed with no problem",
                Box::new(|a| {
                    a.manifest = Err(Vec::new());
                    a.files.clear();
                }),
            ),
        ];
        for (what, lie) in lies {
            let mut answer = honest.clone();
            lie(&mut answer);
            assert!(accept(&r, answer).is_err(), "{what} was accepted");
        }
    }
}
