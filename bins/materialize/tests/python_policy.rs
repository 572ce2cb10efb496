//! The Python AST policy: every banned construct, wherever it hides, and every arm of the
//! cute.compile admission rule, admitted and withdrawn; and the namespace rewrite.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use cordon_materialize::python::{self, PyRules, Rename, check};

fn rules(local_cutlass: bool) -> PyRules {
    let set = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect();
    PyRules {
        ban_call: set(&["eval", "exec", "compile", "__import__", "breakpoint"]),
        ban_import: set(&["builtins", "importlib", "ctypes", "pickle", "marshal"]),
        ban_attribute_call: set(&[
            "exec_module",
            "load_module",
            "spec_from_file_location",
            "spec_from_loader",
            "module_from_spec",
        ]),
        jit_entry_points: vec![("cutlass.cute".into(), "compile".into())],
        local_cutlass,
    }
}

fn codes(src: &str) -> Vec<&'static str> {
    codes_with(src, false)
}

fn codes_with(src: &str, local_cutlass: bool) -> Vec<&'static str> {
    check(src, "t.py", &rules(local_cutlass), None)
        .findings
        .into_iter()
        .map(|f| f.code)
        .collect()
}

#[test]
fn every_banned_call_is_found_wherever_it_hides() {
    let cases = [
        "eval('1')",
        "exec(x)",
        "compile(s, 'f', 'exec')",
        "__import__('os')",
        "breakpoint()",
        "x = [eval(s) for s in xs]",
        "f(key=eval(s))",
        "def f(a=eval(s)):\n    pass",
        "lambda a=exec(s): a",
        "with open(eval(p)) as f:\n    pass",
        "match v:\n    case 1 if eval(s):\n        pass",
        "@eval\ndef f():\n    pass\nf = eval(f)",
        "class C:\n    def m(self):\n        return exec(s)",
        "y = f'{eval(s)}'",
        "def f(a: eval(s)):\n    pass",
        "obj.eval(s)",
        "re.compile(p)",
    ];
    for src in cases {
        assert!(
            codes(src).contains(&"python.ban-call"),
            "{src:?} must be found, got {:?}",
            codes(src)
        );
    }
}

#[test]
fn every_banned_import_form_is_found() {
    let cases = [
        "import builtins",
        "import importlib",
        "import importlib.util",
        "import importlib.machinery as m",
        "from importlib import import_module",
        "from importlib.util import spec_from_file_location",
        "from ctypes import CDLL",
        "import os, pickle",
        "def f():\n    import marshal",
    ];
    for src in cases {
        assert_eq!(codes(src), ["python.ban-import"], "{src:?}");
    }
    assert!(codes("import importlibx\nimport builtinsy").is_empty());
    assert!(
        codes("from . import builtins").is_empty(),
        "a relative import is the package's own"
    );
}

#[test]
fn every_banned_attribute_call_is_found() {
    for attr in [
        "exec_module",
        "load_module",
        "spec_from_file_location",
        "spec_from_loader",
        "module_from_spec",
    ] {
        let src = format!("loader.{attr}(m)");
        assert_eq!(codes(&src), ["python.ban-attribute-call"], "{src}");
    }
}

#[test]
fn the_cute_compile_admission_holds_in_its_exact_form() {
    let admitted = [
        "import cutlass.cute as cute\ncute.compile(kernel)",
        "from cutlass import cute\ncute.compile(kernel, arg)",
        "from cutlass import cute as c\nc.compile(k)",
        "import cutlass.cute as cute\ndef f(k):\n    return cute.compile(k)",
        "def f(k):\n    import cutlass.cute as cute\n    return cute.compile(k)",
    ];
    for src in admitted {
        assert!(
            codes(src).is_empty(),
            "{src:?} must be admitted, got {:?}",
            codes(src)
        );
    }
}

#[test]
fn every_arm_of_the_cute_compile_rule_withdraws_the_admission() {
    let withdrawn = [
        // The first positional argument is a string or bytes literal (or unknowable).
        "import cutlass.cute as cute\ncute.compile('src')",
        "import cutlass.cute as cute\ncute.compile(b'src')",
        "import cutlass.cute as cute\ncute.compile(f'{x}')",
        "import cutlass.cute as cute\ncute.compile(*args)",
        "import cutlass.cute as cute\ncute.compile()",
        // Rebinding and shadowing, anywhere in the file.
        "import cutlass.cute as cute\ncute = other\ncute.compile(k)",
        "import cutlass.cute as cute\ndef f(cute):\n    return cute.compile(k)",
        "import cutlass.cute as cute\nfor cute in xs:\n    pass\ncute.compile(k)",
        "import cutlass.cute as cute\nwith x as cute:\n    pass\ncute.compile(k)",
        "import cutlass.cute as cute\nclass cute:\n    pass\ncute.compile(k)",
        "import cutlass.cute as cute\ntry:\n    pass\nexcept E as cute:\n    pass\ncute.compile(k)",
        "import cutlass.cute as cute\n(cute := x)\ncute.compile(k)",
        "import cutlass.cute as cute\ndef f():\n    global cute\ncute.compile(k)",
        "import cutlass.cute as cute\n[0 for cute in xs]\ncute.compile(k)",
        // A second import of the module, a star import.
        "import cutlass.cute as cute\nimport cutlass.cute as cute\ncute.compile(k)",
        "import cutlass.cute as cute\nfrom cutlass import cute as c2\ncute.compile(k)",
        "import cutlass.cute as cute\nfrom cutlass.cute import *\ncute.compile(k)",
        "import cutlass.cute as cute\nfrom os import *\ncute.compile(k)",
        // Not a plain absolute alias of the allow-listed module.
        "import cutlass.cute\ncutlass.cute.compile(k)",
        "import mylib as cute\ncute.compile(k)",
        "from .cutlass import cute\ncute.compile(k)",
        "cute.compile(k)",
        "x.cute.compile(k)",
    ];
    for src in withdrawn {
        let found = codes(src);
        assert!(
            found.contains(&"python.jit-withdrawn") || found.contains(&"python.ban-call"),
            "{src:?} must not be admitted, got {found:?}"
        );
    }
    // A contribution-local cutlass package withdraws it everywhere.
    assert_eq!(
        codes_with("import cutlass.cute as cute\ncute.compile(k)", true),
        ["python.jit-withdrawn"]
    );
    // builtins stays banned, so builtins.compile cannot stand in for the carve-out.
    let found = codes("import builtins\nbuiltins.compile(s, 'f', 'exec')");
    assert!(found.contains(&"python.ban-import") && found.contains(&"python.ban-call"));
}

#[test]
fn a_syntax_error_is_a_finding_with_a_position() {
    let checked = check("def f(:\n", "t.py", &rules(false), None);
    assert_eq!(checked.findings.len(), 1);
    assert_eq!(checked.findings[0].code, "python.syntax");
}

fn renamed(src: &str) -> String {
    let r = Rename {
        package: "fast_attn",
        namespace: "cordon_c_0123456789ab",
    };
    let c = check(src, "t.py", &rules(false), Some(r));
    assert!(c.findings.is_empty(), "{:?}", c.findings);
    python::apply(src, &c.edits, r)
        .unwrap()
        .unwrap_or_else(|| src.to_owned())
}

#[test]
fn only_a_renames_own_edits_are_applied() {
    let r = Rename {
        package: "fast_attn",
        namespace: "cordon_c_0123456789ab",
    };
    let src = "import fast_attn.k as k\nx = 1\n";
    let edit = |start: usize, end: usize, to: &str| python::Edit {
        start,
        end,
        replacement: to.to_owned(),
    };
    // What the check itself produces is admitted.
    let ok = [edit(7, 18, "cordon_c_0123456789ab.k")];
    assert!(python::apply(src, &ok, r).unwrap().is_some());
    for bad in [
        // Code written in place of the name.
        vec![edit(7, 18, "os; os.system('x')")],
        // A rename of something that is not the package.
        vec![edit(24, 25, "cordon_c_0123456789ab")],
        // An insertion other than the rebinding.
        vec![edit(30, 30, "\nimport os")],
        // Out of bounds, overlapping, out of order.
        vec![edit(7, 999, "cordon_c_0123456789ab")],
        vec![
            edit(7, 18, "cordon_c_0123456789ab.k"),
            edit(10, 18, "cordon_c_0123456789ab"),
        ],
        // The rebinding with no rename before it.
        vec![edit(23, 23, "; fast_attn = cordon_c_0123456789ab")],
    ] {
        assert!(python::apply(src, &bad, r).is_err(), "{bad:?}");
    }
    // The check's own rebinding after `import fast_attn.k` is admitted.
    let own = "import fast_attn.k\nx = 1\n";
    let c = check(own, "t.py", &rules(false), Some(r));
    assert!(python::apply(own, &c.edits, r).unwrap().is_some());
    // A rebinding placed to split a quote would turn a string into running code: refused.
    let s = r#"s = ''' + '\nimport os; os.system("id")\n''' # '''
import fast_attn
"#;
    let split = [edit(5, 5, "; fast_attn = cordon_c_0123456789ab")];
    let e = python::apply(s, &split, r).unwrap_err();
    assert!(
        e.ends_with("is not a rename of \"fast_attn\" to \"cordon_c_0123456789ab\""),
        "{e}"
    );
    let in_string = "s = 'fast_attn'\n";
    let hostile = [
        edit(5, 14, "cordon_c_0123456789ab"),
        edit(14, 14, "; fast_attn = cordon_c_0123456789ab"),
    ];
    assert!(
        python::apply(in_string, &hostile, r).is_err(),
        "an insertion before a quote"
    );
    // Nor on a later line than its rename (which would continue the next statement).
    let comment = "# fast_attn\nx (y)\n";
    let later = [
        edit(2, 11, "cordon_c_0123456789ab"),
        edit(13, 13, "; fast_attn = cordon_c_0123456789ab"),
    ];
    assert!(python::apply(comment, &later, r).is_err(), "a later line");
    // Honest spellings the check renames are admitted: non-ASCII names, a form feed, a
    // continuation.
    for own in [
        "import fast_attn.k, données\n",
        "import fast_attn.k\x0c\n",
        "import fast_attn.k, \\\n    os\n",
    ] {
        let c = check(own, "t.py", &rules(false), Some(r));
        assert!(
            python::apply(own, &c.edits, r).unwrap().is_some(),
            "{own:?}: {:?}",
            c.edits
        );
    }
}

#[test]
fn the_candidates_own_absolute_imports_are_renamed_on_the_ast() {
    assert_eq!(
        renamed("import fast_attn\n"),
        "import cordon_c_0123456789ab as fast_attn\n"
    );
    assert_eq!(
        renamed("import fast_attn.kernel as k\n"),
        "import cordon_c_0123456789ab.kernel as k\n"
    );
    assert_eq!(
        renamed("import os, fast_attn.util\n"),
        "import os, cordon_c_0123456789ab.util; fast_attn = cordon_c_0123456789ab\n"
    );
    assert_eq!(
        renamed("from fast_attn.kernel import attend  # comment\n"),
        "from cordon_c_0123456789ab.kernel import attend  # comment\n"
    );
    assert_eq!(
        renamed("from   fast_attn import (\n    a,\n    b,\n)\n"),
        "from   cordon_c_0123456789ab import (\n    a,\n    b,\n)\n"
    );
    // Not the package: left alone.
    let untouched = "import fast_attnx\nfrom . import fast_attn\ns = 'import fast_attn'\n";
    assert_eq!(renamed(untouched), untouched);
    // A spelling the range edit cannot rename exactly is refused, not guessed.
    let c = check(
        "from fast_attn . kernel import attend\n",
        "t.py",
        &rules(false),
        Some(Rename {
            package: "fast_attn",
            namespace: "cordon_c_0123456789ab",
        }),
    );
    assert_eq!(
        c.findings.iter().map(|f| f.code).collect::<Vec<_>>(),
        ["python.unsupported-spelling"]
    );
}

/// Run the whole check on a thread with the stack it documents it needs.
fn codes_deep(src: String) -> Vec<&'static str> {
    std::thread::Builder::new()
        .stack_size(cordon_materialize::python::STACK_BYTES)
        .spawn(move || codes(&src))
        .unwrap()
        .join()
        .unwrap()
}

#[test]
fn the_parser_does_not_normalise_identifiers_itself() {
    // Why the policy normalises: rustpython keeps the spelling, CPython reads `eval`.
    let m =
        rustpython_parser::parse("ｅｖａｌ(1)", rustpython_parser::Mode::Module, "t.py").unwrap();
    let text = format!("{m:?}");
    assert!(
        text.contains("ｅｖａｌ") && !text.contains("\"eval\""),
        "{text}"
    );
}

#[test]
fn full_width_spellings_are_read_as_cpython_reads_them() {
    let cases: [(&str, &str); 8] = [
        ("ｅｖａｌ(s)", "python.ban-call"),
        ("ℯval(s)", "python.ban-call"),
        ("x.ｅｘｅｃ_module(m)", "python.ban-attribute-call"),
        ("import ｂｕｉｌｔｉｎｓ", "python.ban-import"),
        ("from ｉｍｐｏｒｔｌｉｂ import util", "python.ban-import"),
        ("import ｉｍｐｏｒｔｌｉｂ.util as u", "python.ban-import"),
        ("f = ｅｘｅｃ", "python.ban-name"),
        ("x.__ｇｌｏｂａｌｓ__", "python.reflection"),
    ];
    for (src, code) in cases {
        assert!(
            codes(src).contains(&code),
            "{src:?} must give {code}, got {:?}",
            codes(src)
        );
    }
    // A full-width rebinding is a rebinding: the admission is withdrawn.
    assert_eq!(
        codes("import cutlass.cute as cute\nｃｕｔｅ = other\ncute.compile(k)"),
        ["python.jit-withdrawn"]
    );
    // The candidate's own package spelled in full width cannot be renamed exactly: refused.
    let c = check(
        "import ｆａｓｔ_attn\n",
        "t.py",
        &rules(false),
        Some(Rename {
            package: "fast_attn",
            namespace: "cordon_c_0123456789ab",
        }),
    );
    assert_eq!(
        c.findings.iter().map(|f| f.code).collect::<Vec<_>>(),
        ["python.unsupported-spelling"]
    );
}

#[test]
fn a_coding_declaration_other_than_utf8_is_refused() {
    let refused = [
        "# -*- coding: latin-1 -*-\nx = 1\n",
        "# coding: unicode_escape\n#\\u000aeval('1')\n",
        "#!/usr/bin/env python\n# vim: set fileencoding=utf-7 :\n",
        "\n# coding=cp1252\n",
        "x = 1\r# coding: latin-1\n",
        "x = 1  # coding: latin-1\n",
        "# coding: utf-8-sig\n",
        "# coding: u8\n",
        "# coding: utf-8 coding: latin-1\n",
        "\u{feff}# coding: latin-1\n",
    ];
    for src in refused {
        assert_eq!(codes(src), ["python.coding"], "{src:?}");
    }
    let bom = check("\u{feff}# coding: latin-1\n", "t.py", &rules(false), None);
    assert!(bom.findings[0].message.contains("byte-order mark"));
    let admitted = [
        "# -*- coding: utf-8 -*-\nx = 1\n",
        "# coding=UTF_8\n",
        "# coding: utf8\n",
        "# -*- coding: utf-8; mode: python -*-\n",
        "\u{feff}# coding: utf-8\nx = 1\n",
        "\u{feff}x = 1\n",
        "# coding:\n",
        "\n\n# coding: latin-1 (the third line is not read)\n",
        "s = 'encoding'\n",
    ];
    for src in admitted {
        assert!(codes(src).is_empty(), "{src:?}: {:?}", codes(src));
    }
}

#[test]
fn a_banned_builtin_is_banned_wherever_it_is_named() {
    let cases = [
        "f = eval",
        "map(eval, xs)",
        "x = [exec, 1]",
        "eval = 1",
        "del eval",
        "import os as eval",
        "from re import compile",
        "f = re.compile",
        "f = loader.exec_module",
        "import builtins\nbuiltins.eval",
        "import cutlass.cute as cute\nf = cute.compile",
        "from cutlass.cute import compile as cc\ncc('src')",
        "@cute.compile\ndef f():\n    pass",
    ];
    for src in cases {
        assert!(
            codes(src).contains(&"python.ban-name"),
            "{src:?} must be found, got {:?}",
            codes(src)
        );
    }
    // A definition is not a use: calling it is, and that is found already.
    assert!(codes("class C:\n    def compile(self):\n        pass").is_empty());
}

#[test]
fn reflection_is_banned() {
    let cases = [
        "getattr(x, name)",
        "getattr(x, 'ev' + 'al')",
        "getattr(*args)",
        "getattr(x, *names)",
        "setattr(x, n, v)",
        "delattr(x, n)",
        "getattr(x, 'eval')",
        "getattr(m, 'exec_module')(spec)",
        "getattr(f, '__globals__')",
        "g = getattr",
        "sorted(xs, key=getattr)",
        "g = globals",
        "globals()",
        "locals()",
        "vars()",
        "vars(x)",
        "x.__globals__",
        "f.__code__ = g",
        "del x.__dict__",
        "__builtins__['eval']",
        "__builtins__.eval",
        "f.__globals__['os']",
        "x.__dict__['k'] = v",
        "().__class__.__mro__[1].__subclasses__()",
        "type(x).__subclasses__()",
        "def m(self):\n    return __class__",
    ];
    for src in cases {
        assert!(
            codes(src).contains(&"python.reflection"),
            "{src:?} must be found, got {:?}",
            codes(src)
        );
    }
    let admitted = [
        "getattr(x, 'shape')",
        "getattr(x, 'shape', None)",
        "setattr(self, 'n', 1)",
        "delattr(self, 'cache')",
        "hasattr(x, 'y')",
        "super().__init__()",
        "print(self.__name__)",
        "vars_ = 1",
    ];
    for src in admitted {
        assert!(codes(src).is_empty(), "{src:?}: {:?}", codes(src));
    }
}

/// Inputs that overflow a stack when nothing bounds them, `n` levels deep.
fn deep(kind: &str, n: usize) -> String {
    match kind {
        "unary" => format!("x = {}1\n", "-".repeat(n)),
        "not" => format!("x = {}1\n", "not ".repeat(n)),
        "parens" => format!("x = {}1{}\n", "(".repeat(n), ")".repeat(n)),
        "lists" => format!("x = {}1{}\n", "[".repeat(n), "]".repeat(n)),
        "target" => format!("{}a{} = 1\n", "[".repeat(n), "]".repeat(n)),
        "sum" => format!("x = 1{}\n", " + 1".repeat(n)),
        "attributes" => format!("x = a{}\n", ".a".repeat(n)),
        "calls" => format!("x = f{}\n", "()".repeat(n)),
        "conditional" => format!("x = {}1\n", "1 if c else ".repeat(n)),
        "lambda" => format!("x = {}1\n", "lambda: ".repeat(n)),
        "lambda-args" => format!("x = {}1\n", "lambda a, b: ".repeat(n)),
        "elif" => format!("if a:\n    pass\n{}", "elif a:\n    pass\n".repeat(n)),
        "indent" => (0..n)
            .map(|i| format!("{}if a:\n", " ".repeat(i)))
            .chain([format!("{}pass\n", " ".repeat(n))])
            .collect(),
        "fstring" => format!("x = f'{{{}1}}'\n", "-".repeat(n)),
        "fstring-parens" => format!("x = f'{{{}1{}}}'\n", "(".repeat(n), ")".repeat(n)),
        _ => unreachable!(),
    }
}

const DEEP_KINDS: [&str; 15] = [
    "unary",
    "not",
    "parens",
    "lists",
    "target",
    "sum",
    "attributes",
    "calls",
    "conditional",
    "lambda",
    "lambda-args",
    "elif",
    "indent",
    "fstring",
    "fstring-parens",
];

#[test]
fn nesting_past_the_bounds_is_refused_before_it_can_exhaust_a_stack() {
    for kind in DEEP_KINDS {
        let n = if kind == "indent" { 2_000 } else { 50_000 };
        assert_eq!(codes_deep(deep(kind, n)), ["python.nesting"], "{kind}");
    }
}

#[test]
fn the_deepest_admitted_files_fit_the_stack() {
    use cordon_materialize::python_nesting::{MAX_BRACKETS, MAX_DEPTH, MAX_INDENT};
    // Each kind as deep as the scan admits: checked to the end, on the documented stack.
    for kind in DEEP_KINDS {
        let mut n = match kind {
            "parens" | "lists" | "target" | "fstring-parens" => MAX_BRACKETS,
            "indent" => MAX_INDENT,
            _ => MAX_DEPTH,
        };
        let admitted = loop {
            let found = codes_deep(deep(kind, n));
            if !found.contains(&"python.nesting") {
                break found;
            }
            n -= 1;
        };
        assert!(n > 0, "{kind}");
        assert!(
            admitted.is_empty() || admitted == ["python.syntax"],
            "{kind} at {n}: {admitted:?}"
        );
    }
    // And one past the hard bounds is refused.
    assert_eq!(
        codes_deep(deep("parens", MAX_BRACKETS + 1)),
        ["python.nesting"]
    );
    assert_eq!(
        codes_deep(deep("indent", MAX_INDENT + 1)),
        ["python.nesting"]
    );
}

#[test]
fn brackets_in_strings_and_comments_cannot_hide_depth() {
    let n = 150;
    let hidden = [
        // Closers in a comment and in a string, then real depth past the bound.
        format!(
            "x = {}1  # {}\n{}1{}\n",
            "(".repeat(n),
            ")".repeat(n),
            "(".repeat(n),
            ")".repeat(2 * n)
        ),
        format!(
            "x = {}'{}'{}1{}\n",
            "(".repeat(n),
            ")".repeat(n),
            "(".repeat(n),
            ")".repeat(2 * n)
        ),
        // A quoted brace inside an f-string field does not end the field.
        format!("x = f\"{{'}}' + {}1}}\"\n", "-".repeat(2_000)),
        format!("x = f\"{{x:{{'}}'}}}}{{{}1}}\"\n", "-".repeat(2_000)),
    ];
    for src in hidden {
        assert_eq!(codes_deep(src.clone()), ["python.nesting"], "{src:.80}");
    }
    // Brackets that are only text are not nesting, and wide code is not deep.
    let admitted = [
        format!("x = '{}'\n# {}\n", "(".repeat(1_000), "[".repeat(1_000)),
        format!("x = f'{{{{{}}}}}'\n", "(".repeat(1_000)),
        format!(
            "table = [{}]\n",
            (0..20_000)
                .map(|i| format!("-{i}"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        format!(
            "s = (\n{})\n",
            (0..5_000)
                .map(|i| format!("    'line {i}'\n"))
                .collect::<String>()
        ),
        format!(
            "def f():\n{}",
            "    x = 1\n    if x:\n        pass\n".repeat(5_000)
        ),
    ];
    for src in admitted {
        assert!(codes_deep(src.clone()).is_empty(), "{src:.80}");
    }
}

/// The interpreter's own routes around the bans (issue 33): its internal modules, `sys.modules`,
/// `__getattribute__`, and `operator`'s name getters with a computed or banned name. Each of the
/// review's bypasses is found; the ordinary uses beside them are not.
#[test]
fn the_interpreters_reflective_routes_are_banned() {
    let cases = [
        "import _operator, sys\n_operator.attrgetter('ev' + 'al')(sys.modules['builtins'])",
        "object.__getattribute__(m, 'eval')",
        "type.__getattribute__(C, 'x')",
        "import _operator\n_operator.methodcaller('ev' + 'al')(m)",
        "import sys\nm = sys.modules['marshal']",
        "import _imp",
        "import _operator as op",
        "from _io import open_code",
        "import _frozen_importlib.x",
        "import operator\noperator.attrgetter(name)",
        "import operator\noperator.attrgetter('shape', n)",
        "import operator\noperator.attrgetter('eval')",
        "import operator\noperator.attrgetter('f.__globals__')",
        "import operator\noperator.methodcaller(n)",
        "import operator\noperator.methodcaller('exec_module', spec)",
        "import operator\noperator.attrgetter(*names)",
        "from operator import attrgetter\nattrgetter(n)",
        "from operator import attrgetter as ag",
        "import operator\nf = operator.attrgetter",
        "from operator import methodcaller\nk = methodcaller",
        "import sys as s\nx = s.modules",
        "import sys\nsys.modules.get('marshal')",
        "import sys\nsys.modules['x'] = m",
        "from sys import modules",
        "from sys import modules as mods",
        "import sys\ngetattr(sys, 'modules')",
        "import operator\noperator.attrgetter('modules')(sys)",
    ];
    for src in cases {
        assert!(
            codes(src).contains(&"python.reflection"),
            "{src:?} must be found, got {:?}",
            codes(src)
        );
    }
    let admitted = [
        "from __future__ import annotations",
        "from . import _impl",
        "from ._kernels import run",
        "import operator\nkey = operator.attrgetter('shape', 'dtype.itemsize')",
        "from operator import attrgetter\nsorted(xs, key=attrgetter('n'))",
        "import operator\nf = operator.methodcaller('item')",
        "import sys\nsys.path.insert(0, p)\nprint(sys.argv, file=sys.stderr)",
        "for m in self.modules():\n    pass",
        "n = len(model.modules)",
        "getattr(torch, 'modules')",
    ];
    for src in admitted {
        assert!(codes(src).is_empty(), "{src:?}: {:?}", codes(src));
    }
}
