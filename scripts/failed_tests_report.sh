#!/usr/bin/env bash
# Prints, for each test of the last ctest run that failed, its assertion failures (each gtest
# "Failure" line with what follows it) and the end of its output. scripts/test.sh calls it after
# a failing run so that the end of a CI log — often the only part a reader sees — says why.
#   scripts/failed_tests_report.sh [BUILD_DIR]
set -uo pipefail
dir="${1:-build}/Testing/Temporary"
[[ -s "$dir/LastTestsFailed.log" ]] || exit 0
output=$(mktemp)
trap 'rm -f "$output"' EXIT
echo "==================== why the failed tests failed ===================="
while IFS=: read -r _ name; do
  echo "---- $name"
  # The test's "Output:" section of LastTest.log, between its "N/M Testing: NAME" header and
  # "<end of output>".
  awk -v name="$name" '
    $0 ~ "^[0-9]+/[0-9]+ Testing: " && $3 == name { inside = 1; next }
    inside == 1 && /^Output:/ { inside = 2; getline; next }
    inside == 2 && /^<end of output>/ { exit }
    inside == 2 { print }
  ' "$dir/LastTest.log" > "$output"
  grep -n -A8 -E "Failure$|Failure |: error|terminate called|Segmentation|Exception" "$output" | head -60
  echo "  … last lines:"
  tail -n 15 "$output"
done < "$dir/LastTestsFailed.log"
