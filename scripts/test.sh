#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite (ctest). `.ci/run` calls this.
#   ./scripts/test.sh            all labels present on this machine (unit, e2e; gpu tests skip
#                                themselves without a GPU)
#   ./scripts/test.sh -L unit    only one label (any ctest arguments are passed through)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
start=$(date +%s)
./scripts/build.sh
built=$(date +%s)
echo "[test] setup + build took $((built - start)) s"
cd "${FLOWTRAIN_BUILD_DIR:-build}"
status=0
ctest --output-on-failure --timeout 900 "$@" || status=$?
if (( status != 0 )); then
  "$root/scripts/failed_tests_report.sh" .
  exit "$status"
fi
echo "[test] tests took $(( $(date +%s) - built )) s"
