#!/bin/sh
# The validator-registered build step (policy step "build-native"): reads the tree as data and
# writes its native publication into the staging directory given as $1.
set -eu
out="$1"
mkdir -p "$out/lib"
printf 'example native artifact\n' > "$out/lib/artifact.txt"
