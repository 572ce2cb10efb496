//! The Python AST policy: every banned construct, wherever it hides, and every arm of the
//! cute.compile admission rule, admitted and withdrawn; and the namespace rewrite.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use cordon_materialize::python::{PyRules, Rename, check};

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
    c.rewritten.unwrap_or_else(|| src.to_owned())
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
