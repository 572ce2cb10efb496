# The pinned OCI images as Nix derivations, built by cordon-image itself in the build sandbox.
#
# Takes no nixpkgs: each image is one `derivation` whose builder is a static cordon-image
# (images/build-worker.sh cordon-image, or the flake's static build) and whose inputs are store
# paths, so the same expression builds in the bare sandbox of a Debian host (checks/nix.sh) and
# on a Nix host. The spec files are the ones `cordon-image build` reads everywhere else; only their
# `from="…"` sources are rewritten to store paths, which do not enter the layout (the layout
# records each file's path in the image, its mode and its bytes), so the digests equal the pins
# in policy/evaluator.kdl exactly when the source bytes equal those the pins were made from.
#
#   cordonImage  a static cordon-image binary (a path)
#   sources      { <from value in the spec> = <path>; … } for every source a spec names;
#                a spec source with no entry is an evaluation error, never a silent skip
{
  cordonImage,
  sources,
  system ? "x86_64-linux",
}: let
  # Every `from="…"` value of a spec, in order.
  fromsOf = text:
    builtins.map builtins.head (
      builtins.filter builtins.isList (builtins.split "from=\"([^\"]*)\"" text)
    );
  image = name: spec: let
    text = builtins.readFile spec;
    froms = fromsOf text;
    missing = builtins.filter (f: !(builtins.hasAttr f sources)) froms;
    rewritten = builtins.replaceStrings (builtins.map (f: "from=\"${f}\"") froms) (builtins.map (
        f: "from=\"${sources.${f}}\""
      )
      froms)
    text;
  in
    if missing != []
    then throw "images/default.nix: no source for ${builtins.toJSON missing} in ${name}"
    else
      derivation {
        inherit system;
        name = "cordon-image-${name}";
        builder = cordonImage;
        # The spec file holds the sources' store paths as text; toFile refuses a derivation's
        # output in its text, so the references are dropped there and the sources are made
        # inputs here instead.
        srcs = builtins.attrValues sources;
        args = [
          "build"
          (builtins.toFile "${name}.kdl" (builtins.unsafeDiscardStringContext rewritten))
          "--out"
          (builtins.placeholder "out")
        ];
      };
in {
  prebuild = image "prebuild" ./prebuild.kdl;
  runtime = image "runtime" ./runtime.kdl;
}
