//! The `cordon-docs` command line: an option is never taken for the output directory.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;

#[test]
fn help_version_and_a_mistake_make_no_directory() {
    let dir = tempfile::tempdir().unwrap();
    for (args, code) in [
        (&["--help"][..], 0),
        (&["--version"][..], 0),
        (&["--bogus"][..], 2),
        (&[][..], 2),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_cordon-docs"))
            .args(args)
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(code), "{args:?}: {out:?}");
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            0,
            "{args:?}"
        );
    }
    let out = Command::new(env!("CARGO_BIN_EXE_cordon-docs"))
        .arg(dir.path().join("out"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(
        dir.path()
            .join("out/share/man/man1/cordon-lane.1")
            .is_file()
    );
}
