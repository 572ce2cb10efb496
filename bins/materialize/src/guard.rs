//! The tree guard: static checks on every file a delta brings, before anything is published.
//!
//! It rejects undeclared executable bits, binary artifacts (by extension and by object-file
//! magic), undeclared native (C, C++, CUDA) sources and dependency patches, declared tiers the policy does not
//! allow, declarations of files the delta does not carry, submodule markers, and files or trees
//! over the policy's bounds. Non-UTF-8 paths never get this far (intake refuses them).
//!
//! These checks do not prove the code safe — a text file can still be a build script that
//! writes a binary at prebuild time — they keep the reviewed tiers honest. The OCI boundary is
//! what contains the code.

use cordon_policy_lang::TreeRules;

use crate::manifest::Delta;

/// One guard or AST finding, with its place when it has one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// Stable reason code (`tree.<rule>` or `python.<rule>`).
    pub code: &'static str,
    /// The tree path concerned.
    pub path: String,
    /// Byte range, line and column (1-based) in the file, for source findings.
    pub at: Option<Position>,
    /// The label under the range.
    pub label: String,
    /// The sentence.
    pub message: String,
}

/// Where in a file a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    /// Byte offset of the start.
    pub start: usize,
    /// Byte offset of the end.
    pub end: usize,
    /// 1-based line.
    pub line: usize,
    /// 1-based column, in characters.
    pub col: usize,
}

impl Position {
    /// The position of a byte range in `source`.
    #[must_use]
    pub fn of(source: &str, start: usize, end: usize) -> Self {
        let start = start.min(source.len());
        let before = source.get(..start).unwrap_or("");
        let line = before.matches('\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let col = source
            .get(line_start..start)
            .map_or(1, |s| s.chars().count() + 1);
        Self {
            start,
            end: end.max(start),
            line,
            col,
        }
    }
}

impl Finding {
    /// A finding about a whole file.
    #[must_use]
    pub fn file(code: &'static str, path: &str, message: impl Into<String>) -> Self {
        Self {
            code,
            path: path.to_owned(),
            at: None,
            label: String::new(),
            message: message.into(),
        }
    }

    /// `path:line:col: message`, for receipts.
    #[must_use]
    pub fn one_line(&self) -> String {
        match self.at {
            Some(p) => format!("{}:{}:{}: {}", self.path, p.line, p.col, self.message),
            None => format!("{}: {}", self.path, self.message),
        }
    }
}

/// File extensions that are binary artifacts, never source.
const BINARY_EXTENSIONS: [&str; 11] = [
    ".so", ".o", ".a", ".dylib", ".pyc", ".pyo", ".bin", ".dll", ".exe", ".obj", ".lib",
];

/// File extensions of native sources and headers (C, C++, CUDA): the native-sources tier's, each
/// declared by the manifest.
const NATIVE_EXTENSIONS: [&str; 10] = [
    ".c", ".h", ".cc", ".cpp", ".cxx", ".hh", ".hpp", ".hxx", ".cu", ".cuh",
];

/// Leading bytes of object and executable formats.
const BINARY_MAGIC: [(&[u8], &str); 9] = [
    (b"\x7fELF", "ELF"),
    (b"\xfe\xed\xfa\xce", "Mach-O"),
    (b"\xfe\xed\xfa\xcf", "Mach-O"),
    (b"\xce\xfa\xed\xfe", "Mach-O"),
    (b"\xcf\xfa\xed\xfe", "Mach-O"),
    (b"\xca\xfe\xba\xbe", "Mach-O universal or Java class"),
    (b"!<arch>\n", "ar archive"),
    (b"\0asm", "WebAssembly"),
    (b"MZ", "PE/COFF"),
];

/// What the guard needs to know of one delta file.
pub struct FileFacts<'a> {
    /// Tree path.
    pub path: &'a str,
    /// Executable bit in the archive.
    pub executable: bool,
    /// Bytes.
    pub size: u64,
    /// The first bytes of its contents.
    pub head: &'a [u8],
}

/// Check one delta file.
pub fn check_file(f: &FileFacts<'_>, delta: &Delta, rules: &TreeRules, out: &mut Vec<Finding>) {
    let name = f.path.rsplit('/').next().unwrap_or(f.path);
    let depth = f.path.split('/').count() as u64;
    if f.path.len() as u64 > rules.max_path_length || depth > rules.max_depth {
        out.push(Finding::file(
            "tree.path-limit",
            f.path,
            format!(
                "the path exceeds {} bytes or {} components",
                rules.max_path_length, rules.max_depth
            ),
        ));
    }
    if f.size > rules.max_file_bytes {
        out.push(Finding::file(
            "tree.too-big",
            f.path,
            format!("{} bytes exceeds {}", f.size, rules.max_file_bytes),
        ));
    }
    if name == ".gitmodules" || f.path.split('/').any(|c| c == ".git") {
        out.push(Finding::file(
            "tree.submodule",
            f.path,
            "submodule and repository markers are not admitted",
        ));
    }
    if f.executable && !delta.executables.contains(f.path) {
        out.push(Finding::file(
            "tree.executable",
            f.path,
            "the executable bit is set but the manifest does not declare it",
        ));
    }
    if let Some(ext) = BINARY_EXTENSIONS.iter().find(|e| name.ends_with(*e)) {
        out.push(Finding::file(
            "tree.binary",
            f.path,
            format!("{ext} files are binary artifacts"),
        ));
    } else if let Some((_, kind)) = BINARY_MAGIC.iter().find(|(m, _)| f.head.starts_with(m)) {
        out.push(Finding::file(
            "tree.binary",
            f.path,
            format!("the contents are a {kind} binary"),
        ));
    }
    if NATIVE_EXTENSIONS.iter().any(|e| name.ends_with(e)) && !delta.native_sources.contains(f.path)
    {
        out.push(Finding::file(
            "tree.native-undeclared",
            f.path,
            "C, C++ and CUDA sources are a reviewed-build tier the manifest must declare",
        ));
    }
    let patch = name.ends_with(".patch") || name.ends_with(".diff");
    if patch && !delta.dependency_patches.contains(f.path) {
        out.push(Finding::file(
            "tree.patch-undeclared",
            f.path,
            "dependency patches are a reviewed-build tier the manifest must declare",
        ));
    }
}

/// Checks on the manifest's declarations as a whole: tiers the policy allows, and declared
/// files the delta carries.
pub fn check_declarations(
    delta: &Delta,
    carried: &dyn Fn(&str) -> bool,
    rules: &TreeRules,
    out: &mut Vec<Finding>,
) {
    let tiers: [(&std::collections::BTreeSet<String>, bool, &str); 3] = [
        (&delta.executables, rules.executables, "executables"),
        (
            &delta.native_sources,
            rules.native_sources,
            "native sources",
        ),
        (
            &delta.dependency_patches,
            rules.dependency_patches,
            "dependency patches",
        ),
    ];
    for (set, allowed, what) in tiers {
        for p in set {
            if !allowed {
                out.push(Finding::file(
                    "tree.tier-disabled",
                    p,
                    format!("the policy does not admit {what}"),
                ));
            }
            if !carried(p) {
                out.push(Finding::file(
                    "tree.declared-missing",
                    p,
                    "the manifest declares a file the delta does not carry",
                ));
            }
        }
    }
}
