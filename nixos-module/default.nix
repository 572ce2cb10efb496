# services.cordon — cordon on a NixOS evaluator host.
#
# What this module owns: the rendered policies in /etc/cordon (made by `cordon-policy render`
# at build time, so a policy that does not check never reaches a host), the store and run
# directories, the image layouts where a stage reads them (/var/lib/cordon/images/ROLE, linked
# from the `images` option: the flake's image packages), startup recovery and the recovery
# timer for every executor the host uses, the agent surface's unprivileged service, the host's
# kernel settings that seed 001 asks for, and the assertions that keep the per-run account
# range apart from every declared account. What it does not own: the stages themselves
# (operators and pipelines run cordon-fetch … cordon-verify as root, as on Debian), the images'
# bytes (built by the flake), and the reviewed policy's content — rendering sets
# only host facts on their nodes (store, run-dir, the runtime's path and sha256, the account
# ranges and shell, the surface's state-dir) and refuses any other change; a derivation keeps
# the reviewed → rendered diff for the reviewer.
#
# Checked on a Debian host (checks/nix.sh): this file parses and evaluates against a stub of
# nixpkgs; the rendered units pass `systemd-analyze security --offline=yes` (Debian's systemd
# 252, on units written the way NixOS writes them); the render commands run against the real
# policy files. Checked only on a Nix host: everything that needs nixpkgs itself (the package
# build, `nix flake check`, the NixOS VM test) — none of it has run yet.
#
# From the flake: `cordonPackages` is the flake's `packages` (the default package and the images).
{cordonPackages ? {}}: {
  config,
  lib,
  pkgs,
  utils,
  ...
}: let
  inherit (lib) mkOption mkEnableOption mkIf types;
  cfg = config.services.cordon;
  surface = cfg.surface;

  runtimeBinary = "${cfg.runtimePackage}/bin/${cfg.runtime}";
  nologin = "${pkgs.shadow}/bin/nologin";

  # `cordon-policy render` arguments: the host facts set on a reviewed policy.
  evaluatorFacts =
    [
      "--store"
      cfg.store
      "--run-dir"
      cfg.runDir
      "--runtime"
      runtimeBinary
      "--uid-range"
      (toString cfg.accounts.uidRange.first)
      (toString cfg.accounts.uidRange.last)
      "--gid-range"
      (toString cfg.accounts.gidRange.first)
      (toString cfg.accounts.gidRange.last)
      "--shell"
      nologin
    ]
    # The pins of the images this host links (the flake's own builds unless set otherwise) and of
    # the worker the runtime image holds: a change of authority the diff beside the policy shows.
    ++ lib.concatLists (lib.mapAttrsToList (role: layout: ["--image" "${role}=${layout}"]) cfg.images)
    ++ lib.optionals (cfg.images ? runtime) ["--worker" cfg.worker];
  surfaceFacts =
    [
      "--store"
      cfg.store
      "--runtime"
      runtimeBinary
      "--state-dir"
      surface.stateDir
    ]
    # A narrowing of the reviewed egress allow-list (render refuses a wider domain).
    ++ lib.concatMap (d: ["--egress-domain" d]) surface.egress.domains;
  # The agent service's own sockets reach IP when the agent calls its model directly or when
  # the surface's egress proxy (which runs in this service) must connect out.
  surfaceIp = surface.network == "ip" || surface.egress.domains != [];
  # Each skill copied (not linked: the import follows no link) under its name, imported at
  # start; the selections, NAME@sha256:…, are written for the agent to pass to run --skill.
  skillTree = pkgs.runCommand "cordon-agent-skills" {} (
    "mkdir $out\n"
    + lib.concatStrings (lib.mapAttrsToList (name: path: "cp -RL ${path} $out/${lib.escapeShellArg name}\n") surface.skills)
  );
  importSkills = pkgs.writeShellScript "cordon-agent-skills" (
    "set -euo pipefail\n"
    + ": > \"$RUNTIME_DIRECTORY/skills\"\n"
    + lib.concatStrings (lib.mapAttrsToList (name: _: "${cfg.package}/bin/cordon-surface --policy /etc/cordon/surface.kdl skills import ${skillTree}/${lib.escapeShellArg name} >> \"$RUNTIME_DIRECTORY/skills\"\n") surface.skills)
  );
  # The rendered policy (render validates it and refuses any change but the facts), and beside
  # it, for the reviewer, what rendering changed.
  render = name: reviewed: facts:
    pkgs.runCommand "${name}.kdl"
    {
      passthru = {
        inherit reviewed facts;
        diff = pkgs.runCommand "${name}-diff" {} ''
          ${cfg.package}/bin/cordon-policy render ${reviewed} --out "$TMPDIR/p.kdl" \
            ${lib.escapeShellArgs facts} > $out
        '';
      };
    }
    ''
      ${cfg.package}/bin/cordon-policy render ${reviewed} --out $out ${lib.escapeShellArgs facts}
    '';
  evaluatorPolicy = render "cordon-policy" cfg.policy evaluatorFacts;
  surfacePolicy = render "cordon-surface" surface.policy surfaceFacts;

  id = what:
    mkOption {
      type = types.ints.between 1 4294967294;
      description = "The ${what} id of the per-run range (inclusive).";
    };
  range = what:
    mkOption {
      description = "The per-run ${what} range, set on the policy's accounts ${what}-range.";
      type = types.submodule {
        options = {
          first =
            id "first"
            // {
              default = 3000000;
            };
          last =
            id "last"
            // {
              default = 3099999;
            };
        };
      };
      default = {};
    };

  # Every id a declared user, group or subordinate range holds: the per-run range must miss them.
  declaredUids = builtins.filter (u: u != null) (
    lib.mapAttrsToList (_: u: u.uid or null) config.users.users
  );
  declaredGids = builtins.filter (g: g != null) (
    lib.mapAttrsToList (_: g: g.gid or null) config.users.groups
  );
  subRanges = attr:
    lib.concatLists (
      lib.mapAttrsToList (
        _: u:
          builtins.map (r: {
            first = r.startUid or r.startGid;
            last = (r.startUid or r.startGid) + r.count - 1;
          }) (u.${attr} or [])
      )
      config.users.users
    );
  # Users whose subordinate ranges NixOS allocates itself, 65536 ids each from 100000 up: the
  # per-run range must start past the last one they can reach.
  autoAllocated = builtins.length (
    builtins.filter (u: u.autoSubUidGidRange or false) (builtins.attrValues config.users.users)
  );
  autoEnd = 100000 + 65536 * autoAllocated;
  inRange = r: id: id >= r.first && id <= r.last;
  overlaps = a: b: a.first <= b.last && b.first <= a.last;
  collisions = r: ids: subs:
    builtins.filter (inRange r) ids ++ builtins.map (s: s.first) (builtins.filter (overlaps r) subs);
  uidCollisions = collisions cfg.accounts.uidRange declaredUids (subRanges "subUidRanges");
  gidCollisions = collisions cfg.accounts.gidRange declaredGids (subRanges "subGidRanges");
  # nspawn containers with privateUsers = "pick" take ranges from systemd's container range,
  # which holds the default per-run range.
  pickers = builtins.attrNames (
    lib.filterAttrs (_: c: (c.privateUsers or null) == "pick") (config.containers or {})
  );

  # Controls every unit gets. None of them gives the unit a mount namespace of its own
  # (rootUnit says why that matters); ProtectHostname is not among them, because newer systemd
  # makes it mount read-only /proc/sys entries, which needs one.
  baseHardening = {
    NoNewPrivileges = true;
    LockPersonality = true;
    RestrictRealtime = true;
    RestrictSUIDSGID = true;
    SystemCallArchitectures = "native";
    UMask = "0077";
  };
  # The root units change host state that a private mount namespace would hide from them:
  # they unmount a dead lease's mounts and must see and remove them in the host's namespace
  # (an unmount in a private copy would leave the host's mount in place, and the quiescence
  # check, run in the same copy, would report "nothing there"; cordon also refuses, exit 3,
  # when its mount table is not PID 1's). So none of ProtectSystem, ProtectHome, PrivateTmp,
  # PrivateDevices, PrivateMounts, ReadWritePaths, ProtectKernel*, ProtectControlGroups or
  # ProtectHostname: each of them makes a mount namespace. What they keep, and why:
  rootUnit = description: args: {
    inherit description;
    serviceConfig =
      baseHardening
      // {
        Type = "oneshot";
        # One run per executor the host uses: a lease of any of them is recovered.
        ExecStart = map (
          executor: "${cfg.package}/bin/cordon-reap --policy /etc/cordon/policy.kdl --executor ${executor}${args}"
        ) ([cfg.executor] ++ cfg.extraExecutors);
        MemoryDenyWriteExecute = true;
        # Only local sockets (runc's); shadow-utils treats a refused audit socket as a kernel
        # without audit, so userdel still works.
        RestrictAddressFamilies = ["AF_UNIX"];
        IPAddressDeny = "any";
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
          # remove run directories and files owned by per-run uids
          "CAP_DAC_OVERRIDE"
          "CAP_DAC_READ_SEARCH"
          "CAP_FOWNER"
          # read /proc/<pid>/ns and /proc/<pid>/stat of per-run processes (another uid's)
          "CAP_SYS_PTRACE"
          # userdel and groupdel of a dead lease's account rewrite /etc/passwd and /etc/shadow
          "CAP_CHOWN"
        ];
      };
  };
in {
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
      description = "The reviewed policy. `cordon-policy render` sets the host facts on it; /etc/cordon/policy.kdl is the result.";
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
    extraExecutors = mkOption {
      type = types.listOf types.str;
      default = [];
      description = "Other executor ids stages on this host run under (--executor): startup recovery and the sweep timer recover each of them as well as `executor`, so no lease of theirs is left to a host reset.";
    };
    images = mkOption {
      type = types.attrsOf types.package;
      default = lib.filterAttrs (_: v: v != null) {
        prebuild = cordonPackages.${pkgs.stdenv.hostPlatform.system}.image-prebuild or null;
        runtime = cordonPackages.${pkgs.stdenv.hostPlatform.system}.image-runtime or null;
      };
      defaultText = lib.literalExpression "the flake's image-prebuild and image-runtime packages";
      description = "Image role → an OCI layout (a package), linked at /var/lib/cordon/images/ROLE, where a container stage reads its images without --images. Each layout's manifest is rendered into the policy's `image ROLE` pin (the reviewed policy must pin that role; the diff beside the rendered policy shows any change), and every byte is verified against that pin at each run.";
    };
    worker = mkOption {
      type = types.path;
      default = "${cordonPackages.${pkgs.stdenv.hostPlatform.system}.cordon-worker-static}/bin/cordon-worker";
      defaultText = lib.literalExpression "the flake's cordon-worker-static";
      description = "The cordon-worker binary the `runtime` image holds: its sha256 is rendered into the policy's `worker` pin (with an image for the runtime role only).";
    };
    runtime = mkOption {
      type = types.enum ["runc" "crun" "runsc"];
      default = "runc";
      description = "The OCI runtime; it must be the one the reviewed policy names (an assertion: the kind is the reviewer's choice, never rendered). Each is gated at every stage start by its own version table: runc's and crun's floors and known-bad releases, crun's build features; cordon keeps no floor for runsc, so a policy naming it must set min-version. crun's runs then wait at a start gate, where cordon checks their posture once crun has applied all of it; runsc is refused before anything is created, until cordon reads gVisor's sandbox (\"Runtime advisories\" in policy/README.md).";
    };
    runtimePackage = mkOption {
      type = types.package;
      default =
        {
          runc = pkgs.runc;
          crun = pkgs.crun;
          runsc = pkgs.gvisor;
        }
        .${
          cfg.runtime
        };
      defaultText = lib.literalExpression "pkgs.runc, pkgs.crun or pkgs.gvisor, as runtime names";
      description = "The package holding bin/<runtime>; its binary's path and sha256 are set on the policy. The policy's min-version is checked against it at every stage start.";
    };
    accounts = {
      uidRange = range "uid";
      gidRange = range "gid";
    };
    activationWait = mkOption {
      type = types.ints.positive;
      default = 600;
      description = "Seconds activation waits for running stages to end before it rewrites /etc/passwd; past that, activation fails instead of removing a live per-run account.";
    };
    recoveryInterval = mkOption {
      type = types.str;
      default = "1min";
      description = "How often `cordon-reap --sweep` ends leases past their deadline or whose supervisor died.";
    };
    host = {
      ptraceScope = mkOption {
        type = types.ints.between 1 3;
        default = 2;
        description = "kernel.yama.ptrace_scope: 2 lets only CAP_SYS_PTRACE attach; 3 forbids attaching to anyone until reboot. cordon never attaches (its /proc reads are not attaches), so either works.";
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
        description = "The surface's state directory (the service user's, 0700), set on the surface policy.";
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
      egress.domains = mkOption {
        type = types.listOf types.str;
        default = [];
        example = ["api.anthropic.com" "pypi.org" "*.pythonhosted.org"];
        description = "The domains this host's surface runs may reach through the egress proxy: rendered into the policy in place of its reviewed egress domains, each of which must lie within them (rendering only narrows; the diff is kept beside the rendered policy). Non-empty only for a policy of network \"egress\"; the agent service may then open IP sockets, for its proxy.";
      };
      limits = mkOption {
        type = types.bool;
        default = false;
        description = "Delegate the agent service a cgroup v2 subtree (Delegate= the cpu, cpuset, memory and pids controllers, the service's processes in its leaf hub: DelegateSubgroup, systemd 254 or later), so that a surface policy's cpus, cpuset, memory and pids are set by the rootless runtime in each run's own cgroup below it; without it such a policy is refused. The cgroup tree is then writable to the service (ProtectControlGroups off), as delegation needs.";
      };
      skills = mkOption {
        type = types.attrsOf types.path;
        default = {};
        example = lib.literalExpression "{ review = ./skills/review; }";
        description = "Skills imported into the surface's store at service start (each copied from the Nix store under its name); the selections, NAME@sha256:…, are written one per line to /run/cordon-agent/skills for the agent to pass as run --skill. Needs a policy with a skills path.";
      };
    };
  };

  config = mkIf cfg.enable {
    assertions = [
      {
        assertion = builtins.match ".*\nruntime \"${cfg.runtime}\" .*" "\n${builtins.readFile cfg.policy}" != null;
        message = "services.cordon.runtime is ${cfg.runtime}, but the reviewed policy (services.cordon.policy) names another runtime: the runtime's kind is the reviewer's choice, so set runtime to the one it names or review a policy that names ${cfg.runtime}";
      }
      {
        assertion = cfg.accounts.uidRange.first <= cfg.accounts.uidRange.last;
        message = "services.cordon.accounts.uidRange: first is past last";
      }
      {
        assertion = cfg.accounts.gidRange.first <= cfg.accounts.gidRange.last;
        message = "services.cordon.accounts.gidRange: first is past last";
      }
      {
        assertion = uidCollisions == [];
        message = "services.cordon.accounts.uidRange overlaps declared uids or subuid ranges: ${builtins.toJSON uidCollisions}";
      }
      {
        assertion = gidCollisions == [];
        message = "services.cordon.accounts.gidRange overlaps declared gids or subgid ranges: ${builtins.toJSON gidCollisions}";
      }
      {
        assertion =
          autoAllocated
          == 0
          || (cfg.accounts.uidRange.first >= autoEnd && cfg.accounts.gidRange.first >= autoEnd);
        message = "services.cordon.accounts: ${toString autoAllocated} users have autoSubUidGidRange, whose ranges reach ${toString autoEnd}; start the per-run ranges past it";
      }
      {
        assertion = pickers == [];
        message = "services.cordon: containers ${builtins.toJSON pickers} use privateUsers = \"pick\", which may take the per-run range";
      }
      {
        # Per-run accounts are made with useradd and removed with userdel; the activation hold
        # below is written for the users activation script, not for sysusers or userborn.
        assertion =
          !(config.systemd.sysusers.enable or false) && !(config.services.userborn.enable or false);
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
      "kernel.dmesg_restrict" =
        if cfg.host.dmesgRestrict
        then 1
        else 0;
      "kernel.unprivileged_bpf_disabled" = cfg.host.unprivilegedBpfDisabled;
      "net.core.bpf_jit_harden" = cfg.host.bpfJitHarden;
    };

    environment.systemPackages = [cfg.package];
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
    system.extraDependencies = [evaluatorPolicy.diff] ++ lib.optional surface.enable surfacePolicy.diff;

    systemd.tmpfiles.rules =
      [
        "d /var/lib/cordon 0700 root root -"
        "d ${cfg.store} 0700 root root -"
        # 0711: per-run uids traverse to their own lease directory (0711 too); none may list it.
        "d ${cfg.runDir} 0711 root root -"
        "d /var/lib/cordon/images 0700 root root -"
      ]
      # A link into the store, replaced at each activation (L+): a stage verifies every byte of
      # the layout against the policy's pin wherever it lies, so the link is not trusted.
      ++ lib.mapAttrsToList (role: layout: "L+ /var/lib/cordon/images/${role} - - - - ${layout}") cfg.images
      ++ lib.optionals surface.enable [
        "d /var/lib/cordon-agent 0700 ${surface.user} ${surface.user} -"
        "d ${surface.workspace} 0700 ${surface.user} ${surface.user} -"
        "d ${surface.stateDir} 0700 ${surface.user} ${surface.user} -"
      ];

    # Per-run accounts on NixOS: with users.mutableUsers = false, the users activation script
    # rewrites /etc/passwd and /etc/group from the declared users. A per-run account exists only
    # while a stage holds its executor's lock (alone, or shared with other intake stages), so
    # activation takes every executor's lock exclusively first — the configured one and any
    # other this host has used — waiting up to activationWait seconds in all, and keeps them
    # until activation ends: no stage runs while the files are rewritten, and none starts until
    # they are. If a lock cannot be had, activation fails rather than remove a live account.
    system.activationScripts.cordonHoldLeases = {
      deps = ["specialfs"];
      text = ''
        # Every configured executor's lock exists before the glob, so each is held even if
        # recovery removed its file as unheld.
        (umask 077; mkdir -p /run/cordon-locks; touch ${builtins.concatStringsSep " " (map (e: "/run/cordon-locks/${e}.lock") ([cfg.executor] ++ cfg.extraExecutors))})
        cordon_deadline=$(( $(date +%s) + ${toString cfg.activationWait} ))
        for cordon_lock_file in /run/cordon-locks/*.lock; do
          # Recovery removes lock files nobody holds, holding each as it does: one gone
          # before it is opened held no stage; one removed between the open and the lock is
          # opened again, as every stage does (cordon::lease::lock_at).
          while [ -e "$cordon_lock_file" ]; do
            exec {cordon_lock}<"$cordon_lock_file" || break
            cordon_left=$(( cordon_deadline - $(date +%s) ))
            if (( cordon_left < 1 )) \
              || ! ${pkgs.util-linux}/bin/flock -x -w "$cordon_left" "$cordon_lock"; then
              echo "cordon: a stage still holds $cordon_lock_file after ${toString cfg.activationWait} s; refusing to rewrite /etc/passwd under it" >&2
              exit 1
            fi
            [ "$(stat -L -c %d:%i "/proc/self/fd/$cordon_lock")" = "$(stat -c %d:%i "$cordon_lock_file" 2>/dev/null)" ] && break
            exec {cordon_lock}<&-
          done
        done
      '';
    };
    system.activationScripts.users = mkIf (
      !(config.systemd.sysusers.enable or false) && !(config.services.userborn.enable or false)
    ) {deps = ["cordonHoldLeases"];};

    systemd.services.cordon-recover = lib.recursiveUpdate (rootUnit "cordon startup recovery" "") {
      # Before any login, so before anything may start a lease; bounded, so a hang cannot
      # keep logins out for ever.
      wantedBy = ["multi-user.target"];
      before = ["systemd-user-sessions.service"] ++ lib.optional surface.enable "cordon-agent.service";
      after = ["local-fs.target"];
      serviceConfig = {
        RemainAfterExit = true;
        TimeoutStartSec = "15min";
      };
    };
    systemd.services.cordon-reap = lib.recursiveUpdate (
      rootUnit
      "cordon: release expired leases and those whose supervisor died"
      " --sweep"
    ) {after = ["cordon-recover.service"];};
    systemd.timers.cordon-reap = {
      wantedBy = ["timers.target"];
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
        # Rootless runc maps the service user alone: no subordinate ranges, no extra groups.
        extraGroups = [];
      };
    };
    users.groups = mkIf surface.enable {${surface.user} = {};};

    systemd.services.cordon-agent = mkIf surface.enable {
      description = "An agent bounded by its workspace (cordon-surface)";
      wantedBy = ["multi-user.target"];
      after = ["cordon-recover.service"];
      path = [cfg.package];
      # Not MemoryDenyWriteExecute: systemd applies it as a seccomp filter that every command
      # the agent runs would inherit, and it breaks any JIT (node, the JVM) inside the surface.
      # Not ProtectKernelTunables, ProtectKernelLogs or ProtectHostname: each mounts over a
      # /proc entry, and the kernel then refuses the fresh /proc the surface mounts for its
      # commands (a procfs may be mounted only where none is partly hidden).
      serviceConfig =
        baseHardening
        // {
          User = surface.user;
          Group = surface.user;
          SupplementaryGroups = [];
          # What runs of a dead supervisor left is released before the agent starts, as this
          # user: the runs and their state directory are the service user's own.
          ExecStartPre =
            ["${cfg.package}/bin/cordon-reap --surface --policy /etc/cordon/surface.kdl --sweep"]
            ++ lib.optional (surface.skills != {}) "${importSkills}";
          RuntimeDirectory = "cordon-agent";
          RuntimeDirectoryMode = "0700";
          ExecStart = utils.escapeSystemdExecArgs surface.command;
        }
        // lib.optionalAttrs surface.limits {
          # The unit's cgroup is the service user's; its processes start in the leaf `hub`, so
          # the unit's own cgroup holds none and can give controllers to the runs' cgroups,
          # siblings of `hub` (cordon::run_cgroup::delegated).
          Delegate = "cpu cpuset memory pids";
          DelegateSubgroup = "hub";
        }
        // {
          ProtectSystem = "strict";
          ReadWritePaths = lib.unique [
            "/var/lib/cordon-agent"
            surface.workspace
            surface.stateDir
          ];
          ProtectHome = true;
          PrivateTmp = true;
          PrivateDevices = true;
          PrivateMounts = true;
          ProtectClock = true;
          # /usr/lib/modules hidden: a mount outside /proc, which a fresh procfs does not mind.
          ProtectKernelModules = true;
          # Off only with limits: the delegated subtree is where the runtime writes them.
          ProtectControlGroups = !surface.limits;
          ProtectProc = "invisible";
          ProcSubset = "all";
          RemoveIPC = true;
          KeyringMode = "private";
          # Rootless runc: the pid file and console sockets, and netlink to bring up the
          # container's loopback in its own network namespace; IP only when the agent itself
          # must reach its model over the network (surface.network) or the egress proxy must
          # connect out (surface.egress.domains). Its commands get a network namespace of their
          # own with nothing in it but loopback either way.
          RestrictAddressFamilies =
            [
              "AF_UNIX"
              "AF_NETLINK"
            ]
            ++ lib.optionals surfaceIp [
              "AF_INET"
              "AF_INET6"
            ];
          PrivateNetwork = !surfaceIp;
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
            # runc's init: join namespaces, load the commands' seccomp profile, name the host
            "setns"
            "seccomp"
            "sethostname"
            "setdomainname"
            "~@obsolete @cpu-emulation @debug @raw-io @reboot @swap @clock @module"
          ];
          CapabilityBoundingSet = [""];
          AmbientCapabilities = [""];
          DevicePolicy = "closed";
        }
        // lib.optionalAttrs (!surfaceIp) {IPAddressDeny = "any";};
    };
  };
}
