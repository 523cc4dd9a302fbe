#!/usr/bin/env bash
# Build a model from a recipe, gate it, and publish its ONNX export only if every gate passed.
#
#   examples/ci/publish-model.sh [--set KEY=VALUE ...]
#
# RECIPE (default recipes/hydra-bert-csv.toml) names the recipe and DIST (default dist/model)
# where the ONNX artifact is copied; arguments go to `uqc run` (typically --set vars.*).
# Exit codes are uqc run's: 1 a recipe or step error, 3 a failed quality gate or parity
# check. Either way nothing is copied to DIST, so a later "upload" step has nothing stale.
set -euo pipefail

recipe="${RECIPE:-recipes/hydra-bert-csv.toml}"
dist="${DIST:-dist/model}"
report="$(mktemp)"
trap 'rm -f "$report"' EXIT

uqc run "$recipe" --json "$@" > "$report"  # set -e: a failed gate (exit 3) stops here

onnx="$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["steps"]["onnx"]["path"])' "$report")"
uqc verify "$onnx" > /dev/null  # every file matches its recorded sha256
rm -rf "$dist"
mkdir -p "$(dirname "$dist")"
cp -R "$onnx" "$dist"
echo "$dist"
