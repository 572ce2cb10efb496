# The NixOS VM test (checks.x86_64-linux.vm; `nix flake check` on a Nix host with KVM). It has
# never run on the Debian host cordon is developed on — no nixpkgs there — and README says so.
#
# A host with the module boots; startup recovery runs before logins; the evaluator policy in
# /etc is the checked render; the example incumbent is materialized and prebuilt in a real runc
# container from the flake's prebuild image; a second prebuild is killed mid-run with SIGKILL and
# the machine is crashed; after the reboot startup recovery leaves the host quiescent
# (`cordon-reap --check` exits 0) and no per-run account survives in /etc/passwd.
{ self }:
{
  name = "cordon";
  nodes.host =
    { pkgs, ... }:
    {
      imports = [ self.nixosModules.default ];
      services.cordon.enable = true;
      users.mutableUsers = false;
      virtualisation.memorySize = 2048;
      virtualisation.diskSize = 4096;
      environment.etc."cordon-test/example".source = ../checks/example;
      environment.etc."cordon-test/images/prebuild".source =
        self.packages.x86_64-linux.image-prebuild;
    };
  testScript = ''
    policy = "--policy /etc/cordon/policy.kdl"
    images = "--images /etc/cordon-test/images"

    host.wait_for_unit("cordon-recover.service")
    host.succeed(f"cordon-policy check /etc/cordon/policy.kdl")
    host.succeed(f"cordon-reap {policy} --check")

    host.succeed(
        f"cordon-materialize {policy} incumbent /etc/cordon-test/example/incumbent > /root/incumbent.json"
    )
    host.succeed(f"cordon-prebuild {policy} {images} --receipt /root/incumbent.json > /root/prebuild.json")
    host.succeed(f"cordon-reap {policy} --check")

    # A stage killed mid-run, then the machine lost: only startup recovery remains to clean up.
    host.execute(f"cordon-prebuild {policy} {images} --receipt /root/incumbent.json >/dev/null 2>&1 &")
    host.wait_until_succeeds("ls /run/cordon | grep -q .", timeout=60)
    host.execute("pkill -KILL -f cordon-prebuild")
    host.crash()
    host.start()

    host.wait_for_unit("cordon-recover.service")
    host.succeed(f"cordon-reap {policy} --check")
    host.fail("grep -q '^cordon-' /etc/passwd")
    host.succeed("test -z \"$(ls -A /run/cordon)\"")
  '';
}
