//! The Python AST policy and the namespace rewrite, both on the parsed AST of one file
//! (`rustpython-parser`), never on its text by pattern.
//!
//! Before anything is parsed, the file must be one CPython reads as this module does: a coding
//! declaration other than UTF-8 is refused ([`crate::python_coding`]), and so is nesting deep enough to
//! exhaust a stack in the parser, the walk or the drop of the tree ([`crate::python_nesting`]). The walk
//! counts its own depth as well and refuses past [`MAX_WALK_DEPTH`]; [`check`] needs
//! [`STACK_BYTES`] of stack for any input, and its callers run it on threads that have it.
//!
//! Every identifier, attribute name and imported module name is compared as CPython reads it:
//! NFKC-normalised (PEP 3131), so `ｅｖａｌ` is `eval`. The parser does not normalise.
//!
//! Policy: banned calls (`eval(…)`, and the same name reached as an attribute, `x.eval(…)`),
//! banned imports (a listed module and its submodules, in every import form), banned attribute
//! calls (`x.exec_module(…)`). A banned call or attribute-call name is also banned wherever else
//! it is named: loaded, stored, deleted, passed as an argument (`f = eval`, `map(eval, xs)`,
//! `f = loader.exec_module`), or imported by name (`from m import compile as c`). Reflection is
//! fixed mechanism, not policy (see [`REFLECTION_DUNDERS`], [`REFLECTION_CALLS`],
//! [`NAMED_ATTRIBUTE_CALLS`], [`NAME_GETTERS`]): the dunders that lead from any object to
//! builtins, globals, code or every class, `__getattribute__` among them;
//! `getattr`/`setattr`/`delattr` and `operator`'s `attrgetter`/`methodcaller` with a name that
//! is not a string literal (a literal is judged as the attribute it names); `globals()`,
//! `vars()`, `locals()`; any of these functions named other than by calling it; the
//! interpreter's internal modules (`_imp`, `_operator`: [`INTERNAL_MODULE_ADMITTED`]); and
//! `sys.modules`, which hands out the banned modules already loaded.
//!
//! The one carve-out is the policy's JIT entry-point table (seed 001's
//! CuTe DSL rule): `cute.compile(arg, …)` is admitted only when `cute` is bound exactly once in
//! the file, by a plain absolute alias of the entry point's module (`import cutlass.cute as cute`
//! or `from cutlass import cute`), that module is imported once, no star import exists, the
//! contribution carries no `cutlass` package of its own, and the first positional argument is not
//! a string or bytes literal. Bindings are counted file-wide, whatever the scope, so any
//! rebinding or shadowing withdraws the admission. The carve-out admits the call only: the
//! entry point named without being called is a banned name like any other.
//!
//! Rewrite: the candidate's own absolute imports of its package are renamed to the
//! delta-derived namespace by editing exactly the byte ranges of the parsed import nodes.
//!
//! None of this proves code safe: Python reaches names in more ways than any list holds
//! (frames, `gc`, descriptors). It is defence in depth behind the
//! OCI boundary, and it says so.

use std::collections::{BTreeMap, BTreeSet};

use rustpython_ast::{self as ast, Ranged, Visitor};
use rustpython_parser::text_size::TextRange;
use unicode_normalization::UnicodeNormalization;

use crate::python_coding as coding;
use crate::python_nesting as nesting;

pub use crate::python_rename::{Edit, Rename, apply};

/// Attributes (and names) that lead from any object to the builtins, a module's globals, code
/// objects or every class in the process: banned in every context, as `x.__globals__`,
/// `__builtins__["eval"]`, `del x.__dict__[k]` alike. Fixed mechanism, not policy: no engine
/// needs them, and a policy that could drop one would reopen every other ban.
pub const REFLECTION_DUNDERS: &[&str] = &[
    "__builtins__",
    "__class__",
    "__code__",
    "__dict__",
    "__getattribute__",
    "__globals__",
    "__mro__",
    "__subclasses__",
];

/// Builtins that hand out a namespace as a dictionary: banned when called, and when named
/// without being called (`g = globals`). Fixed mechanism, as [`REFLECTION_DUNDERS`].
pub const REFLECTION_CALLS: &[&str] = &["globals", "locals", "vars"];

/// Builtins that reach an attribute by a computed name: admitted only when called with a
/// string literal as the name, which is then judged as the attribute it names; banned when
/// named without being called. Fixed mechanism, as [`REFLECTION_DUNDERS`].
pub const NAMED_ATTRIBUTE_CALLS: &[&str] = &["delattr", "getattr", "setattr"];

/// Callables of `operator` (and `_operator`) that reach an attribute or method by a name given
/// as data: admitted only when called with string literals as the names (every positional
/// argument of `attrgetter`, the first of `methodcaller`), each dotted part judged as the
/// attribute it names; banned when named without being called. Fixed mechanism, as
/// [`REFLECTION_DUNDERS`].
pub const NAME_GETTERS: &[&str] = &["attrgetter", "methodcaller"];

/// The interpreter's internal modules are the absolute imports whose first component starts
/// with `_` (`_imp`, `_operator`, `_io`, …): each is a route around the policy's bans (the
/// banned modules' own implementations among them), so every one is refused, but this one, which
/// only selects language features at compile time.
pub const INTERNAL_MODULE_ADMITTED: &str = "__future__";

/// How deep the walk of the tree goes before it refuses the file (`python.nesting`). Above
/// anything [`nesting::MAX_DEPTH`] admits, so it is a second line, never the first.
pub const MAX_WALK_DEPTH: usize = 4 * nesting::MAX_DEPTH;

/// The stack [`check`] needs for any input: the deepest tree [`nesting`] admits, walked and
/// dropped by an unoptimised build, with a wide margin: the deepest admitted shapes (the
/// `the_deepest_admitted_files_fit_the_stack` test) needed at most 8 MiB in a debug build when
/// measured. Callers run [`check`] on a thread with at least this much; only the pages touched
/// are ever committed.
pub const STACK_BYTES: usize = 64 << 20;

/// An identifier as CPython reads it: NFKC-normalised (PEP 3131).
fn ident(name: &str) -> String {
    if name.is_ascii() {
        name.to_owned()
    } else {
        name.nfkc().collect()
    }
}

/// What the AST policy bans and admits (from the policy's `tree { python { … } }`).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PyRules {
    /// Names that may not be called.
    pub ban_call: BTreeSet<String>,
    /// Modules that may not be imported, with their submodules.
    pub ban_import: BTreeSet<String>,
    /// Attribute names that may not be called.
    pub ban_attribute_call: BTreeSet<String>,
    /// Admitted JIT entry points as (module, function), e.g. (`cutlass.cute`, `compile`).
    pub jit_entry_points: Vec<(String, String)>,
    /// The contribution ships a `cutlass` package or module of its own.
    pub local_cutlass: bool,
}

/// One finding, located in the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// Stable reason code, `python.<rule>`.
    pub code: &'static str,
    /// Byte range in the file.
    pub start: usize,
    /// End of the byte range.
    pub end: usize,
    /// The label under the range.
    pub label: String,
    /// The sentence.
    pub message: String,
}

/// The result of checking one file.
#[derive(Debug, Default)]
pub struct Checked {
    /// Every finding, in source order.
    pub findings: Vec<Finding>,
    /// The rename's edits, sorted ([`apply`] makes the new text from them).
    pub edits: Vec<Edit>,
}

/// Every finding code the checks use.
pub const CODES: &[&str] = &[
    "python.ban-attribute-call",
    "python.ban-call",
    "python.ban-import",
    "python.ban-name",
    "python.coding",
    "python.encoding",
    "python.jit-withdrawn",
    "python.nesting",
    "python.reflection",
    "python.syntax",
    "python.unsupported-spelling",
];

/// What the visitor collects from one file. Every name in it is NFKC-normalised.
#[derive(Default)]
struct Facts {
    /// Import statements: (range of the statement, the import).
    imports: Vec<Import>,
    /// Calls of interest.
    calls: Vec<Call>,
    /// Names and attributes named other than as the callee of a call.
    refs: Vec<Ref>,
    /// name → how many times it is bound anywhere in the file.
    bindings: BTreeMap<String, usize>,
    star_import: Option<TextRange>,
    /// How deep the walk is now.
    depth: usize,
    /// Where the walk first went deeper than [`MAX_WALK_DEPTH`].
    too_deep: Option<TextRange>,
}

struct Import {
    stmt: TextRange,
    /// `None` for `import a.b`, `Some(level)` for `from … import`.
    from_level: Option<u32>,
    /// The module named (`a.b` of `import a.b` or of `from a.b import c`).
    module: Option<String>,
    aliases: Vec<(String, Option<String>, TextRange)>,
}

struct Call {
    range: TextRange,
    /// The called name (`f` of `f()`, `m` of `x.m()`).
    name: String,
    /// The receiver when it is a plain name (`x` of `x.m()`).
    receiver: Option<String>,
    attribute: bool,
    /// The first positional argument is a string, bytes or f-string literal, or starred.
    first_arg_literal: bool,
    no_positional: bool,
    /// The second positional argument when it is a string literal (the name of `getattr`).
    literal_name: Option<String>,
    /// Each positional argument: its text when it is a string literal (not starred).
    literal_args: Vec<Option<String>>,
    /// The first positional argument when it is a plain name (the object of `getattr`).
    first_arg_name: Option<String>,
}

/// A name or attribute that is not the callee of a call (or an attribute that is).
struct Ref {
    range: TextRange,
    name: String,
    /// For an attribute: its object when that is a plain name (`sys` of `sys.modules`).
    receiver: Option<String>,
    /// What it is: how the finding says it.
    kind: RefKind,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum RefKind {
    /// A bare name, loaded.
    Load,
    /// A bare name, stored or deleted.
    Bind,
    /// An attribute that is not called (`x.a`, `x.a = …`, `del x.a`).
    Attribute,
    /// An attribute that is called (`x.a(…)`): only the reflection dunders apply to it.
    CalledAttribute,
    /// A name imported from a module (`from m import a`).
    Imported,
}

impl Facts {
    fn bind(&mut self, name: &str) {
        *self.bindings.entry(ident(name)).or_default() += 1;
    }

    /// Step one level down; `false` (and the place noted) past [`MAX_WALK_DEPTH`].
    fn descend(&mut self, range: TextRange) -> bool {
        self.depth += 1;
        if self.depth > MAX_WALK_DEPTH {
            self.too_deep.get_or_insert(range);
            return false;
        }
        true
    }

    fn refer(&mut self, range: TextRange, name: &str, kind: RefKind) {
        self.refer_on(range, name, kind, None);
    }

    fn refer_on(&mut self, range: TextRange, name: &str, kind: RefKind, receiver: Option<String>) {
        self.refs.push(Ref {
            range,
            name: ident(name),
            receiver,
            kind,
        });
    }
}

impl Visitor for Facts {
    // The depth bound: every statement, expression and pattern is one level.
    fn visit_stmt(&mut self, node: ast::Stmt) {
        if self.descend(node.range()) {
            self.generic_visit_stmt(node);
        }
        self.depth -= 1;
    }

    fn visit_expr(&mut self, node: ast::Expr) {
        if self.descend(node.range()) {
            self.generic_visit_expr(node);
        }
        self.depth -= 1;
    }

    fn visit_pattern(&mut self, node: ast::Pattern) {
        if self.descend(node.range()) {
            self.generic_visit_pattern(node);
        }
        self.depth -= 1;
    }

    fn visit_stmt_import(&mut self, node: ast::StmtImport) {
        let mut aliases = Vec::new();
        for a in node.names {
            let name = ident(a.name.as_str());
            let asname = a.asname.map(|n| ident(n.as_str()));
            let bound = asname
                .clone()
                .unwrap_or_else(|| name.split('.').next().unwrap_or("").to_owned());
            self.bind(&bound);
            if let Some(asname) = &asname {
                self.refer(a.range, asname, RefKind::Bind);
            }
            aliases.push((name, asname, a.range));
        }
        self.imports.push(Import {
            stmt: node.range,
            from_level: None,
            module: None,
            aliases,
        });
    }

    fn visit_stmt_import_from(&mut self, node: ast::StmtImportFrom) {
        let mut aliases = Vec::new();
        for a in node.names {
            let name = ident(a.name.as_str());
            let asname = a.asname.map(|n| ident(n.as_str()));
            if name == "*" {
                self.star_import = Some(node.range);
            } else {
                self.bind(asname.as_ref().unwrap_or(&name));
                self.refer(a.range, &name, RefKind::Imported);
                if let Some(asname) = &asname {
                    self.refer(a.range, asname, RefKind::Bind);
                }
            }
            aliases.push((name, asname, a.range));
        }
        self.imports.push(Import {
            stmt: node.range,
            from_level: Some(node.level.map_or(0, |l| l.to_u32())),
            module: node.module.map(|m| ident(m.as_str())),
            aliases,
        });
    }

    fn visit_expr_call(&mut self, node: ast::ExprCall) {
        let callee = match *node.func {
            ast::Expr::Name(n) => Some((ident(n.id.as_str()), None, false)),
            ast::Expr::Attribute(a) => {
                let receiver = match a.value.as_ref() {
                    ast::Expr::Name(n) => Some(ident(n.id.as_str())),
                    _ => None,
                };
                let name = ident(a.attr.as_str());
                self.refer_on(a.range, &name, RefKind::CalledAttribute, receiver.clone());
                // The receiver is walked; the attribute itself is judged as a call.
                self.visit_expr(*a.value);
                Some((name, receiver, true))
            }
            other => {
                self.visit_expr(other);
                None
            }
        };
        if let Some((name, receiver, attribute)) = callee {
            let first_arg_literal = match node.args.first() {
                Some(ast::Expr::Constant(c)) => {
                    matches!(c.value, ast::Constant::Str(_) | ast::Constant::Bytes(_))
                }
                Some(ast::Expr::JoinedStr(_) | ast::Expr::Starred(_)) => true,
                _ => false,
            };
            let literal_name = match node.args.get(..2) {
                Some([ast::Expr::Starred(_), _]) => None,
                Some([_, ast::Expr::Constant(c)]) => match &c.value {
                    ast::Constant::Str(s) => Some(s.clone()),
                    _ => None,
                },
                _ => None,
            };
            let literal_args = node
                .args
                .iter()
                .map(|a| match a {
                    ast::Expr::Constant(c) => match &c.value {
                        ast::Constant::Str(s) => Some(s.clone()),
                        _ => None,
                    },
                    _ => None,
                })
                .collect();
            let first_arg_name = match node.args.first() {
                Some(ast::Expr::Name(n)) => Some(ident(n.id.as_str())),
                _ => None,
            };
            self.calls.push(Call {
                range: node.range,
                name,
                receiver,
                attribute,
                first_arg_literal,
                no_positional: node.args.is_empty(),
                literal_name,
                literal_args,
                first_arg_name,
            });
        }
        for a in node.args {
            self.visit_expr(a);
        }
        for k in node.keywords {
            self.visit_keyword(k);
        }
    }

    fn visit_expr_name(&mut self, node: ast::ExprName) {
        let kind = if matches!(node.ctx, ast::ExprContext::Load) {
            RefKind::Load
        } else {
            self.bind(node.id.as_str());
            RefKind::Bind
        };
        self.refer(node.range, node.id.as_str(), kind);
    }

    fn visit_expr_attribute(&mut self, node: ast::ExprAttribute) {
        let receiver = match node.value.as_ref() {
            ast::Expr::Name(n) => Some(ident(n.id.as_str())),
            _ => None,
        };
        self.refer_on(node.range, node.attr.as_str(), RefKind::Attribute, receiver);
        self.visit_expr(*node.value);
    }

    fn visit_stmt_function_def(&mut self, node: ast::StmtFunctionDef) {
        self.bind(node.name.as_str());
        self.generic_visit_stmt_function_def(node);
    }

    fn visit_stmt_async_function_def(&mut self, node: ast::StmtAsyncFunctionDef) {
        self.bind(node.name.as_str());
        self.generic_visit_stmt_async_function_def(node);
    }

    fn visit_stmt_class_def(&mut self, node: ast::StmtClassDef) {
        self.bind(node.name.as_str());
        self.generic_visit_stmt_class_def(node);
    }

    fn visit_stmt_global(&mut self, node: ast::StmtGlobal) {
        for n in &node.names {
            self.bind(n.as_str());
        }
    }

    fn visit_stmt_nonlocal(&mut self, node: ast::StmtNonlocal) {
        for n in &node.names {
            self.bind(n.as_str());
        }
    }

    fn visit_excepthandler_except_handler(&mut self, node: ast::ExceptHandlerExceptHandler) {
        if let Some(n) = &node.name {
            self.bind(n.as_str());
        }
        self.generic_visit_excepthandler_except_handler(node);
    }

    // The crate's generic walks of the nodes below visit nothing inside them; these do, so that
    // a call hidden in a default, a keyword argument, a comprehension, a `with` or a `case`
    // guard is seen.
    fn visit_arguments(&mut self, node: ast::Arguments) {
        for a in node
            .posonlyargs
            .into_iter()
            .chain(node.args)
            .chain(node.kwonlyargs)
        {
            self.visit_arg(a.def);
            if let Some(d) = a.default {
                self.visit_expr(*d);
            }
        }
        for a in node.vararg.into_iter().chain(node.kwarg) {
            self.visit_arg(*a);
        }
    }

    fn visit_arg(&mut self, node: ast::Arg) {
        self.bind(node.arg.as_str());
        if let Some(a) = node.annotation {
            self.visit_expr(*a);
        }
    }

    fn visit_keyword(&mut self, node: ast::Keyword) {
        self.visit_expr(node.value);
    }

    fn visit_comprehension(&mut self, node: ast::Comprehension) {
        self.visit_expr(node.target);
        self.visit_expr(node.iter);
        for e in node.ifs {
            self.visit_expr(e);
        }
    }

    fn visit_withitem(&mut self, node: ast::WithItem) {
        self.visit_expr(node.context_expr);
        if let Some(v) = node.optional_vars {
            self.visit_expr(*v);
        }
    }

    fn visit_match_case(&mut self, node: ast::MatchCase) {
        self.visit_pattern(node.pattern);
        if let Some(g) = node.guard {
            self.visit_expr(*g);
        }
        for s in node.body {
            self.visit_stmt(s);
        }
    }

    fn visit_pattern_match_as(&mut self, node: ast::PatternMatchAs) {
        if let Some(n) = &node.name {
            self.bind(n.as_str());
        }
        self.generic_visit_pattern_match_as(node);
    }

    fn visit_pattern_match_star(&mut self, node: ast::PatternMatchStar) {
        if let Some(n) = &node.name {
            self.bind(n.as_str());
        }
    }

    fn visit_pattern_match_mapping(&mut self, node: ast::PatternMatchMapping) {
        if let Some(n) = &node.rest {
            self.bind(n.as_str());
        }
        self.generic_visit_pattern_match_mapping(node);
    }
}

fn span(r: TextRange) -> (usize, usize) {
    (usize::from(r.start()), usize::from(r.end()))
}

fn module_banned(module: &str, banned: &BTreeSet<String>) -> Option<String> {
    banned
        .iter()
        .find(|b| module == b.as_str() || module.starts_with(&format!("{b}.")))
        .cloned()
}

/// One finding that ends the check: nothing else is established about the file.
fn only(code: &'static str, start: usize, end: usize, label: String, message: String) -> Checked {
    Checked {
        findings: vec![Finding {
            code,
            start,
            end,
            label,
            message,
        }],
        edits: Vec::new(),
    }
}

/// Check one file against the policy and, when `rename` is given, rewrite its absolute imports
/// of the candidate's package. Needs [`STACK_BYTES`] of stack.
#[must_use]
pub fn check(source: &str, file: &str, rules: &PyRules, rename: Option<Rename<'_>>) -> Checked {
    if let Some(d) = coding::refused(source) {
        let bom = if d.bom {
            " (after a UTF-8 byte-order mark)"
        } else {
            ""
        };
        return only(
            "python.coding",
            d.start,
            d.end,
            format!("declares {}", d.name),
            format!(
                "the file declares the source encoding {:?}{bom}; only utf-8 is admitted, so that the file is checked as Python will read it",
                d.name
            ),
        );
    }
    let tokens = match nesting::scan(source) {
        Ok(tokens) => tokens,
        Err(deep) => {
            let (start, end) = span(deep.at);
            return only(
                "python.nesting",
                start,
                end,
                "too deep".into(),
                format!("the file nests deeper than the checks admit: {}", deep.why),
            );
        }
    };
    let suite = match rustpython_parser::parse_tokens(tokens, rustpython_parser::Mode::Module, file)
    {
        Ok(ast::Mod::Module(m)) => m.body,
        Ok(_) => Vec::new(),
        Err(e) => {
            let at = usize::from(e.offset);
            return only(
                "python.syntax",
                at,
                at,
                "here".into(),
                format!("the file does not parse as Python: {}", e.error),
            );
        }
    };
    let mut facts = Facts::default();
    for stmt in suite {
        facts.visit_stmt(stmt);
    }
    if let Some(at) = facts.too_deep {
        let (start, end) = span(at);
        return only(
            "python.nesting",
            start,
            end,
            "too deep".into(),
            format!(
                "the file nests deeper than the checks admit: its tree is more than {MAX_WALK_DEPTH} levels deep"
            ),
        );
    }
    let mut findings = Vec::new();
    import_findings(&facts, rules, &mut findings);
    call_findings(&facts, rules, &mut findings);
    ref_findings(&facts, rules, &mut findings);
    let edits = rename.map_or_else(Vec::new, |r| rewrite(source, &facts, r, &mut findings));
    findings.sort_by_key(|f| (f.start, f.end));
    Checked { findings, edits }
}

/// A banned callable named other than by calling it, and the reflection names and dunders.
fn ref_findings(facts: &Facts, rules: &PyRules, findings: &mut Vec<Finding>) {
    let sys = sys_aliases(facts);
    for r in &facts.refs {
        let (start, end) = span(r.range);
        let name = r.name.as_str();
        let spelled = match r.kind {
            RefKind::Attribute | RefKind::CalledAttribute => format!(".{name}"),
            RefKind::Load | RefKind::Bind | RefKind::Imported => name.to_owned(),
        };
        if REFLECTION_DUNDERS.contains(&name) {
            findings.push(Finding {
                code: "python.reflection",
                start,
                end,
                label: format!("names {spelled}"),
                message: format!(
                    "{spelled} leads to builtins, globals, code or every class; it is banned in every context"
                ),
            });
            continue;
        }
        let attribute = matches!(r.kind, RefKind::Attribute | RefKind::CalledAttribute);
        if name == "modules" && attribute && r.receiver.as_ref().is_some_and(|n| sys.contains(n)) {
            findings.push(Finding {
                code: "python.reflection",
                start,
                end,
                label: "names sys.modules".into(),
                message: "sys.modules hands out every loaded module, the banned ones included; it is banned in every context".into(),
            });
            continue;
        }
        // The name getters are imported by name to be used (`from operator import attrgetter`);
        // named any other way than by calling them, they are reflection.
        let getter =
            NAME_GETTERS.contains(&name) && matches!(r.kind, RefKind::Load | RefKind::Attribute);
        let reflective_function =
            REFLECTION_CALLS.contains(&name) || NAMED_ATTRIBUTE_CALLS.contains(&name);
        if getter || (reflective_function && matches!(r.kind, RefKind::Load | RefKind::Imported)) {
            findings.push(Finding {
                code: "python.reflection",
                start,
                end,
                label: format!("names {name}"),
                message: format!(
                    "{name} may only be called in place; naming it otherwise would let it be called unchecked"
                ),
            });
            continue;
        }
        let banned = match r.kind {
            RefKind::CalledAttribute => false,
            RefKind::Attribute => {
                rules.ban_call.contains(name) || rules.ban_attribute_call.contains(name)
            }
            RefKind::Load | RefKind::Bind | RefKind::Imported => rules.ban_call.contains(name),
        };
        if banned {
            findings.push(Finding {
                code: "python.ban-name",
                start,
                end,
                label: format!("names {spelled}"),
                message: format!("{spelled} is banned wherever it is named, not only when called"),
            });
        }
    }
}

fn import_findings(facts: &Facts, rules: &PyRules, findings: &mut Vec<Finding>) {
    for imp in &facts.imports {
        let (start, end) = span(imp.stmt);
        let absolute: Vec<&str> = match (&imp.from_level, &imp.module) {
            (None, _) => imp.aliases.iter().map(|(n, _, _)| n.as_str()).collect(),
            (Some(0), Some(m)) => vec![m.as_str()],
            _ => Vec::new(),
        };
        let internal = absolute.iter().find(|m| {
            let top = m.split('.').next().unwrap_or("");
            top.starts_with('_') && top != INTERNAL_MODULE_ADMITTED
        });
        let from_sys = imp.module.as_deref() == Some("sys")
            && imp.from_level == Some(0)
            && imp.aliases.iter().any(|(n, _, _)| n == "modules");
        let renamed_getter = imp.from_level.is_some()
            && imp.aliases.iter().any(|(n, a, _)| {
                NAME_GETTERS.contains(&n.as_str()) && a.as_ref().is_some_and(|a| a != n)
            });
        let why = if let Some(m) = internal {
            Some(format!(
                "{m} is an interpreter-internal module: a route around the policy's bans"
            ))
        } else if from_sys {
            Some("sys.modules hands out every loaded module, the banned ones included".into())
        } else if renamed_getter {
            Some("a name getter imported under another name would be called unchecked".into())
        } else {
            None
        };
        if let Some(why) = why {
            findings.push(Finding {
                code: "python.reflection",
                start,
                end,
                label: "imports".into(),
                message: format!("reflection is banned: {why}"),
            });
            continue;
        }
        let mut named: Vec<String> = Vec::new();
        match (&imp.from_level, &imp.module) {
            (None, _) => named.extend(imp.aliases.iter().map(|(n, _, _)| n.clone())),
            (Some(0), Some(m)) => {
                named.push(m.clone());
                // `from importlib import util` imports importlib.util as well.
                named.extend(imp.aliases.iter().map(|(n, _, _)| format!("{m}.{n}")));
            }
            _ => {}
        }
        for module in named {
            if let Some(b) = module_banned(&module, &rules.ban_import) {
                let (start, end) = span(imp.stmt);
                findings.push(Finding {
                    code: "python.ban-import",
                    start,
                    end,
                    label: format!("imports {module}"),
                    message: format!("importing {b:?} (or anything under it) is banned"),
                });
                break;
            }
        }
    }
}

/// Whether `receiver` is bound by a plain absolute alias of `module` somewhere in the file
/// (`import cutlass.cute as cute`, `from cutlass import cute [as c]`): the carve-out is being
/// attempted. Returns how many imports of the module the file has in all.
fn alias_of(facts: &Facts, receiver: &str, module: &str) -> (bool, usize) {
    let (parent, last) = module.rsplit_once('.').unwrap_or(("", module));
    let mut imports_of_module = 0;
    let mut alias_binds = false;
    for imp in &facts.imports {
        for (name, asname, _) in &imp.aliases {
            let hit = match (&imp.from_level, &imp.module) {
                (None, _) => {
                    if name == module && asname.as_deref() == Some(receiver) {
                        alias_binds = true;
                    }
                    name == module || name.starts_with(&format!("{module}."))
                }
                (Some(0), Some(m)) if m == module || m.starts_with(&format!("{module}.")) => true,
                (Some(0), Some(m)) if m == parent && name == last => {
                    if asname.as_deref().unwrap_or(name) == receiver {
                        alias_binds = true;
                    }
                    true
                }
                _ => false,
            };
            if hit {
                imports_of_module += 1;
            }
        }
    }
    (alias_binds, imports_of_module)
}

/// Why the JIT admission does not hold for a receiver that aliases the entry point's module,
/// or `None` when it holds.
fn jit_withdrawn(
    facts: &Facts,
    rules: &PyRules,
    receiver: &str,
    module: &str,
    imports: usize,
) -> Option<String> {
    if rules.local_cutlass {
        return Some("the contribution ships its own `cutlass` package".into());
    }
    if facts.star_import.is_some() {
        return Some("a star import could rebind any name".into());
    }
    if imports != 1 {
        return Some(format!("{module} is imported {imports} times"));
    }
    let binds = facts.bindings.get(receiver).copied().unwrap_or(0);
    if binds != 1 {
        return Some(format!("{receiver:?} is bound {binds} times in this file"));
    }
    None
}

/// Why a call of a reflection builtin is banned, or `None` when it is not one or is admitted.
/// Whether `attribute` is one no reflective route may name: a reflection dunder, a banned call
/// or attribute call.
fn banned_attribute(attribute: &str, rules: &PyRules) -> bool {
    REFLECTION_DUNDERS.contains(&attribute)
        || rules.ban_call.contains(attribute)
        || rules.ban_attribute_call.contains(attribute)
}

/// The names `sys` is bound to by `import sys [as s]`: `sys.modules` hands out every loaded
/// module, the banned ones and the interpreter's internals included.
fn sys_aliases(facts: &Facts) -> BTreeSet<String> {
    facts
        .imports
        .iter()
        .filter(|i| i.from_level.is_none())
        .flat_map(|i| &i.aliases)
        .filter(|(name, _, _)| name == "sys")
        .map(|(name, asname, _)| asname.clone().unwrap_or_else(|| name.clone()))
        .collect()
}

fn reflection_call(call: &Call, rules: &PyRules, sys: &BTreeSet<String>) -> Option<String> {
    let name = call.name.as_str();
    if NAME_GETTERS.contains(&name) {
        // `attrgetter` takes every positional argument as a dotted name, `methodcaller` its first.
        let names = match name {
            "attrgetter" => &call.literal_args[..],
            _ => call.literal_args.get(..1).unwrap_or(&[]),
        };
        if names.is_empty() || names.iter().any(Option::is_none) {
            return Some(format!(
                "{name}(…) with a name that is not a string literal reaches any attribute"
            ));
        }
        let banned = names
            .iter()
            .flatten()
            .flat_map(|n| n.split('.'))
            .map(ident)
            .find(|a| banned_attribute(a, rules) || a == "modules");
        return banned.map(|a| format!("{name}(…) names the banned attribute {a:?}"));
    }
    if call.attribute {
        return None;
    }
    if REFLECTION_CALLS.contains(&name) {
        return Some(format!("{name}() hands out a namespace as a dictionary"));
    }
    if !NAMED_ATTRIBUTE_CALLS.contains(&name) {
        return None;
    }
    let Some(literal) = &call.literal_name else {
        return Some(format!(
            "{name}(…) with a name that is not a string literal reaches any attribute"
        ));
    };
    let attribute = ident(literal);
    let of_sys = attribute == "modules"
        && call
            .first_arg_name
            .as_ref()
            .is_some_and(|n| sys.contains(n));
    (banned_attribute(&attribute, rules) || of_sys)
        .then(|| format!("{name}(…) names the banned attribute {attribute:?}"))
}

fn call_findings(facts: &Facts, rules: &PyRules, findings: &mut Vec<Finding>) {
    let sys = sys_aliases(facts);
    for call in &facts.calls {
        let (start, end) = span(call.range);
        if let Some(why) = reflection_call(call, rules, &sys) {
            findings.push(Finding {
                code: "python.reflection",
                start,
                end,
                label: format!("calls {}", call.name),
                message: format!("reflection is banned: {why}"),
            });
            continue;
        }
        if call.attribute && rules.ban_attribute_call.contains(&call.name) {
            findings.push(Finding {
                code: "python.ban-attribute-call",
                start,
                end,
                label: format!("calls .{}", call.name),
                message: format!("calling an attribute named {:?} is banned", call.name),
            });
            continue;
        }
        if !rules.ban_call.contains(&call.name) {
            continue;
        }
        let entry = rules
            .jit_entry_points
            .iter()
            .find(|(_, f)| call.attribute && *f == call.name);
        let attempt = match (entry, &call.receiver) {
            (Some((module, _)), Some(receiver)) => match alias_of(facts, receiver, module) {
                (true, imports) => Some((module, receiver, imports)),
                (false, _) => None,
            },
            _ => None,
        };
        let verdict = match attempt {
            Some((module, receiver, imports)) => {
                match jit_withdrawn(facts, rules, receiver, module, imports) {
                    None if call.no_positional => {
                        Some("the entry point is called without a positional argument".into())
                    }
                    None if call.first_arg_literal => {
                        Some("the first positional argument is a string or bytes literal".into())
                    }
                    None => None,
                    Some(why) => Some(why),
                }
            }
            _ => Some(String::new()),
        };
        let Some(why) = verdict else {
            continue;
        };
        let (code, message) = if why.is_empty() {
            (
                "python.ban-call",
                format!("calling {:?} is banned", call.name),
            )
        } else {
            (
                "python.jit-withdrawn",
                format!(
                    "calling {:?} is banned; the JIT entry-point admission does not hold: {why}",
                    call.name
                ),
            )
        };
        findings.push(Finding {
            code,
            start,
            end,
            label: format!("calls {}", call.name),
            message,
        });
    }
}

/// The edits that rename the package in the file's absolute imports, sorted.
fn rewrite(
    source: &str,
    facts: &Facts,
    rename: Rename<'_>,
    findings: &mut Vec<Finding>,
) -> Vec<Edit> {
    let ours = |m: &str| m == rename.package || m.starts_with(&format!("{}.", rename.package));
    // (start, end, replacement), non-overlapping.
    let mut edits: Vec<(usize, usize, String)> = Vec::new();
    let unsupported = |r: TextRange, findings: &mut Vec<Finding>| {
        let (start, end) = span(r);
        findings.push(Finding {
            code: "python.unsupported-spelling",
            start,
            end,
            label: "spelled with spaces, continuations or non-ASCII letters".into(),
            message: "this import of the candidate's own package cannot be renamed exactly; write the dotted name in ASCII, without spaces".into(),
        });
    };
    for imp in &facts.imports {
        match (&imp.from_level, &imp.module) {
            (None, _) => {
                let mut rebind = false;
                for (name, asname, range) in &imp.aliases {
                    if !ours(name) {
                        continue;
                    }
                    let (start, _) = span(*range);
                    let end = start + name.len();
                    if source.get(start..end) != Some(name.as_str()) {
                        unsupported(*range, findings);
                        continue;
                    }
                    let renamed = format!("{}{}", rename.namespace, &name[rename.package.len()..]);
                    let replacement = match asname {
                        None if name == rename.package => {
                            format!("{renamed} as {}", rename.package)
                        }
                        // `import pkg.sub` binds `pkg`: bind it to the namespace afterwards.
                        None => {
                            rebind = true;
                            renamed
                        }
                        Some(_) => renamed,
                    };
                    edits.push((start, end, replacement));
                }
                if rebind {
                    let (_, end) = span(imp.stmt);
                    edits.push((
                        end,
                        end,
                        format!("; {} = {}", rename.package, rename.namespace),
                    ));
                }
            }
            (Some(0), Some(m)) if ours(m) => {
                let (start, end) = span(imp.stmt);
                let text = &source[start..end];
                let after_from = text.strip_prefix("from").map(str::trim_start);
                let offset = after_from.map(|rest| end - start - rest.len());
                match offset {
                    Some(o) if text[o..].starts_with(m.as_str()) => {
                        let at = start + o;
                        edits.push((at, at + rename.package.len(), rename.namespace.to_owned()));
                    }
                    _ => unsupported(imp.stmt, findings),
                }
            }
            _ => {}
        }
    }
    edits.sort_by_key(|e| (e.0, e.1));
    edits
        .into_iter()
        .map(|(start, end, replacement)| Edit {
            start,
            end,
            replacement,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn the_walk_bounds_its_own_depth_past_what_the_scan_admits() {
        // A tree the pre-scan would refuse, parsed without it: the walk stops at its bound and
        // says where, rather than recursing on.
        let deep = std::thread::Builder::new()
            .stack_size(STACK_BYTES)
            .spawn(|| {
                let source = format!("x = {}1\n", "-".repeat(MAX_WALK_DEPTH + 10));
                let module =
                    rustpython_parser::parse(&source, rustpython_parser::Mode::Module, "t.py")
                        .unwrap();
                let mut facts = Facts::default();
                if let ast::Mod::Module(m) = module {
                    for stmt in m.body {
                        facts.visit_stmt(stmt);
                    }
                }
                (facts.too_deep.is_some(), facts.depth)
            })
            .unwrap()
            .join()
            .unwrap();
        assert_eq!(deep, (true, 0));
    }
}
