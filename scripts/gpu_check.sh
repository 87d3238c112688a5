#!/usr/bin/env bash
# The one GPU check, run on the H200 machine through the device tool (see ../shared/notes/gpu.md):
#   here:   ../shared/tools/device-debs.sh .debs dataset-fashion-mnist
#   there:  bash scripts/gpu_check.sh          (with .debs carried along; results under $OUT)
# Builds against that machine's own torch, runs the `gpu` and `unit` tests, times training of
# the default config (bf16) and of DiT-B/2 and DiT-XL/2 on synthetic 32×32×4 latents, FSDP on
# NCCL at world 1 with a 3-step Kineto trace, and
# prints a short table last. Everything it writes goes to $OUT (default /tmp/gpu_check_out).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_check_out}
mkdir -p "$OUT"
log() { echo "[gpu_check $(date +%T)] $*"; }

sysroot=/tmp/sysroot
mkdir -p $sysroot
for f in .debs/*.deb; do dpkg -x "$f" $sysroot; done
export LD_LIBRARY_PATH=$sysroot/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
export FLOWTRAIN_FASHION_MNIST=$sysroot/usr/share/datasets/fashion-mnist
torch_prefix=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"

log "configure + build"
start=$(date +%s)
cmake -G Ninja -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DTORCH_CUDA_ARCH_LIST=9.0a \
  -DCMAKE_PREFIX_PATH="$torch_prefix;$sysroot/usr;$sysroot/usr/lib/x86_64-linux-gnu/cmake;$sysroot/usr/share/cmake" \
  > "$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
ninja -C build-gpu -j16 > "$OUT/build.log" 2>&1 || { grep -E "error|FAILED" "$OUT/build.log" | head -30; exit 1; }
build_s=$(( $(date +%s) - start ))

log "tests (gpu, unit)"
(cd build-gpu && ctest -L 'gpu|unit' --output-on-failure --timeout 300) > "$OUT/ctest.log" 2>&1
tests_rc=$?
tests_line=$(grep -E "tests passed|tests failed" "$OUT/ctest.log" | tail -1)

bench() {  # name config steps extra-sets…
  local name=$1 config=$2 steps=$3; shift 3
  local dir=/tmp/gpu_bench/$name sets=()
  for s in "$@"; do sets+=(--set "$s"); done
  rm -rf "$dir"
  ./build-gpu/flowtrain train -c "$config" --set run.out_dir="$dir" --set run.device=cuda \
    --set train.steps="$steps" --set train.log_every=10 --set sample.every=0 --set checkpoint.every=0 \
    --set data.path="$FLOWTRAIN_FASHION_MNIST" "${sets[@]}" > "$OUT/bench-$name.log" 2>&1
  local rc=$?
  local row
  row=$(tail -n 1 "$dir/metrics.jsonl" 2>/dev/null)
  python3 - "$name" "$rc" "$row" <<'PY' >> "$OUT/bench.tsv"
import json, sys
name, rc, row = sys.argv[1], sys.argv[2], sys.argv[3]
r = json.loads(row) if row else {}
print(f"{name}\t{rc}\t{r.get('samples_per_s', float('nan')):.1f}\t{r.get('step_time_s', float('nan')):.4f}\t{r.get('loss', float('nan')):.4f}")
PY
}
log "benchmarks"
: > "$OUT/bench.tsv"
bench fashion_default_bf16 configs/fashion_dit.yaml 300 train.precision=bf16
bench fashion_default_fp32 configs/fashion_dit.yaml 300 train.precision=fp32
bench dit_b2_bf16 configs/fashion_dit.yaml 60 model.size=B model.hidden=0 model.depth=0 model.heads=0 \
  model.patch=2 model.image_size=32 model.in_channels=4 model.num_classes=1000 data.source=synthetic \
  data.batch_size=256 train.precision=bf16
bench dit_xl2_bf16 configs/fashion_dit.yaml 40 model.size=XL model.hidden=0 model.depth=0 model.heads=0 \
  model.patch=2 model.image_size=32 model.in_channels=4 model.num_classes=1000 data.source=synthetic \
  data.batch_size=256 train.precision=bf16 train.ema_decay=0.9999
# FSDP on NCCL at world 1 (parallel.fsdp=on): trains the default config, and a Kineto trace of
# 3 steps shows the all-gathers / reduce-scatters on NCCL's stream next to compute.
bench fashion_fsdp_nccl_w1 configs/fashion_dit.yaml 300 train.precision=bf16 parallel.fsdp=on parallel.backend=nccl \
  profile.enabled=true profile.start_step=20 profile.num_steps=3
cp /tmp/gpu_bench/fashion_fsdp_nccl_w1/profiles/*.json "$OUT/" 2>/dev/null
python3 - /tmp/gpu_bench/fashion_fsdp_nccl_w1/profiles <<'PY' > "$OUT/fsdp_trace_summary.txt" 2>&1
import glob, json, sys, collections
for path in glob.glob(sys.argv[1] + "/*.json"):
    events = json.load(open(path)).get("traceEvents", [])
    streams = collections.defaultdict(set)
    for e in events:
        n = e.get("name", "")
        if "nccl" in n.lower() or n.startswith("fsdp."):
            streams[n[:60]].add((e.get("pid"), e.get("tid")))
    print(path)
    for n, s in sorted(streams.items()):
        print(f"  {n}: {len(s)} stream(s)/thread(s) {sorted(s)[:4]}")
PY

echo
echo "== flowtrain GPU check ($(cat "$OUT/gpu.txt")) =="
echo "build: ${build_s}s | tests rc ${tests_rc}: ${tests_line}"
echo "FSDP trace (NCCL, world 1): $(grep -c stream "$OUT/fsdp_trace_summary.txt" 2>/dev/null) collective/range names; see fsdp_trace_summary.txt"
printf "%-22s %4s %12s %12s %8s\n" run rc samples/s s/step loss
while IFS=$'\t' read -r n rc sps st loss; do printf "%-22s %4s %12s %12s %8s\n" "$n" "$rc" "$sps" "$st" "$loss"; done < "$OUT/bench.tsv"
