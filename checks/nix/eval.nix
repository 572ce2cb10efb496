# Evaluate cordon's flake outputs and NixOS module against checks/nix/stub.nix, with `settings`
# (the host configuration under test) over the options' defaults, and return what a reviewer and
# checks/nix.sh look at: failed assertions, the rendered units, kernel settings, tmpfiles, /etc
# entries, the activation hold, the policy templates and the flake's output names.
{settings ? {}}: let
  stub = import ./stub.nix;
  inherit (stub) lib;
  pkgs = stub.legacyPackages.x86_64-linux;
  flake = import ../../flake.nix;
  self = flake.outputs {
    inherit self;
    nixpkgs = stub;
  };
  module = self.nixosModules.default;

  # An option tree's values: the setting under test, else the default (a missing one is an
  # error only where something reads it); a submodule's options get the same, field by field.
  valuesOf = path: opts: set:
    builtins.mapAttrs (
      n: o:
        if (o._type or null) == "option" && o.type.name == "submodule"
        then valuesOf "${path}.${n}" o.type.module.options (set.${n} or {})
        else if (o._type or null) == "option"
        then
          (
            if set ? ${n}
            then set.${n}
            else if o ? default
            then o.default
            else throw "${path}.${n} has no default and is not set"
          )
        else valuesOf "${path}.${n}" o (set.${n} or {})
    )
    opts;
  orEmpty = x:
    if x == null
    then {}
    else x;
  # mkIf applied: a false condition removes the definition.
  resolve = v:
    if builtins.isAttrs v && (v._type or null) == "if"
    then
      (
        if v.condition
        then resolve v.content
        else null
      )
    else if builtins.isAttrs v && !(v ? outPath)
    then let
      r = builtins.mapAttrs (_: resolve) v;
    in
      builtins.removeAttrs r (builtins.filter (n: r.${n} == null) (builtins.attrNames r))
    else v;

  config = {
    services.cordon = valuesOf "services.cordon" moduleOut.options.services.cordon (
      settings.services.cordon or {}
    );
    users.users = (settings.users.users or {}) // orEmpty (out.users.users or null);
    users.groups = (settings.users.groups or {}) // orEmpty (out.users.groups or null);
    systemd.sysusers.enable = settings.systemd.sysusers.enable or false;
    containers = settings.containers or {};
  };
  moduleOut = module {
    inherit config lib pkgs;
    inherit (stub) utils;
  };
  out = orEmpty (resolve moduleOut.config);
in {
  failedAssertions = builtins.map (a: a.message) (
    builtins.filter (a: !a.assertion) (out.assertions or [])
  );
  services = out.systemd.services or {};
  timers = out.systemd.timers or {};
  sysctl = out.boot.kernel.sysctl or {};
  tmpfiles = out.systemd.tmpfiles.rules or [];
  etc = builtins.mapAttrs (_: e: {
    inherit (e) mode;
    reviewed = toString e.source.reviewed;
    inherit (e.source) facts;
    render = e.source.script;
    diff = e.source.diff.script;
  }) (out.environment.etc or {});
  activation = out.system.activationScripts or {};
  flake = {
    packages = builtins.attrNames self.packages.x86_64-linux;
    checks = builtins.attrNames self.checks.x86_64-linux;
    nixosModules = builtins.attrNames self.nixosModules;
    devShells = builtins.attrNames self.devShells.x86_64-linux;
    formatter = self.formatter.x86_64-linux.name;
    toolPath = self.packages.x86_64-linux.default.env.CORDON_TOOL_PATH;
    imagePrebuildArgs = self.packages.x86_64-linux.image-prebuild.args or null;
  };
}
