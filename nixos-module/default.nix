# services.cordon — cordon on a NixOS evaluator host.
#
# What this module owns: the rendered policies in /etc/cordon (checked at build time), the store
# and run directories, startup recovery and the recovery timer, the agent surface's unprivileged
# service, the host's kernel settings that seed 001 asks for, and the assertions that keep the
# per-run account range apart from every declared account. What it does not own: the stages
# themselves (operators and pipelines run cordon-fetch … cordon-verify as root, as on Debian),
# the images (the flake's image-prebuild / image-runtime packages), and the reviewed policy's
# content — the module substitutes only host paths, the runtime's digest and the account ranges,
# on the exact lines that name them (policy.nix), and a derivation prints the difference for the
# reviewer (`cordonPolicyDiff` below).
#
# Checked on a Debian host (checks/nix.sh): this file parses and evaluates against a stub of
# nixpkgs; the rendered units pass `systemd-analyze security --offline=yes`; the rendered policy
# passes `cordon-policy check`. Checked only on a Nix host: everything that needs nixpkgs itself
# (the package build, `nix flake check`, the NixOS VM test).
#
# From the flake: `cordonPackages` is the flake's `packages` (the default package and the images).
{
  cordonPackages ? { },
}:
{
  config,
  lib,
  pkgs,
  ...
}:
let
  inherit (lib) mkOption mkEnableOption mkIf types;
  cfg = config.services.cordon;
  surface = cfg.surface;

  runtimeBinary = "${cfg.runtimePackage}/bin/${cfg.runtime}";
  nologin = "${pkgs.shadow}/bin/nologin";

  # A reviewed policy rendered for this host and checked by cordon-policy at build time.
  render =
    name: args:
    let
      template = pkgs.writeText "${name}.template.kdl" (import ./policy.nix args);
    in
    pkgs.runCommand "${name}.kdl" { passthru = { inherit template; }; } ''
      ${pkgs.bash}/bin/bash ${./render-policy.sh} ${template} ${runtimeBinary} \
        ${cfg.package}/bin/cordon-policy $out
    '';
  common = {
    inherit (cfg) store runtime;
    runtimePath = runtimeBinary;
  };
  evaluatorPolicy = render "cordon-policy" (
    common
    // {
      text = builtins.readFile cfg.policy;
      required = [
        "store"
        "runtime"
        "run-dir"
        "uid-range"
        "gid-range"
        "shell"
      ];
      runDir = cfg.runDir;
      uidRange = cfg.accounts.uidRange;
      gidRange = cfg.accounts.gidRange;
      inherit nologin;
    }
  );
  surfacePolicy = render "cordon-surface" (
    common
    // {
      text = builtins.readFile surface.policy;
      required = [
        "store"
        "runtime"
        "state-dir"
      ];
      stateDir = surface.stateDir;
    }
  );
  # For the reviewer: what rendering changed, as cordon-policy reads it.
  policyDiff =
    reviewed: rendered:
    pkgs.runCommand "cordon-policy-diff" { } ''
      ${cfg.package}/bin/cordon-policy diff ${reviewed} ${rendered} > $out || true
    '';

  range =
    what: default:
    mkOption {
      description = "The per-run ${what} range (first and last, inclusive), substituted into the policy's ${what}-range.";
      type = types.submodule {
        options = {
          first = mkOption { type = types.ints.positive; };
          last = mkOption { type = types.ints.positive; };
        };
      };
      inherit default;
    };

  # Every id a declared user, group or subordinate range holds: the per-run range must miss them.
  declaredUids = builtins.filter (u: u != null) (lib.mapAttrsToList (_: u: u.uid or null) config.users.users);
  declaredGids = builtins.filter (g: g != null) (lib.mapAttrsToList (_: g: g.gid or null) config.users.groups);
  subRanges =
    attr:
    lib.concatLists (
      lib.mapAttrsToList (
        _: u:
        builtins.map (r: {
          first = r.startUid or r.startGid;
          last = (r.startUid or r.startGid) + r.count - 1;
        }) (u.${attr} or [ ])
      ) config.users.users
    );
  inRange = r: id: id >= r.first && id <= r.last;
  overlaps = a: b: a.first <= b.last && b.first <= a.last;
  collisions =
    r: ids: subs:
    builtins.filter (inRange r) ids ++ builtins.map (s: s.first) (builtins.filter (overlaps r) subs);

  # Controls every unit gets. None of them implies a private mount namespace (see rootUnit).
  baseHardening = {
    NoNewPrivileges = true;
    LockPersonality = true;
    MemoryDenyWriteExecute = true;
    RestrictRealtime = true;
    RestrictSUIDSGID = true;
    SystemCallArchitectures = "native";
    ProtectClock = true;
    ProtectHostname = true;
    UMask = "0077";
  };
  # The root units change host state that a private mount namespace would hide from them:
  # they unmount a dead lease's mounts and must see and remove them in the host's namespace
  # (an unmount in a private namespace would leave the host's mount in place and let the
  # quiescence check, run in the same private namespace, report "nothing there"). So none of
  # ProtectSystem, ProtectHome, PrivateTmp, PrivateDevices, ReadWritePaths, ProtectKernel*,
  # ProtectControlGroups: each of them makes a mount namespace. What they keep, and why:
  rootUnit = description: args: {
    inherit description;
    path = [ ];
    serviceConfig = baseHardening // {
      Type = "oneshot";
      ExecStart = "${cfg.package}/bin/cordon-reap --policy /etc/cordon/policy.kdl ${args}";
      # Only local sockets: runc's console and notify sockets; no network at all.
      RestrictAddressFamilies = [ "AF_UNIX" ];
      # Recovery creates no namespaces; runc delete and kill enter none.
      RestrictNamespaces = true;
      SystemCallFilter = [
        "@system-service"
        "@mount"
        "@privileged"
        "~@obsolete @cpu-emulation @debug @raw-io @reboot @swap @clock @module"
      ];
      CapabilityBoundingSet = [
        # umount a dead lease's mounts; remove its cgroup
        "CAP_SYS_ADMIN"
        # end a dead lease's processes, which run as its per-run uid
        "CAP_KILL"
        # remove run directories and accounts' files owned by per-run uids
        "CAP_DAC_OVERRIDE"
        "CAP_DAC_READ_SEARCH"
        "CAP_FOWNER"
        # read /proc/<pid>/ns of per-run processes to prove a pid namespace empty
        "CAP_SYS_PTRACE"
        # userdel and groupdel of a dead lease's account (shadow-utils' audit record)
        "CAP_CHOWN"
        "CAP_AUDIT_WRITE"
      ];
    };
  };
in
{
  options.services.cordon = {
    enable = mkEnableOption "cordon, the containment toolchain for hostile evaluation code";
    package = mkOption {
      type = types.package;
      default = cordonPackages.${pkgs.stdenv.hostPlatform.system}.default;
      description = "The cordon package: every binary the authority identity hashes, unwrapped.";
    };
    policy = mkOption {
      type = types.path;
      default = ../policy/evaluator.kdl;
      description = "The reviewed policy. Only host paths, the runtime's digest and the account ranges are substituted; /etc/cordon/policy.kdl is the checked result.";
    };
    store = mkOption {
      type = types.str;
      default = "/var/lib/cordon/store";
      description = "The validator-owned store (root, 0700).";
    };
    runDir = mkOption {
      type = types.str;
      default = "/run/cordon";
      description = "The root of per-lease run directories (root, 0711).";
    };
    executor = mkOption {
      type = types.str;
      default = "evaluator";
      description = "The executor id: the policy's name unless stages are run with --executor.";
    };
    runtime = mkOption {
      type = types.enum [
        "runc"
        "crun"
        "runsc"
      ];
      default = "runc";
      description = "The OCI runtime the policy names; its binary is pinned by sha256 at build time.";
    };
    runtimePackage = mkOption {
      type = types.package;
      default =
        {
          runc = pkgs.runc;
          crun = pkgs.crun;
          runsc = pkgs.gvisor;
        }
        .${cfg.runtime};
      description = "The package holding bin/<runtime>.";
    };
    runtimeMinVersion = mkOption {
      type = types.str;
      default = "1.1.5";
      description = "The oldest runtime version the module accepts (an assertion); the policy's min-version is checked again at every stage start.";
    };
    accounts = {
      uidRange = range "uid" {
        first = 3000000;
        last = 3099999;
      };
      gidRange = range "gid" {
        first = 3000000;
        last = 3099999;
      };
    };
    activationWait = mkOption {
      type = types.ints.positive;
      default = 600;
      description = "Seconds activation waits for running stages to end before it rewrites /etc/passwd; past that, activation fails instead of removing a live per-run account.";
    };
    recoveryInterval = mkOption {
      type = types.str;
      default = "1min";
      description = "How often cordon-reap ends leases past their deadline or whose supervisor died.";
    };
    host = {
      ptraceScope = mkOption {
        type = types.ints.between 1 3;
        default = 2;
        description = "kernel.yama.ptrace_scope: 2 lets only CAP_SYS_PTRACE attach (cordon's root stages have it; no per-run uid does). 3 would stop recovery's proofs.";
      };
      kptrRestrict = mkOption {
        type = types.ints.between 0 2;
        default = 2;
        description = "kernel.kptr_restrict: hide kernel addresses from every user.";
      };
      dmesgRestrict = mkOption {
        type = types.bool;
        default = true;
        description = "kernel.dmesg_restrict.";
      };
      unprivilegedBpfDisabled = mkOption {
        type = types.ints.between 0 2;
        default = 1;
        description = "kernel.unprivileged_bpf_disabled: 1 cannot be undone without a reboot.";
      };
      bpfJitHarden = mkOption {
        type = types.ints.between 0 2;
        default = 2;
        description = "net.core.bpf_jit_harden.";
      };
    };
    surface = {
      enable = mkEnableOption "the agent surface's unprivileged service (seed 002: never root)";
      user = mkOption {
        type = types.str;
        default = "cordon-agent";
        description = "The service user the agent and cordon-surface run as: never root, no supplementary groups.";
      };
      policy = mkOption {
        type = types.path;
        description = "The reviewed surface policy. Its read set names host paths, so there is no default: Debian's example reads /usr and /lib, which a NixOS host does not have.";
      };
      stateDir = mkOption {
        type = types.str;
        default = "/var/lib/cordon-agent/surface";
        description = "The surface's state directory (the service user's, 0700).";
      };
      workspace = mkOption {
        type = types.str;
        default = "/var/lib/cordon-agent/workspace";
        description = "The agent's workspace: the one writable path, owned by the service user.";
      };
      network = mkOption {
        type = types.enum [
          "none"
          "ip"
        ];
        default = "none";
        description = "The agent service's own network: none (a private network namespace; reach the model through a socket the integrator provides) or ip (the host's network, for an agent that calls its model directly; `systemd-analyze security` scores it higher). The commands it runs have no network either way.";
      };
      command = mkOption {
        type = types.listOf types.str;
        description = "The agent program and its arguments; it runs each command with cordon-surface run --policy /etc/cordon/surface.kdl --workspace <workspace>.";
      };
    };
  };

  config = mkIf cfg.enable {
    assertions = [
      {
        assertion = cfg.accounts.uidRange.first <= cfg.accounts.uidRange.last;
        message = "services.cordon.accounts.uidRange: first is past last";
      }
      {
        assertion = cfg.accounts.gidRange.first <= cfg.accounts.gidRange.last;
        message = "services.cordon.accounts.gidRange: first is past last";
      }
      {
        assertion = collisions cfg.accounts.uidRange declaredUids (subRanges "subUidRanges") == [ ];
        message = "services.cordon.accounts.uidRange overlaps declared uids or subuid ranges: ${
          builtins.toJSON (collisions cfg.accounts.uidRange declaredUids (subRanges "subUidRanges"))
        }";
      }
      {
        assertion = collisions cfg.accounts.gidRange declaredGids (subRanges "subGidRanges") == [ ];
        message = "services.cordon.accounts.gidRange overlaps declared gids or subgid ranges: ${
          builtins.toJSON (collisions cfg.accounts.gidRange declaredGids (subRanges "subGidRanges"))
        }";
      }
      {
        assertion = lib.versionAtLeast (lib.getVersion cfg.runtimePackage) cfg.runtimeMinVersion;
        message = "services.cordon.runtimePackage is older than runtimeMinVersion ${cfg.runtimeMinVersion}";
      }
      {
        # Per-run accounts are made with useradd and removed with userdel; the activation hold
        # below is written for the users activation script, not for sysusers or userborn.
        assertion = !(config.systemd.sysusers.enable or false) && !(config.services.userborn.enable or false);
        message = "services.cordon: per-run accounts need the users activation script; systemd.sysusers and services.userborn are not supported";
      }
      {
        assertion = !surface.enable || surface.user != "root";
        message = "services.cordon.surface.user: the surface never runs as root";
      }
    ];

    boot.kernel.sysctl = {
      "kernel.yama.ptrace_scope" = cfg.host.ptraceScope;
      "kernel.kptr_restrict" = cfg.host.kptrRestrict;
      "kernel.dmesg_restrict" = if cfg.host.dmesgRestrict then 1 else 0;
      "kernel.unprivileged_bpf_disabled" = cfg.host.unprivilegedBpfDisabled;
      "net.core.bpf_jit_harden" = cfg.host.bpfJitHarden;
    };

    environment.systemPackages = [ cfg.package ];
    # Copies, not links into the store: the surface refuses a policy path it cannot trust, and
    # the stages read the file the reviewer diffed.
    environment.etc."cordon/policy.kdl" = {
      source = evaluatorPolicy;
      mode = "0444";
    };
    environment.etc."cordon/surface.kdl" = mkIf surface.enable {
      source = surfacePolicy;
      mode = "0444";
    };
    system.extraDependencies = [ (policyDiff cfg.policy evaluatorPolicy) ];

    systemd.tmpfiles.rules = [
      "d /var/lib/cordon 0700 root root -"
      "d ${cfg.store} 0700 root root -"
      # 0711: per-run uids traverse to their own lease directory (0711 too); none may list it.
      "d ${cfg.runDir} 0711 root root -"
    ]
    ++ lib.optionals surface.enable [
      "d /var/lib/cordon-agent 0700 ${surface.user} ${surface.user} -"
      "d ${surface.workspace} 0700 ${surface.user} ${surface.user} -"
      "d ${surface.stateDir} 0700 ${surface.user} ${surface.user} -"
    ];

    # Per-run accounts on NixOS: with users.mutableUsers = false, the users activation script
    # rewrites /etc/passwd and /etc/group from the declared users. A per-run account exists only
    # while a container stage holds its executor's lock alone, so activation takes that lock
    # first (waiting up to activationWait seconds) and keeps it until activation ends: no stage
    # starts, and none is running, while the files are rewritten. If the lock cannot be had,
    # activation fails rather than remove a live account.
    system.activationScripts.cordonHoldLeases = {
      deps = [ ];
      text = ''
        install -d -m 0700 /run/cordon-locks
        exec {cordon_lock}>>/run/cordon-locks/${cfg.executor}.lock
        chmod 0600 /run/cordon-locks/${cfg.executor}.lock
        if ! ${pkgs.util-linux}/bin/flock -x -w ${toString cfg.activationWait} "$cordon_lock"; then
          echo "cordon: stages of executor ${cfg.executor} still hold their lock after ${toString cfg.activationWait} s; refusing to rewrite /etc/passwd under them" >&2
          exit 1
        fi
      '';
    };
    system.activationScripts.users.deps = [ "cordonHoldLeases" ];

    systemd.services.cordon-recover = lib.recursiveUpdate (rootUnit "cordon startup recovery" "") {
      # Before any login, so before anything may start a lease.
      wantedBy = [ "multi-user.target" ];
      before = [ "systemd-user-sessions.service" ] ++ lib.optional surface.enable "cordon-agent.service";
      after = [ "local-fs.target" ];
      serviceConfig.RemainAfterExit = true;
    };
    systemd.services.cordon-reap = rootUnit "cordon: release expired leases and those whose supervisor died" "";
    systemd.timers.cordon-reap = {
      wantedBy = [ "timers.target" ];
      timerConfig = {
        OnBootSec = cfg.recoveryInterval;
        OnUnitActiveSec = cfg.recoveryInterval;
      };
    };

    users.users = mkIf surface.enable {
      ${surface.user} = {
        isSystemUser = true;
        group = surface.user;
        home = "/var/lib/cordon-agent";
        # Rootless runc maps the service user alone: no subordinate ranges.
        extraGroups = [ ];
      };
    };
    users.groups = mkIf surface.enable { ${surface.user} = { }; };

    systemd.services.cordon-agent = mkIf surface.enable {
      description = "An agent bounded by its workspace (cordon-surface)";
      wantedBy = [ "multi-user.target" ];
      after = [ "cordon-recover.service" ];
      path = [ cfg.package ];
      # Not MemoryDenyWriteExecute: systemd applies it as a seccomp filter that every command the
      # agent runs would inherit, and it breaks any JIT (node, the JVM) inside the surface.
      serviceConfig = builtins.removeAttrs baseHardening [ "MemoryDenyWriteExecute" ] // {
        User = surface.user;
        Group = surface.user;
        SupplementaryGroups = [ ];
        ExecStart = lib.escapeShellArgs surface.command;
        ProtectSystem = "strict";
        ReadWritePaths = [ "/var/lib/cordon-agent" ];
        ProtectHome = true;
        PrivateTmp = true;
        PrivateDevices = true;
        ProtectKernelTunables = true;
        ProtectKernelModules = true;
        ProtectKernelLogs = true;
        ProtectControlGroups = true;
        ProtectProc = "invisible";
        ProcSubset = "all";
        RemoveIPC = true;
        KeyringMode = "private";
        # Rootless runc: the pid file and console sockets, and netlink to bring up the
        # container's loopback in its own network namespace; IP only when the agent itself must
        # reach its model over the network (surface.network). Its commands get a network
        # namespace of their own with nothing in it either way.
        RestrictAddressFamilies = [
          "AF_UNIX"
          "AF_NETLINK"
        ]
        ++ lib.optionals (surface.network == "ip") [
          "AF_INET"
          "AF_INET6"
        ];
        PrivateNetwork = surface.network == "none";
        IPAddressDeny = if surface.network == "none" then "any" else "";
        PrivateMounts = true;
        # The surface makes user, mount, pid, ipc, uts, cgroup and network namespaces.
        RestrictNamespaces = [
          "user"
          "mnt"
          "pid"
          "ipc"
          "uts"
          "cgroup"
          "net"
        ];
        SystemCallFilter = [
          "@system-service"
          "@mount"
          "setns"
          "~@obsolete @cpu-emulation @debug @raw-io @reboot @swap @clock @module"
        ];
        CapabilityBoundingSet = [ "" ];
        AmbientCapabilities = [ "" ];
        DevicePolicy = "closed";
      };
    };
  };
}
