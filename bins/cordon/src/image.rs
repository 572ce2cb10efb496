//! Reproducible, digest-pinned OCI image layouts: build one from a spec, verify one against a
//! pinned manifest digest, unpack a verified one into a read-only root filesystem cached in
//! the store by manifest digest.
//!
//! Build is byte-reproducible: one layer, entries sorted by path, every parent directory
//! explicit, uid/gid 0, mtime 0, explicit modes, gzip with a zero header time at a fixed level,
//! and every JSON document in canonical form (sorted keys — oci-spec keeps annotations in a
//! HashMap, so its own serialization order is not stable). No symbolic links: the image is
//! unpacked with the same safe tar reader as intake, which admits none, so `/bin/sh` is a copy
//! of busybox, not a link to it.
//!
//! Verify checks `oci-layout`, that `index.json` names the pinned manifest, and every blob's
//! sha256 and size, and that each layer's uncompressed sha256 is its config `diff_id`.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use oci_spec::image::{
    ConfigBuilder, DescriptorBuilder, ImageConfiguration, ImageConfigurationBuilder, ImageIndex,
    ImageIndexBuilder, ImageManifest, ImageManifestBuilder, MediaType, RootFsBuilder,
};

use crate::archive::{self, ArchiveError, ArchiveLimits, Sink};
use crate::canonical::{CanonicalError, Digest, to_canonical_json};
use crate::store::{self, Store, StoreError};

/// What goes into an image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageSpec {
    /// The reference name recorded in `index.json`.
    pub name: String,
    /// Image path → (host file, mode).
    pub files: BTreeMap<String, (PathBuf, u32)>,
    /// Image directories (parents of files are added with mode 0755).
    pub dirs: BTreeMap<String, u32>,
    /// `KEY=value` environment.
    pub env: Vec<String>,
    /// Entrypoint argv.
    pub entrypoint: Vec<String>,
    /// Working directory.
    pub workdir: Option<String>,
}

/// Why an image could not be built, verified or unpacked.
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
pub enum ImageError {
    /// A file the spec names could not be read, or the layout could not be written.
    #[error("image I/O on {path}")]
    #[diagnostic(code(cordon::image::io))]
    Io {
        /// The path.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// `--out` names something that exists.
    #[error("{path} exists: a layout is written fresh")]
    #[diagnostic(
        code(cordon::image::out_exists),
        help("name a path that does not exist yet with --out (or remove the old layout first)")
    )]
    OutExists {
        /// The path given.
        path: PathBuf,
    },
    /// The spec is not buildable.
    #[error("image spec: {why}")]
    #[diagnostic(code(cordon::image::spec))]
    Spec {
        /// What is wrong.
        why: String,
    },
    /// No image layout is where the stage looked (`--images DIR`, `DIR/ROLE`).
    #[error("no image layout at {dir}")]
    #[diagnostic(
        code(cordon::image::missing),
        help(
            "build the pinned images (`cordon-image build images/ROLE.kdl --out DIR/ROLE`: they rebuild bit for bit; checks/demo.sh does): a stage reads ROLE's layout at DIR/ROLE under `--images DIR` (default /var/lib/cordon/images); `cordon-image verify` and `unpack` take the layout's own directory"
        )
    )]
    Missing {
        /// Where a layout was looked for.
        dir: PathBuf,
    },
    /// The layout is not the pinned image.
    #[error("image layout {dir} fails verification: {why}")]
    #[diagnostic(
        code(cordon::image::verify),
        help("rebuild the image with cordon-image build, or re-pin it after review")
    )]
    Verify {
        /// The layout.
        dir: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// A layer is not a tar the safe reader admits.
    #[error("image layer is refused: {0}")]
    #[diagnostic(code(cordon::image::layer))]
    Layer(#[from] ArchiveError),
    /// Encoding failed.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Canonical(#[from] CanonicalError),
    /// The store failed.
    #[error(transparent)]
    #[diagnostic(transparent)]
    Store(#[from] StoreError),
    /// The cached unpacked image is not what the verified layers hold: something changed it
    /// after it was unpacked. Never mounted, never repaired silently.
    #[error("the unpacked image {rootfs} is not the pinned image's: {why}")]
    #[diagnostic(
        code(cordon::image::tampered),
        help(
            "keep it for inspection, then remove the image's directory under the store's images/ so the next run unpacks it again from the verified layout"
        )
    )]
    Tampered {
        /// The rootfs.
        rootfs: PathBuf,
        /// The first difference.
        why: String,
    },
    /// The unpacked image could not be walked to be sealed.
    #[error("cannot seal the unpacked image: {0}")]
    #[diagnostic(code(cordon::image::seal))]
    Seal(#[from] crate::walk::WalkError),
}

fn io_at(path: &Path) -> impl FnOnce(io::Error) -> ImageError + use<> {
    let path = path.to_path_buf();
    move |source| ImageError::Io { path, source }
}

fn spec_err(e: impl std::fmt::Display) -> ImageError {
    ImageError::Spec { why: e.to_string() }
}

/// Bounds for unpacking image layers (the image is reviewed, but its bytes are still parsed by
/// the one safe reader, with these bounds).
#[must_use]
pub fn layer_limits() -> ArchiveLimits {
    ArchiveLimits {
        max_archive_bytes: 16 << 30,
        max_extracted_bytes: 32 << 30,
        max_members: 1_000_000,
        max_file_bytes: 8 << 30,
        max_path_length: 4096,
        max_depth: 64,
        max_pax_bytes: 64 << 10,
        max_compression_ratio: 1000,
        exclude: Vec::new(),
    }
}

fn clean(path: &str) -> Result<String, ImageError> {
    let p = path.strip_prefix('/').unwrap_or(path);
    let p = p.strip_suffix('/').unwrap_or(p);
    if p.is_empty() || p.split('/').any(|c| c.is_empty() || c == "." || c == "..") {
        return Err(spec_err(format!("{path:?} is not a clean absolute path")));
    }
    Ok(p.to_owned())
}

/// The uncompressed layer: a deterministic tar of the spec's directories and files.
fn layer_tar(spec: &ImageSpec) -> Result<Vec<u8>, ImageError> {
    let mut dirs: BTreeMap<String, u32> = BTreeMap::new();
    let mut files: BTreeMap<String, (PathBuf, u32)> = BTreeMap::new();
    for (d, mode) in &spec.dirs {
        dirs.insert(clean(d)?, *mode);
    }
    for (f, (src, mode)) in &spec.files {
        let f = clean(f)?;
        let mut parent = Path::new(&f).parent();
        while let Some(p) = parent.filter(|p| !p.as_os_str().is_empty()) {
            dirs.entry(p.display().to_string()).or_insert(0o755);
            parent = p.parent();
        }
        files.insert(f, (src.clone(), *mode));
    }
    if let Some(clash) = files.keys().find(|f| dirs.contains_key(*f)) {
        return Err(spec_err(format!(
            "{clash:?} is both a file and a directory"
        )));
    }
    let mut entries: BTreeSet<(String, bool)> = BTreeSet::new();
    entries.extend(dirs.keys().map(|d| (d.clone(), true)));
    entries.extend(files.keys().map(|f| (f.clone(), false)));
    let mut b = tar::Builder::new(Vec::new());
    b.mode(tar::HeaderMode::Deterministic);
    for (path, is_dir) in entries {
        let mut h = tar::Header::new_ustar();
        h.set_mtime(0);
        h.set_uid(0);
        h.set_gid(0);
        if is_dir {
            let mode = dirs[&path];
            h.set_entry_type(tar::EntryType::Directory);
            h.set_mode(mode);
            h.set_size(0);
            b.append_data(&mut h, format!("{path}/"), io::empty())
                .map_err(io_at(Path::new(&path)))?;
        } else {
            let (src, mode) = &files[&path];
            let data = fs::read(src).map_err(io_at(src))?;
            h.set_entry_type(tar::EntryType::Regular);
            h.set_mode(*mode);
            h.set_size(data.len() as u64);
            b.append_data(&mut h, &path, data.as_slice())
                .map_err(io_at(src))?;
        }
    }
    b.into_inner().map_err(io_at(Path::new("layer")))
}

fn write_blob(out: &Path, bytes: &[u8]) -> Result<Digest, ImageError> {
    let digest = Digest::of_bytes(bytes);
    let path = out.join("blobs/sha256").join(digest.hex());
    fs::write(&path, bytes).map_err(io_at(&path))?;
    Ok(digest)
}

fn oci_digest(d: &Digest) -> Result<oci_spec::image::Digest, ImageError> {
    oci_spec::image::Digest::from_str(&d.to_string()).map_err(spec_err)
}

/// Build the image layout into `out` (created; must not exist) and return the manifest digest.
///
/// # Errors
/// A source file is unreadable, the spec is not buildable, or `out` cannot be written.
pub fn build(spec: &ImageSpec, out: &Path) -> Result<Digest, ImageError> {
    if out.exists() {
        return Err(ImageError::OutExists {
            path: out.to_path_buf(),
        });
    }
    fs::create_dir_all(out.join("blobs/sha256")).map_err(io_at(out))?;
    let tar = layer_tar(spec)?;
    let diff_id = Digest::of_bytes(&tar);
    let mut gz = flate2::GzBuilder::new()
        .mtime(0)
        .write(Vec::new(), flate2::Compression::new(6));
    gz.write_all(&tar).map_err(io_at(out))?;
    let layer = gz.finish().map_err(io_at(out))?;
    let layer_digest = write_blob(out, &layer)?;

    let mut config = ConfigBuilder::default().env(spec.env.clone());
    if !spec.entrypoint.is_empty() {
        config = config.entrypoint(spec.entrypoint.clone());
    }
    if let Some(w) = &spec.workdir {
        config = config.working_dir(w.clone());
    }
    let image_config = ImageConfigurationBuilder::default()
        .architecture(oci_spec::image::Arch::Amd64)
        .os(oci_spec::image::Os::Linux)
        .config(config.build().map_err(spec_err)?)
        .rootfs(
            RootFsBuilder::default()
                .typ("layers")
                .diff_ids(vec![diff_id.to_string()])
                .build()
                .map_err(spec_err)?,
        )
        .build()
        .map_err(spec_err)?;
    let config_json = to_canonical_json(&image_config)?;
    let config_digest = write_blob(out, config_json.as_bytes())?;
    let manifest = ImageManifestBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageManifest)
        .config(
            DescriptorBuilder::default()
                .media_type(MediaType::ImageConfig)
                .digest(oci_digest(&config_digest)?)
                .size(config_json.len() as u64)
                .build()
                .map_err(spec_err)?,
        )
        .layers(vec![
            DescriptorBuilder::default()
                .media_type(MediaType::ImageLayerGzip)
                .digest(oci_digest(&layer_digest)?)
                .size(layer.len() as u64)
                .build()
                .map_err(spec_err)?,
        ])
        .build()
        .map_err(spec_err)?;
    let manifest_json = to_canonical_json(&manifest)?;
    let manifest_digest = write_blob(out, manifest_json.as_bytes())?;
    let index = ImageIndexBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageIndex)
        .manifests(vec![
            DescriptorBuilder::default()
                .media_type(MediaType::ImageManifest)
                .digest(oci_digest(&manifest_digest)?)
                .size(manifest_json.len() as u64)
                .annotations(
                    [(
                        "org.opencontainers.image.ref.name".to_owned(),
                        spec.name.clone(),
                    )]
                    .into_iter()
                    .collect::<std::collections::HashMap<_, _>>(),
                )
                .build()
                .map_err(spec_err)?,
        ])
        .build()
        .map_err(spec_err)?;
    let index_json = to_canonical_json(&index)?;
    fs::write(out.join("index.json"), index_json).map_err(io_at(out))?;
    fs::write(out.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).map_err(io_at(out))?;
    Ok(manifest_digest)
}

/// A verified image: its manifest, its config and its layers' blob paths.
#[derive(Debug, Clone)]
pub struct Verified {
    /// The manifest digest.
    pub manifest: Digest,
    /// The image configuration.
    pub config: ImageConfiguration,
    /// The gzip layer blobs, in order.
    pub layers: Vec<PathBuf>,
    /// What the layers hold, as the safe reader admitted it.
    pub contents: Contents,
}

/// What a verified image's layers hold — every regular file (executable or not, size, sha256)
/// and every directory — and so exactly what its unpacked rootfs must be.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Contents {
    files: BTreeMap<String, (bool, u64, Digest)>,
    dirs: BTreeSet<String>,
}

impl Contents {
    /// Add one layer's members; a path two layers both hold is refused (unpack creates every
    /// file exclusively, so it could not be unpacked either).
    fn add(
        &mut self,
        scanned: &archive::Scanned,
        bad: impl Fn(String) -> ImageError,
    ) -> Result<(), ImageError> {
        for m in &scanned.files {
            let entry = (m.executable, m.size, m.sha256);
            if self.files.insert(m.path.clone(), entry).is_some() || self.dirs.contains(&m.path) {
                return Err(bad(format!("{} is in two layers", m.path)));
            }
        }
        for d in &scanned.dirs {
            if self.files.contains_key(d) {
                return Err(bad(format!("{d} is a file and a directory")));
            }
            self.dirs.insert(d.clone());
        }
        Ok(())
    }

    /// Check the unpacked `rootfs` against these contents, re-hashing every file: the tree
    /// holds exactly these directories (0555) and files (0444, or 0555 when executable), each
    /// of this size and sha256, with one link and no extended attribute but an SELinux label,
    /// every entry owned by `owner`, nothing else (no symbolic link, device, socket or extra
    /// entry). What it cannot close: a change between this check and the runtime's mount.
    ///
    /// # Errors
    /// [`ImageError::Tampered`] naming the first difference.
    pub fn check(&self, rootfs: &Path, owner: u32) -> Result<(), ImageError> {
        let tampered = |why: String| ImageError::Tampered {
            rootfs: rootfs.to_path_buf(),
            why,
        };
        let mut seen_files = 0usize;
        let mut seen_dirs = 0usize;
        crate::walk::walk(rootfs, &mut |n| -> Result<(), ImageError> {
            if n.stat.uid != owner {
                return Err(tampered(format!("{:?} is not the store owner's", n.path)));
            }
            match n.stat.kind {
                crate::walk::Kind::Dir => {
                    if !n.path.is_empty() && !self.dirs.contains(n.path) {
                        return Err(tampered(format!("{:?} is not in the image", n.path)));
                    }
                    if n.stat.mode != 0o555 {
                        return Err(tampered(format!(
                            "{:?} has mode {:o}, not 0555",
                            n.path, n.stat.mode
                        )));
                    }
                    seen_dirs += usize::from(!n.path.is_empty());
                    Ok(())
                }
                crate::walk::Kind::File => {
                    let Some((exec, size, sha256)) = self.files.get(n.path) else {
                        return Err(tampered(format!("{:?} is not in the image", n.path)));
                    };
                    let mode = if *exec { 0o555 } else { 0o444 };
                    if n.stat.mode != mode || n.stat.size != *size {
                        return Err(tampered(format!(
                            "{:?} has mode {:o} and {} bytes, not {mode:o} and {size}",
                            n.path, n.stat.mode, n.stat.size
                        )));
                    }
                    // One link: a second name for the inode (outside the store, say) could
                    // change the bytes after this check.
                    if n.stat.nlink != 1 {
                        return Err(tampered(format!(
                            "{:?} has {} links, not 1",
                            n.path, n.stat.nlink
                        )));
                    }
                    let file = n
                        .open()
                        .map_err(|e| tampered(format!("{:?} cannot be read: {e}", n.path)))?;
                    // No extended attribute but the security module's label: file
                    // capabilities and the like are not in the image.
                    let unreadable =
                        |e: rustix::io::Errno| tampered(format!("{:?} attributes: {e}", n.path));
                    let size = rustix::fs::flistxattr_query(&file).map_err(unreadable)?;
                    if size > 0 {
                        let mut names = vec![0u8; size];
                        let len =
                            rustix::fs::flistxattr(&file, &mut names[..]).map_err(unreadable)?;
                        if let Some(other) = names[..len.min(size)]
                            .split(|b| *b == 0)
                            .find(|x| !x.is_empty() && *x != b"security.selinux")
                        {
                            return Err(tampered(format!(
                                "{:?} carries the attribute {:?}",
                                n.path,
                                String::from_utf8_lossy(other)
                            )));
                        }
                    }
                    let (digest, _) = Digest::of_reader(file)
                        .map_err(|e| tampered(format!("{:?} cannot be read: {e}", n.path)))?;
                    if digest != *sha256 {
                        return Err(tampered(format!("{:?} is not the image's bytes", n.path)));
                    }
                    seen_files += 1;
                    Ok(())
                }
                other => Err(tampered(format!("{:?} is a {other:?}", n.path))),
            }
        })
        .map_err(|e| match e {
            ImageError::Seal(w) => tampered(w.to_string()),
            other => other,
        })?;
        // Every entry seen was one of the image's, once: equal counts mean none is missing.
        if seen_files != self.files.len() || seen_dirs != self.dirs.len() {
            return Err(tampered(format!(
                "{} of {} files and {} of {} directories are there",
                seen_files,
                self.files.len(),
                seen_dirs,
                self.dirs.len()
            )));
        }
        Ok(())
    }
}

/// Read a blob, checking its sha256 and size against a descriptor.
fn read_blob(dir: &Path, digest: &str, size: u64) -> Result<Vec<u8>, ImageError> {
    let bad = |why: String| ImageError::Verify {
        dir: dir.to_path_buf(),
        why,
    };
    let d = Digest::from_str(digest).map_err(|_| bad(format!("digest {digest:?}")))?;
    let path = dir.join("blobs/sha256").join(d.hex());
    let mut bytes = Vec::new();
    store::open_nofollow(&path)
        .map_err(|e| bad(format!("blob {d}: {e}")))?
        .read_to_end(&mut bytes)
        .map_err(io_at(&path))?;
    if Digest::of_bytes(&bytes) != d {
        return Err(bad(format!("blob {d} does not hash to its name")));
    }
    if bytes.len() as u64 != size {
        return Err(bad(format!(
            "blob {d} is {} bytes, its descriptor says {size}",
            bytes.len()
        )));
    }
    Ok(bytes)
}

/// Verify the layout in `dir` against the pinned manifest digest.
///
/// # Errors
/// [`ImageError::Verify`] naming the first thing that does not match.
pub fn verify(dir: &Path, manifest: &Digest) -> Result<Verified, ImageError> {
    let bad = |why: String| ImageError::Verify {
        dir: dir.to_path_buf(),
        why,
    };
    // Nothing there is a layout never built or put there, not one that fails: say how to
    // make it, never "re-pin".
    if let Err(e) = fs::symlink_metadata(dir) {
        return Err(match e.kind() {
            io::ErrorKind::NotFound => ImageError::Missing {
                dir: dir.to_path_buf(),
            },
            _ => bad(e.to_string()),
        });
    }
    let layout =
        fs::read_to_string(dir.join("oci-layout")).map_err(|e| bad(format!("oci-layout: {e}")))?;
    let layout: serde_json::Value =
        serde_json::from_str(&layout).map_err(|e| bad(format!("oci-layout: {e}")))?;
    if layout["imageLayoutVersion"] != "1.0.0" {
        return Err(bad("oci-layout is not version 1.0.0".into()));
    }
    let index_text =
        fs::read(dir.join("index.json")).map_err(|e| bad(format!("index.json: {e}")))?;
    let index: ImageIndex =
        serde_json::from_slice(&index_text).map_err(|e| bad(format!("index.json: {e}")))?;
    let wanted = manifest.to_string();
    let desc = index
        .manifests()
        .iter()
        .find(|d| d.digest().to_string() == wanted)
        .ok_or_else(|| bad(format!("index.json does not name manifest {manifest}")))?;
    let manifest_bytes = read_blob(dir, &wanted, desc.size())?;
    let m: ImageManifest =
        serde_json::from_slice(&manifest_bytes).map_err(|e| bad(format!("manifest: {e}")))?;
    let c = m.config();
    let config_bytes = read_blob(dir, c.digest().as_ref(), c.size())?;
    let config: ImageConfiguration =
        serde_json::from_slice(&config_bytes).map_err(|e| bad(format!("config: {e}")))?;
    if config.rootfs().diff_ids().len() != m.layers().len() {
        return Err(bad("the config's diff_ids do not match the layers".into()));
    }
    let mut layers = Vec::new();
    let mut contents = Contents::default();
    for (layer, diff_id) in m.layers().iter().zip(config.rootfs().diff_ids()) {
        if layer.media_type() != &MediaType::ImageLayerGzip {
            return Err(bad(format!(
                "layer media type {} is not admitted",
                layer.media_type()
            )));
        }
        let bytes = read_blob(dir, layer.digest().as_ref(), layer.size())?;
        // One pass over the uncompressed layer: its sha256 (the diff_id) and, through the same
        // safe reader that unpacks it, every member it holds — what its rootfs must be.
        let scanned = archive::scan(
            flate2::read::GzDecoder::new(bytes.as_slice()),
            &layer_limits(),
            &mut archive::Discard,
        )?;
        contents.add(&scanned, |why| bad(format!("layer: {why}")))?;
        let uncompressed = scanned.archive_sha256;
        if uncompressed.to_string() != *diff_id {
            return Err(bad(format!(
                "layer diff_id is {uncompressed}, the config says {diff_id}"
            )));
        }
        layers.push(dir.join("blobs/sha256").join(layer.digest().digest()));
    }
    Ok(Verified {
        manifest: *manifest,
        config,
        layers,
        contents,
    })
}

/// A sink that writes a layer into a directory: files 0444 or 0555, directories 0755 until
/// sealed.
struct DirSink {
    root: PathBuf,
}

impl Sink for DirSink {
    fn file(
        &mut self,
        path: &str,
        executable: bool,
        _size: u64,
    ) -> io::Result<Box<dyn Write + '_>> {
        let dest = self.root.join(path);
        if let Some(parent) = dest.parent() {
            fs::create_dir_all(parent)?;
        }
        let mode = if executable { 0o555 } else { 0o444 };
        let file = store::create_exclusive(&dest, 0o600).map_err(io::Error::other)?;
        file.set_permissions(fs::Permissions::from_mode(mode))?;
        Ok(Box::new(file))
    }

    fn dir(&mut self, path: &str) -> io::Result<()> {
        fs::create_dir_all(self.root.join(path))
    }
}

/// The root filesystem of a verified image, unpacked once into `images/<manifest hex>/rootfs`
/// (files 0444/0555, directories 0555, owned by the store's owner) and reused after.
///
/// # Errors
/// Verification, a layer, or the store failed.
pub fn unpack(store: &Store, dir: &Path, manifest: &Digest) -> Result<PathBuf, ImageError> {
    let target = store.path("images", &manifest.hex());
    let rootfs = target.join("rootfs");
    let verified = verify(dir, manifest)?;
    // Everything under the store is its owner's (whoever runs its stages).
    let owner = std::os::unix::fs::MetadataExt::uid(
        &fs::metadata(store.root()).map_err(io_at(store.root()))?,
    );
    // A cached rootfs is checked at every use against what the verified layers hold: the
    // layout is re-verified each run, and the tree mounted into a container must be too.
    if fs::symlink_metadata(&target).is_ok() {
        verified.contents.check(&rootfs, owner)?;
        return Ok(rootfs);
    }
    let mut scratch = store.scratch()?;
    let staged = scratch.fresh_name("image");
    let root = staged.join("rootfs");
    fs::create_dir_all(&root).map_err(io_at(&root))?;
    for layer in &verified.layers {
        let file = store::open_nofollow(layer)?;
        let mut sink = DirSink { root: root.clone() };
        archive::scan(file, &layer_limits(), &mut sink)?;
    }
    seal(&root)?;
    // What was just written is checked like a cached one: the same rule, on first use too.
    verified.contents.check(&root, owner)?;
    // Moved while still writable (another parent means a new `..`, which needs write
    // permission for anyone but root), sealed right after.
    match store::rename_noreplace(&staged, &target) {
        Ok(()) => {
            fs::set_permissions(&target, fs::Permissions::from_mode(0o555))
                .map_err(io_at(&target))?;
            store::fsync_dir(&store.root().join("images"))?;
        }
        Err(e) if store::is_exists(&e) => {}
        Err(e) => return Err(e.into()),
    }
    Ok(rootfs)
}

/// Make every directory under `root` 0555 and every time zero, deepest first: the entries are
/// found on the one tree walk, a directory always after its parent, so in reverse a directory
/// is sealed only after everything inside it.
fn seal(root: &Path) -> Result<(), ImageError> {
    let mut found: Vec<(PathBuf, bool)> = Vec::new();
    crate::walk::walk(root, &mut |n| -> Result<(), ImageError> {
        found.push((root.join(n.path), n.stat.kind == crate::walk::Kind::Dir));
        Ok(())
    })?;
    for (path, dir) in found.iter().rev() {
        if *dir {
            fs::set_permissions(path, fs::Permissions::from_mode(0o555)).map_err(io_at(path))?;
        }
        store::zero_mtime(path)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(dir: &Path) -> ImageSpec {
        let file = dir.join("tool");
        fs::write(&file, b"#!/bin/sh\necho tool\n").unwrap();
        ImageSpec {
            name: "unit".into(),
            files: [("/bin/tool".to_owned(), (file, 0o555))].into(),
            dirs: [("/tmp".to_owned(), 0o755)].into(),
            env: vec!["PATH=/bin".into()],
            entrypoint: vec!["/bin/tool".into()],
            workdir: None,
        }
    }

    #[test]
    fn layouts_are_byte_reproducible_verified_and_unpacked_read_only() {
        let dir = tempfile::tempdir().unwrap();
        let s = spec(dir.path());
        let a = build(&s, &dir.path().join("a")).unwrap();
        let b = build(&s, &dir.path().join("b")).unwrap();
        assert_eq!(a, b, "the same spec is the same manifest digest");
        verify(&dir.path().join("a"), &a).unwrap();
        assert!(matches!(
            verify(&dir.path().join("a"), &Digest::of_bytes(b"other")),
            Err(ImageError::Verify { .. })
        ));
        // No layout there: missing, with how to build one, never "re-pin".
        let e = verify(&dir.path().join("absent"), &a).unwrap_err();
        assert!(matches!(&e, ImageError::Missing { .. }), "{e:?}");
        let help = miette::Diagnostic::help(&e).unwrap().to_string();
        assert!(
            help.contains("cordon-image build") && !help.contains("re-pin"),
            "{help}"
        );
        let store = Store::open(&dir.path().join("store")).unwrap();
        let root = unpack(&store, &dir.path().join("a"), &a).unwrap();
        let m = fs::metadata(root.join("bin/tool")).unwrap();
        assert_eq!(m.permissions().mode() & 0o7777, 0o555);
        // A flipped byte in a blob is refused.
        let blobs = dir.path().join("b/blobs/sha256");
        let mut flipped = false;
        for e in fs::read_dir(&blobs).unwrap() {
            let p = e.unwrap().path();
            let mut bytes = fs::read(&p).unwrap();
            if bytes.len() > 100 && !flipped {
                bytes[50] ^= 1;
                let mut perm = fs::metadata(&p).unwrap().permissions();
                perm.set_mode(0o644);
                fs::set_permissions(&p, perm).unwrap();
                fs::write(&p, bytes).unwrap();
                flipped = true;
            }
        }
        assert!(flipped);
        assert!(matches!(
            verify(&dir.path().join("b"), &b),
            Err(ImageError::Verify { .. })
        ));
    }
}
