//! cordon-image: byte-reproducible layouts that umoci and skopeo accept, verification that
//! refuses a tampered blob, and the read-only unpacked root filesystem.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::Command;

use cordon::canonical::Digest;
use cordon::image;
use cordon_testkit::{require_executable, workspace_root};

fn build(out: &Path) -> Digest {
    let spec = cordon_image::spec::load(&cordon_testkit::prebuild_image_spec()).unwrap();
    image::build(&spec, out).unwrap()
}

fn build_runtime(out: &Path) -> Digest {
    let worker = cordon_testkit::runtime_image_inputs();
    let pin: Digest = cordon_testkit::policy_pin("worker").parse().unwrap();
    assert_eq!(
        Digest::of_file(&worker).unwrap(),
        pin,
        "images/build-worker.sh builds another worker than policy/evaluator.kdl pins: re-pin after review"
    );
    let spec = cordon_image::spec::load(&workspace_root().join("images/runtime.kdl")).unwrap();
    image::build(&spec, out).unwrap()
}

fn files(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push((
                    p.strip_prefix(dir).unwrap().to_path_buf(),
                    std::fs::read(&p).unwrap(),
                ));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn two_builds_are_byte_identical_and_match_the_policy_pin() {
    let dir = tempfile::tempdir().unwrap();
    let a = build(&dir.path().join("a"));
    let b = build(&dir.path().join("b"));
    assert_eq!(a, b);
    assert_eq!(files(&dir.path().join("a")), files(&dir.path().join("b")));
    let policy: Digest = cordon_testkit::policy_pin("image \"prebuild\"")
        .parse()
        .unwrap();
    assert_eq!(
        a, policy,
        "images/prebuild.kdl builds {a} from the sources images/sources.json pins, but \
         policy/evaluator.kdl pins {policy}: rebuild with `bash images/fetch-sources.sh && \
         cordon-image build images/prebuild.kdl --out DIR` and re-pin after review (README, \
         'Re-pinning the images')"
    );
}

#[test]
fn the_runtime_image_rebuilds_byte_identical_to_the_policy_pin() {
    let dir = tempfile::tempdir().unwrap();
    let a = build_runtime(&dir.path().join("a"));
    let b = build_runtime(&dir.path().join("b"));
    assert_eq!(files(&dir.path().join("a")), files(&dir.path().join("b")));
    let policy: Digest = cordon_testkit::policy_pin("image \"runtime\"")
        .parse()
        .unwrap();
    assert_eq!(
        (a, b),
        (policy, policy),
        "images/runtime.kdl builds {a} from the sources images/sources.json pins and this \
         checkout's worker, but policy/evaluator.kdl pins {policy}: rebuild with `bash \
         images/fetch-sources.sh && bash images/build-worker.sh && cordon-image build \
         images/runtime.kdl --out DIR` and re-pin after review (README, 'Re-pinning the images')"
    );
}

#[test]
fn umoci_and_skopeo_accept_the_layout() {
    require_executable(Path::new("/usr/bin/umoci"), "apt-get install -y umoci");
    require_executable(Path::new("/usr/bin/skopeo"), "apt-get install -y skopeo");
    let dir = tempfile::tempdir().unwrap();
    let layout = dir.path().join("layout");
    let digest = build(&layout);
    let out = Command::new("skopeo")
        .arg("inspect")
        .arg(format!("oci:{}", layout.display()))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let inspected: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(inspected["Digest"], digest.to_string());
    let bundle = dir.path().join("bundle");
    let out = Command::new("umoci")
        // Rootless: umoci gives files to the layer's owners only as root; the layout is the
        // same either way.
        .args(["unpack", "--rootless", "--image"])
        .arg(format!("{}:cordon-prebuild", layout.display()))
        .arg(&bundle)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(bundle.join("rootfs/bin/sh").is_file());
}

#[test]
fn a_tampered_blob_or_index_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let layout = dir.path().join("layout");
    let digest = build(&layout);
    image::verify(&layout, &digest).unwrap();
    // Every blob, flipped in turn: the layer, the config and the manifest.
    for (path, _) in files(&layout.join("blobs/sha256")) {
        let copy = dir.path().join("copy");
        let _ = std::fs::remove_dir_all(&copy);
        Command::new("cp")
            .arg("-a")
            .arg(&layout)
            .arg(&copy)
            .status()
            .unwrap();
        let blob = copy.join("blobs/sha256").join(&path);
        let mut bytes = std::fs::read(&blob).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&blob, bytes).unwrap();
        let err = image::verify(&copy, &digest).unwrap_err();
        assert!(err.to_string().contains("verification"), "{path:?}: {err}");
    }
    // A manifest the index does not name.
    let other = Digest::of_bytes(b"another image");
    let err = image::verify(&layout, &other).unwrap_err();
    assert!(
        matches!(err, image::ImageError::Verify { .. }),
        "a manifest the index does not name: {err}"
    );
}

#[test]
fn unpack_gives_a_read_only_root_filesystem_cached_by_digest() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let layout = dir.path().join("layout");
    let digest = build(&layout);
    let store = cordon::store::Store::open(&dir.path().join("store")).unwrap();
    let rootfs = image::unpack(&store, &layout, &digest).unwrap();
    assert!(rootfs.ends_with(format!("images/{}/rootfs", digest.hex())));
    let sh = std::fs::metadata(rootfs.join("bin/sh")).unwrap();
    assert_eq!(sh.mode() & 0o7777, 0o555);
    assert_eq!(sh.mtime(), 0);
    assert_eq!(
        std::fs::metadata(rootfs.join("tmp")).unwrap().mode() & 0o7777,
        0o555
    );
    let again = image::unpack(&store, &layout, &digest).unwrap();
    assert_eq!(again, rootfs);
}

/// The cached rootfs is checked against the verified layers at every use: a changed byte, an
/// added, removed or re-moded entry, or a link is refused (`cordon::image::tampered`) and
/// never mounted; the untouched cache of the same image passes.
#[test]
fn a_tampered_unpacked_image_is_refused_at_its_next_use() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let layout = dir.path().join("layout");
    let digest = build(&layout);
    let set_mode = |p: &Path, mode: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    };
    // Each tamper in a directory made writable for it and sealed again after, so the tamper
    // is the only difference.
    type Tamper<'a> = (&'a str, &'a dyn Fn(&Path), &'a str);
    let outside = dir.path().join("outside");
    std::fs::write(&outside, b"").unwrap();
    let cases: [Tamper<'_>; 8] = [
        (
            "a changed byte",
            &|r| {
                let sh = r.join("bin/sh");
                let mut bytes = std::fs::read(&sh).unwrap();
                bytes[100] ^= 1;
                set_mode(&sh, 0o644);
                std::fs::write(&sh, bytes).unwrap();
                set_mode(&sh, 0o555);
            },
            "not the image's bytes",
        ),
        (
            "an added file",
            &|r| std::fs::write(r.join("tmp/planted"), "x").unwrap(),
            "not in the image",
        ),
        (
            "a removed file",
            &|r| std::fs::remove_file(r.join("bin/sh")).unwrap(),
            "of",
        ),
        (
            "a writable file",
            &|r| set_mode(&r.join("bin/sh"), 0o777),
            "has mode",
        ),
        (
            "a link",
            &|r| std::os::unix::fs::symlink("/etc/shadow", r.join("tmp/l")).unwrap(),
            "Symlink",
        ),
        (
            "a hard link",
            &|r| std::fs::hard_link(r.join("bin/sh"), outside.with_extension("sh")).unwrap(),
            "links",
        ),
        (
            "an extended attribute",
            &|r| {
                rustix::fs::setxattr(
                    r.join("bin/sh"),
                    "user.planted",
                    b"1",
                    rustix::fs::XattrFlags::empty(),
                )
                .unwrap();
            },
            "attribute",
        ),
        (
            "a writable directory",
            &|r| set_mode(&r.join("tmp"), 0o1777),
            "has mode",
        ),
    ];
    for (i, (what, tamper, says)) in cases.iter().enumerate() {
        let store = cordon::store::Store::open(&dir.path().join(format!("store{i}"))).unwrap();
        let rootfs = image::unpack(&store, &layout, &digest).unwrap();
        for d in [rootfs.as_path(), &rootfs.join("bin"), &rootfs.join("tmp")] {
            set_mode(d, 0o755);
        }
        tamper(&rootfs);
        for d in [rootfs.join("bin"), rootfs.clone()] {
            set_mode(&d, 0o555);
        }
        if *what != "a writable directory" {
            set_mode(&rootfs.join("tmp"), 0o555);
        }
        let err = image::unpack(&store, &layout, &digest).unwrap_err();
        assert!(
            matches!(&err, image::ImageError::Tampered { why, .. } if why.contains(says)),
            "{what}: {err}"
        );
    }
}

/// `--diagnostics json` makes an error one JSON document on stderr, with its code.
#[test]
fn errors_are_one_json_document_under_diagnostics_json() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cordon-image"))
        .args(["build", "--diagnostics", "json"])
        .arg(dir.path().join("missing.kdl"))
        .arg("--out")
        .arg(dir.path().join("layout"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let doc: serde_json::Value = serde_json::from_slice(&out.stderr).unwrap();
    assert_eq!(doc["code"], "cordon::image::spec_read", "{doc}");
}

/// A layout path that holds nothing is the operator's typo (exit 2), said before any store is
/// made for `unpack`; an `--out` that exists says to name a new one.
#[test]
fn a_mistyped_layout_or_an_existing_out_says_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let image = |args: &[&std::ffi::OsStr]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_cordon-image"))
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let absent = dir.path().join("nolayout");
    let store = dir.path().join("stroe");
    let digest = cordon::canonical::Digest::of_bytes(b"x").to_string();
    let (code, err) = image(&["verify".as_ref(), absent.as_os_str(), digest.as_ref()]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("take the layout's own directory"), "{err}");
    let (code, err) = image(&[
        "unpack".as_ref(),
        "--store".as_ref(),
        store.as_os_str(),
        absent.as_os_str(),
        digest.as_ref(),
    ]);
    assert_eq!(code, Some(2), "{err}");
    assert!(!store.exists(), "a store made for a typo");
    let spec = cordon_testkit::prebuild_image_spec();
    let (code, err) = image(&[
        "build".as_ref(),
        spec.as_os_str(),
        "--out".as_ref(),
        dir.path().as_os_str(),
    ]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("name a path that does not exist yet"), "{err}");
}
