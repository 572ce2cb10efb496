# A stub of the few nixpkgs attributes cordon's flake and module use, so a host without nixpkgs
# (CI's Debian, with Debian's nix-bin) can evaluate them: structure, option defaults, assertions,
# and the rendered units and policy as JSON. It builds nothing: a "package" here is an attribute
# set with a store-like outPath. It is not nixpkgs' module system — eval.nix applies option
# defaults, the settings under test and mkIf, which is all the module relies on — so a module
# error that only nixpkgs' type checking would catch is caught only on a Nix host.
let
  pkg = name: extra:
    {
      inherit name;
      type = "derivation";
      outPath = "/nix/store/00000000000000000000000000000000-${name}";
    }
    // extra;
  option = args: {_type = "option";} // args;
  type = name: {inherit name;};
  lib = rec {
    mkOption = option;
    mkEnableOption = what:
      option {
        default = false;
        type = type "bool";
        description = "Whether to enable ${what}.";
      };
    mkIf = condition: content: {
      _type = "if";
      inherit condition content;
    };
    types = {
      str = type "str";
      bool = type "bool";
      path = type "path";
      package = type "package";
      enum = values: type "enum" // {inherit values;};
      listOf = t: type "listOf" // {of = t;};
      attrsOf = t: type "attrsOf" // {of = t;};
      submodule = m: type "submodule" // {module = m;};
      ints = {
        positive = type "positive";
        between = lo: hi: type "between" // {inherit lo hi;};
      };
    };
    mapAttrsToList = f: set: builtins.map (n: f n set.${n}) (builtins.attrNames set);
    filterAttrs = f: set:
      builtins.removeAttrs set (builtins.filter (n: !(f n set.${n})) (builtins.attrNames set));
    optionalAttrs = c: set:
      if c
      then set
      else {};
    unique = builtins.foldl' (acc: x:
      if builtins.elem x acc
      then acc
      else acc ++ [x]) [];
    concatLists = builtins.concatLists;
    optional = c: x:
      if c
      then [x]
      else [];
    optionals = c: xs:
      if c
      then xs
      else [];
    recursiveUpdate = a: b:
      a
      // builtins.mapAttrs (
        n: v:
          if builtins.isAttrs v && builtins.isAttrs (a.${n} or null)
          then recursiveUpdate a.${n} v
          else v
      )
      b;
    versionAtLeast = v: min: builtins.compareVersions v min >= 0;
    getVersion = p: p.version;
    escapeShellArg = a: "'${a}'";
    escapeShellArgs = args: builtins.concatStringsSep " " (builtins.map escapeShellArg args);
    concatStrings = builtins.concatStringsSep "";
    concatMap = f: xs: builtins.concatLists (builtins.map f xs);
    concatMapStrings = f: xs: builtins.concatStringsSep "" (builtins.map f xs);
    hasPrefix = p: s: builtins.substring 0 (builtins.stringLength p) s == p;
    removePrefix = p: s:
      if hasPrefix p s
      then builtins.substring (builtins.stringLength p) (builtins.stringLength s) s
      else s;
    literalExpression = text: {
      _type = "literalExpression";
      inherit text;
    };
    makeBinPath = ps: builtins.concatStringsSep ":" (builtins.map (p: "${p}/bin") ps);
    cleanSource = src: src;
    licenses.asl20 = "Apache-2.0";
  };
  pkgs = {
    stdenv.hostPlatform.system = "x86_64-linux";
    bash = pkg "bash" {};
    shadow = pkg "shadow" {};
    util-linux = pkg "util-linux" {};
    dpkg = pkg "dpkg" {};
    python3 = pkg "python3" {};
    runc = pkg "runc-1.3.0" {version = "1.3.0";};
    crun = pkg "crun-1.20" {version = "1.20";};
    gvisor = pkg "gvisor-20250101" {version = "20250101";};
    cargo-nextest = pkg "cargo-nextest" {};
    writeText = name: text: pkg name {inherit text;};
    writeShellScript = name: text: pkg name {inherit text;};
    # passthru attributes are attributes of the result, as in nixpkgs
    runCommand = name: env: script: pkg name ({inherit env script;} // env.passthru or {});
    fetchurl = args: pkg (baseNameOf (builtins.head args.urls)) {inherit (args) urls sha256;};
    mkShell = args: pkg "shell" args;
    testers.runNixOSTest = test: pkg "vm-test" {inherit test;};
    rustPlatform.buildRustPackage = args:
      pkg args.pname (
        args
        // {
          overrideAttrs = f: pkg args.pname (args // f args);
        }
      );
  };
in {
  inherit lib;
  # NixOS passes `utils` to modules; systemd's own quoting, as escapeSystemdExecArgs writes it.
  utils.escapeSystemdExecArgs = args: builtins.concatStringsSep " " (builtins.map builtins.toJSON args);
  legacyPackages.x86_64-linux =
    pkgs
    // {
      pkgsStatic = pkgs;
    };
}
