//! The Python AST policy and the namespace rewrite, both on the parsed AST of one file
//! (`rustpython-parser`), never on its text by pattern.
//!
//! Policy: banned calls (`eval(…)`, and the same name reached as an attribute, `x.eval(…)`),
//! banned imports (a listed module and its submodules, in every import form), banned attribute
//! calls (`x.exec_module(…)`). The one carve-out is the policy's JIT entry-point table (seed 001's
//! CuTe DSL rule): `cute.compile(arg, …)` is admitted only when `cute` is bound exactly once in
//! the file, by a plain absolute alias of the entry point's module (`import cutlass.cute as cute`
//! or `from cutlass import cute`), that module is imported once, no star import exists, the
//! contribution carries no `cutlass` package of its own, and the first positional argument is not
//! a string or bytes literal. Bindings are counted file-wide, whatever the scope, so any
//! rebinding or shadowing withdraws the admission.
//!
//! Rewrite: the candidate's own absolute imports of its package are renamed to the
//! delta-derived namespace by editing exactly the byte ranges of the parsed import nodes.
//!
//! None of this proves code safe: Python can reach any name dynamically (`getattr` on a module
//! object, for one). It is defence in depth behind the OCI boundary, and it says so.

use std::collections::{BTreeMap, BTreeSet};

use rustpython_ast::{self as ast, Visitor};
use rustpython_parser::text_size::TextRange;

/// What the AST policy bans and admits (from the policy's `tree { python { … } }`).
#[derive(Debug, Clone)]
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

/// A rename of the candidate's package to its namespace.
#[derive(Debug, Clone, Copy)]
pub struct Rename<'a> {
    /// The package name the candidate's own imports use.
    pub package: &'a str,
    /// The namespace it becomes.
    pub namespace: &'a str,
}

/// The result of checking one file.
#[derive(Debug, Default)]
pub struct Checked {
    /// Every finding, in source order.
    pub findings: Vec<Finding>,
    /// The rewritten source, when a rename was asked for and changed something.
    pub rewritten: Option<String>,
}

/// What the visitor collects from one file.
#[derive(Default)]
struct Facts {
    /// Import statements: (range of the statement, the import).
    imports: Vec<Import>,
    /// Calls of interest.
    calls: Vec<Call>,
    /// name → how many times it is bound anywhere in the file.
    bindings: BTreeMap<String, usize>,
    star_import: Option<TextRange>,
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
}

impl Facts {
    fn bind(&mut self, name: &str) {
        *self.bindings.entry(name.to_owned()).or_default() += 1;
    }
}

impl Visitor for Facts {
    fn visit_stmt_import(&mut self, node: ast::StmtImport) {
        let mut aliases = Vec::new();
        for a in node.names {
            let bound = a.asname.as_ref().map_or_else(
                || a.name.as_str().split('.').next().unwrap_or("").to_owned(),
                |n| n.as_str().to_owned(),
            );
            self.bind(&bound);
            aliases.push((
                a.name.as_str().to_owned(),
                a.asname.map(|n| n.as_str().to_owned()),
                a.range,
            ));
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
            if a.name.as_str() == "*" {
                self.star_import = Some(node.range);
            } else {
                let bound = a.asname.as_ref().unwrap_or(&a.name).as_str().to_owned();
                self.bind(&bound);
            }
            aliases.push((
                a.name.as_str().to_owned(),
                a.asname.map(|n| n.as_str().to_owned()),
                a.range,
            ));
        }
        self.imports.push(Import {
            stmt: node.range,
            from_level: Some(node.level.map_or(0, |l| l.to_u32())),
            module: node.module.map(|m| m.as_str().to_owned()),
            aliases,
        });
    }

    fn visit_expr_call(&mut self, node: ast::ExprCall) {
        let (name, receiver, attribute) = match node.func.as_ref() {
            ast::Expr::Name(n) => (Some(n.id.as_str().to_owned()), None, false),
            ast::Expr::Attribute(a) => {
                let receiver = match a.value.as_ref() {
                    ast::Expr::Name(n) => Some(n.id.as_str().to_owned()),
                    _ => None,
                };
                (Some(a.attr.as_str().to_owned()), receiver, true)
            }
            _ => (None, None, false),
        };
        if let Some(name) = name {
            let first_arg_literal = match node.args.first() {
                Some(ast::Expr::Constant(c)) => {
                    matches!(c.value, ast::Constant::Str(_) | ast::Constant::Bytes(_))
                }
                Some(ast::Expr::JoinedStr(_) | ast::Expr::Starred(_)) => true,
                _ => false,
            };
            self.calls.push(Call {
                range: node.range,
                name,
                receiver,
                attribute,
                first_arg_literal,
                no_positional: node.args.is_empty(),
            });
        }
        self.generic_visit_expr_call(node);
    }

    fn visit_expr_name(&mut self, node: ast::ExprName) {
        if !matches!(node.ctx, ast::ExprContext::Load) {
            self.bind(node.id.as_str());
        }
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

/// Check one file against the policy and, when `rename` is given, rewrite its absolute imports
/// of the candidate's package.
#[must_use]
pub fn check(source: &str, file: &str, rules: &PyRules, rename: Option<Rename<'_>>) -> Checked {
    let suite = match rustpython_parser::parse(source, rustpython_parser::Mode::Module, file) {
        Ok(ast::Mod::Module(m)) => m.body,
        Ok(_) => Vec::new(),
        Err(e) => {
            let at = usize::from(e.offset);
            return Checked {
                findings: vec![Finding {
                    code: "python.syntax",
                    start: at,
                    end: at,
                    label: "here".into(),
                    message: format!("the file does not parse as Python: {}", e.error),
                }],
                rewritten: None,
            };
        }
    };
    let mut facts = Facts::default();
    for stmt in suite {
        facts.visit_stmt(stmt);
    }
    let mut findings = Vec::new();
    import_findings(&facts, rules, &mut findings);
    call_findings(&facts, rules, &mut findings);
    let rewritten = rename.and_then(|r| rewrite(source, &facts, r, &mut findings));
    findings.sort_by_key(|f| (f.start, f.end));
    Checked {
        findings,
        rewritten,
    }
}

fn import_findings(facts: &Facts, rules: &PyRules, findings: &mut Vec<Finding>) {
    for imp in &facts.imports {
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

fn call_findings(facts: &Facts, rules: &PyRules, findings: &mut Vec<Finding>) {
    for call in &facts.calls {
        let (start, end) = span(call.range);
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

/// Rename the package in the file's absolute imports. Returns the new text when it changed.
fn rewrite(
    source: &str,
    facts: &Facts,
    rename: Rename<'_>,
    findings: &mut Vec<Finding>,
) -> Option<String> {
    let ours = |m: &str| m == rename.package || m.starts_with(&format!("{}.", rename.package));
    // (start, end, replacement), non-overlapping.
    let mut edits: Vec<(usize, usize, String)> = Vec::new();
    let unsupported = |r: TextRange, findings: &mut Vec<Finding>| {
        let (start, end) = span(r);
        findings.push(Finding {
            code: "python.unsupported-spelling",
            start,
            end,
            label: "spelled with spaces or continuations".into(),
            message: "this import of the candidate's own package cannot be renamed exactly; write the dotted name without spaces".into(),
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
    if edits.is_empty() {
        return None;
    }
    edits.sort_by_key(|e| (e.0, e.1));
    let mut out = String::with_capacity(source.len() + edits.len() * 16);
    let mut pos = 0;
    for (start, end, replacement) in edits {
        out.push_str(&source[pos..start]);
        out.push_str(&replacement);
        pos = end;
    }
    out.push_str(&source[pos..]);
    Some(out)
}
