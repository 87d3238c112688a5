#!/usr/bin/env bash
# Long video sequences on the CPU: step time and peak memory per rank of configs/bench/video_long.yaml
# at 4k / 16k / 32k video tokens, context parallelism 1 / 2 / 4 (processes on this machine, Gloo
# over loopback) and activation checkpointing none / full / attention / mlp. Prints one Markdown
# row per run (docs/perf.md, "Long video sequences"); each run's JSON report stays in $OUT.
#
#   bench/video_long_memory.sh                       # the whole matrix (hours on 2 cores at 32k)
#   LENGTHS="4k 16k" CPS="1 2" ACS="none attention" bench/video_long_memory.sh
#
# All ranks share the machine's cores (flowtrain launch gives each cores / ranks threads), so the
# cp > 1 step times compare communication and recompute overhead at equal total compute; they
# are not speed-ups. Memory is per rank: the CPU tensor allocator's peak (tensors only: the
# activations, the training state, the batch) and the process's peak RSS (plus the runtime,
# libraries and allocator caches).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/flowtrain}
OUT=${OUT:-/tmp/flowtrain-video-long}
LENGTHS=${LENGTHS:-4k 16k 32k}
CPS=${CPS:-1 2 4}
ACS=${ACS:-none full attention mlp}
STEPS=${STEPS:-2}
WARMUP=${WARMUP:-1}
mkdir -p "$OUT"

sets_for_length() {
  case "$1" in
    4k) echo "" ;;                                                                 # 16 × 16 × 16
    16k) echo "--set model.image_size=64" ;;                                       # 16 × 32 × 32
    32k) echo "--set model.image_size=64 --set model.frames=32 --set data.video.frames=32" ;;  # 32 × 32 × 32
    *) echo "unknown length '$1' (4k | 16k | 32k)" >&2; exit 2 ;;
  esac
}

echo "| video tokens (+16 text) | cp | attention | checkpointing | step s | allocator peak per rank, MiB | peak RSS per rank, MiB |"
echo "|---|---|---|---|---|---|---|"
for length in $LENGTHS; do
  for cp in $CPS; do
    for ac in $ACS; do
      name="${length}_cp${cp}_${ac}"
      json="$OUT/$name.json"
      # 2 heads: Ulysses at cp 2, ring at cp 4 (auto).
      args="bench -c configs/bench/video_long.yaml --synthetic --steps $STEPS --warmup $WARMUP --json $json \
        --set run.out_dir=$OUT/$name --set train.activation_checkpointing=$ac --set parallel.cp=$cp \
        $(sets_for_length "$length")"
      if [ "$cp" = 1 ]; then
        cmd="$BIN $args"
      else
        cmd="$BIN launch --nproc-per-node $cp -- $args"
      fi
      if ! $cmd >"$OUT/$name.log" 2>&1; then
        echo "| $length | $cp | | $ac | failed: see $OUT/$name.log | | |"
        continue
      fi
      python3 - "$json" "$length" "$cp" "$ac" "$OUT/$name.log" <<'EOF'
import json, re, sys
path, length, cp, ac, log = sys.argv[1:]
r = json.load(open(path))
mib = lambda b: f"{b / 2**20:,.0f}"
alloc = r.get("peak_allocated_bytes_per_rank", [r["peak_allocated_bytes"]])
rss = r.get("peak_memory_bytes_per_rank", [r["peak_rss_bytes"]])
m = re.search(r"\), (\w+) attention", open(log).read())
kind = m.group(1) if m else "-"
print(f"| {length} ({r['tokens_per_sample'] - 16:,}) | {cp} | {kind} | {ac} | {r['step_time_median_s']:.2f} | "
      f"{' / '.join(mib(b) for b in alloc)} | {' / '.join(mib(b) for b in rss)} |")
EOF
    done
  done
done
