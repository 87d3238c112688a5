#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite (ctest). `.ci/run` calls this.
#   ./scripts/test.sh            all labels present on this machine (unit, e2e; gpu tests skip
#                                themselves without a GPU)
#   ./scripts/test.sh -L unit    only one label (any ctest arguments are passed through)
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
./scripts/build.sh
built=$(date +%s)
echo "[test] setup + build took $((built - start)) s"
cd "${FLOWTRAIN_BUILD_DIR:-build}"
ctest --output-on-failure --timeout 900 "$@"
echo "[test] tests took $(( $(date +%s) - built )) s"
