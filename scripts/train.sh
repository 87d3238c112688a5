#!/usr/bin/env bash
# Installs what is missing, builds, and trains the default config (or the one given):
#   ./scripts/train.sh                                  configs/fashion_dit.yaml
#   ./scripts/train.sh -c my.yaml --set train.steps=100
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh >&2
if [ $# -eq 0 ]; then set -- -c configs/fashion_dit.yaml; fi
exec "${FLOWTRAIN_BUILD_DIR:-build}/flowtrain" train "$@"
