# Render a reviewed policy for this host: substitute the host's paths and ranges into the exact
# lines that name them, and nothing else. Pure (builtins only), so checks/nix.sh evaluates it
# against the real policy files without nixpkgs.
#
# Each rule matches a whole line (leading blanks kept). A rule named in `required` must match
# exactly once; any other rule at most once. Anything else — a required line missing, a line
# matched twice, a value that would not survive KDL quoting — is an evaluation error: the
# module never renders a policy it could not substitute exactly. The runtime's digest is not
# known at evaluation time; its line carries sha256="@runtimeSha256@", which render-policy.sh
# replaces with the digest of the runtime binary it hashes, before `cordon-policy check`.
{
  text,
  # name of each rule that must match exactly once
  required,
  store,
  runtime,
  runtimePath,
  runDir ? null,
  uidRange ? null,
  gidRange ? null,
  nologin ? null,
  stateDir ? null,
}:
let
  safe =
    what: v:
    if builtins.match "[A-Za-z0-9/._+-]+" (toString v) == null then
      throw "nixos-module/policy.nix: ${what} ${builtins.toJSON v} holds a character a policy path may not"
    else
      toString v;
  # name -> { re: ERE over the whole line, captures: (indent, rest…); line: captures -> new line }
  rules = {
    store = {
      re = "([ ]*)store \"[^\"]*\"";
      line = c: "${builtins.elemAt c 0}store \"${safe "store" store}\"";
    };
    runtime = {
      re = "([ ]*)runtime \"[a-z]+\" path=\"[^\"]*\"( min-version=\"[^\"]*\")?( sha256=\"[^\"]*\")?";
      line =
        c:
        let
          minVersion = builtins.elemAt c 1;
        in
        "${builtins.elemAt c 0}runtime \"${runtime}\" path=\"${safe "runtime path" runtimePath}\"${
          if minVersion == null then "" else minVersion
        } sha256=\"@runtimeSha256@\"";
    };
    run-dir = {
      re = "([ ]*)run-dir \"[^\"]*\"";
      line = c: "${builtins.elemAt c 0}run-dir \"${safe "runDir" runDir}\"";
    };
    uid-range = {
      re = "([ ]*)uid-range [0-9]+ [0-9]+";
      line = c: "${builtins.elemAt c 0}uid-range ${toString uidRange.first} ${toString uidRange.last}";
    };
    gid-range = {
      re = "([ ]*)gid-range [0-9]+ [0-9]+";
      line = c: "${builtins.elemAt c 0}gid-range ${toString gidRange.first} ${toString gidRange.last}";
    };
    shell = {
      re = "([ ]*)shell \"[^\"]*\"";
      line = c: "${builtins.elemAt c 0}shell \"${safe "nologin" nologin}\"";
    };
    state-dir = {
      re = "([ ]*)state-dir \"[^\"]*\"";
      line = c: "${builtins.elemAt c 0}state-dir \"${safe "stateDir" stateDir}\"";
    };
  };
  # Rules whose value was given: the others leave their lines as reviewed.
  given = {
    store = true;
    runtime = true;
    run-dir = runDir != null;
    uid-range = uidRange != null;
    gid-range = gidRange != null;
    shell = nologin != null;
    state-dir = stateDir != null;
  };
  active = builtins.filter (n: given.${n}) (builtins.attrNames rules);
  lines = builtins.filter builtins.isString (builtins.split "\n" text);
  matchOf = name: l: builtins.match rules.${name}.re l;
  count = name: builtins.length (builtins.filter (l: matchOf name l != null) lines);
  problems = builtins.concatMap (
    name:
    let
      n = count name;
    in
    if n > 1 then
      [ "${name}: ${toString n} lines" ]
    else if n == 0 && builtins.elem name required then
      [ "${name}: no line" ]
    else
      [ ]
  ) (active ++ builtins.filter (n: !given.${n}) required);
  rewrite =
    l:
    let
      hits = builtins.filter (name: matchOf name l != null) active;
    in
    if hits == [ ] then l else rules.${builtins.head hits}.line (matchOf (builtins.head hits) l);
in
if problems != [ ] then
  throw "nixos-module/policy.nix: cannot render the policy exactly: ${builtins.concatStringsSep "; " problems}"
else
  builtins.concatStringsSep "\n" (builtins.map rewrite lines)
