#!/usr/bin/env bash
# The one GPU check, run on a GPU machine that reaches no package registry (docs/design/gpu.md):
#   here:   download the Debian packages that machine lacks into .debs/ (apt-get download; the
#           list is in docs/design/gpu.md, "Preparing the packages")
#           (libcurl / libjpeg are optional: without them http shards and .jpg members are errors)
#           (optional, for the PyTorch comparison) pip download --only-binary :all: --no-deps -d .wheels safetensors
#   there:  bash scripts/gpu_check.sh          (carry .debs and .wheels; results under $OUT)
# From a bare machine, in ≤ 8 minutes: builds against that machine's own torch, runs the `gpu`
# and `unit` tests, measures the fused CUDA kernels' bandwidth against a device copy
# (flowtrain_kernel_bench), trains the default config in bf16 (and fp32), benchmarks DiT-B/2 and DiT-XL/2
# on synthetic 32×32×4 latents, bf16 against fp8 recipes at Flux width (3072) and DiT-XL/2, FLUX.1-dev's
# width with random-weights T5-XXL, CLIP-L and AE run in the step (`flowtrain bench`: step time, MFU
# against the measured bf16 matmul peak, peak memory beside its estimate), FSDP on NCCL at world 1 with a 3-step Kineto trace, and — while time
# remains — flowtrain against PyTorch eager / torch.compile on DiT-B/2 bf16. One PASS/FAIL line per
# check is printed last, with its figure. Everything it writes goes to $OUT (default
# /tmp/gpu_check_out). Later checks are skipped (SKIP, with the reason) past FLOWTRAIN_GPU_BUDGET_S
# (default 420 s) so the whole stays inside the device call.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_check_out}
BUDGET=${FLOWTRAIN_GPU_BUDGET_S:-420}
mkdir -p "$OUT"
t0=$(date +%s)
elapsed() { echo $(( $(date +%s) - t0 )); }
log() { echo "[gpu_check $(elapsed)s] $*"; }
results=()  # "PASS|FAIL|SKIP<TAB>check<TAB>figure"
record() { results+=("$1"$'\t'"$2"$'\t'"$3"); log "$1 $2 $3"; }
in_budget() { (( $(elapsed) < BUDGET )); }

sysroot=/tmp/sysroot
mkdir -p $sysroot
for f in .debs/*.deb; do dpkg -x "$f" $sysroot; done
export LD_LIBRARY_PATH=$sysroot/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
# Libraries linked by name (sentencepiece) and their headers, from the unpacked packages.
export LIBRARY_PATH=$sysroot/usr/lib/x86_64-linux-gnu:${LIBRARY_PATH:-}
export CPATH=$sysroot/usr/include:${CPATH:-}
export FLOWTRAIN_FASHION_MNIST=$sysroot/usr/share/datasets/fashion-mnist
torch_prefix=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"

# ---- build ------------------------------------------------------------------------------------
log "configure + build"
if cmake -G Ninja -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DTORCH_CUDA_ARCH_LIST=9.0a \
    -DCMAKE_PREFIX_PATH="$torch_prefix;$sysroot/usr;$sysroot/usr/lib/x86_64-linux-gnu/cmake;$sysroot/usr/share/cmake" \
    > "$OUT/configure.log" 2>&1 && ninja -C build-gpu -j16 > "$OUT/build.log" 2>&1; then
  record PASS build "$(elapsed) s"
else
  grep -E "error|FAILED|Error" "$OUT/configure.log" "$OUT/build.log" | head -30
  record FAIL build "see build.log / configure.log"
  printf '%s\n' "${results[@]}"
  exit 1
fi

# ---- tests --------------------------------------------------------------------------------------
for label in gpu unit; do
  (cd build-gpu && ctest -L "$label" --output-on-failure --timeout 300) > "$OUT/ctest-$label.log" 2>&1
  rc=$?
  line=$(grep -E "tests passed|tests failed" "$OUT/ctest-$label.log" | tail -1)
  skipped=$(grep -c "Skipped" "$OUT/ctest-$label.log")
  if ((rc == 0)); then record PASS "ctest -L $label" "$line ($skipped skipped)"
  else record FAIL "ctest -L $label" "$line: $(grep -E '\(Failed\)' "$OUT/ctest-$label.log" | head -5 | tr '\n' ' ')"; fi
done

# ---- fused CUDA kernels: bandwidth against a device-to-device copy ------------------------------
# Every fused kernel of models/kernels/cuda, forward and backward, at Flux sizes in bf16 must move
# its minimum bytes at ≥ 70% of the measured copy bandwidth (bench/kernel_bench.cpp; ~30 s).
if in_budget; then
  ./build-gpu/flowtrain_kernel_bench > "$OUT/kernel_bench.log" 2>&1
  rc=$?
  grep '^{' "$OUT/kernel_bench.log" > "$OUT/kernel_bench.json"
  figure=$(python3 - "$OUT/kernel_bench.json" <<'PY'
import json, sys
try:
    rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
    copy = next(r for r in rows if r["kernel"] == "copy")
    kernels = [r for r in rows if "copy_fraction" in r]
    worst = min(kernels, key=lambda r: r["copy_fraction"])
    ok = all(r["copy_fraction"] >= 0.7 for r in kernels)
    print(("ok " if ok else "bad ") + f"{len(kernels)} kernel passes, worst {worst['kernel']} {worst['pass']} "
          f"{100 * worst['copy_fraction']:.0f}% ({worst['fused_gbps']:.0f} of {copy['copy_gbps']:.0f} GB/s), "
          f"median speedup over ATen {sorted(r['speedup'] for r in kernels)[len(kernels) // 2]:.2f}x")
except Exception as e:
    print(f"bad no report ({e})")
PY
)
  if ((rc == 0)) && [[ $figure == ok* ]]; then record PASS "kernel bandwidth" "${figure#ok }"
  else record FAIL "kernel bandwidth" "rc $rc, ${figure#* } (kernel_bench.log)"; fi
else
  record SKIP "kernel bandwidth" "time budget"
fi

# ---- training and benchmarks -------------------------------------------------------------------
train() {  # name config steps extra-sets… -> PASS when it exits 0 with a finite last loss
  local name=$1 config=$2 steps=$3; shift 3
  if ! in_budget; then record SKIP "train $name" "time budget"; return; fi
  local dir=/tmp/gpu_runs/$name sets=()
  for s in "$@"; do sets+=(--set "$s"); done
  rm -rf "$dir"
  ./build-gpu/flowtrain train -c "$config" --set run.out_dir="$dir" --set run.device=cuda \
    --set train.steps="$steps" --set train.log_every=10 --set sample.every=0 --set checkpoint.every=0 \
    --set data.path="$FLOWTRAIN_FASHION_MNIST" "${sets[@]}" > "$OUT/train-$name.log" 2>&1
  local rc=$? figure
  figure=$(python3 - "$dir/metrics.jsonl" <<'PY'
import json, math, sys
try:
    r = [row for row in (json.loads(l) for l in open(sys.argv[1]) if l.strip()) if "loss" in row][-1]
    ok = math.isfinite(r["loss"])
    print(("ok " if ok else "bad ") + f"loss {r['loss']:.4f}, {r['samples_per_s']:.0f} samples/s, {r['step_time_s'] * 1e3:.1f} ms/step")
except Exception as e:
    print(f"bad no metrics ({e})")
PY
)
  if ((rc == 0)) && [[ $figure == ok* ]]; then record PASS "train $name" "${figure#ok }"
  else record FAIL "train $name" "rc $rc, ${figure#* } (train-$name.log)"; fi
}

bench() {  # name steps extra-sets… -> flowtrain bench on synthetic latents, JSON in $OUT ($BENCH_CONFIG: another config)
  local name=$1 steps=$2; shift 2
  if ! in_budget; then record SKIP "bench $name" "time budget"; return; fi
  local sets=()
  for s in "$@"; do sets+=(--set "$s"); done
  ./build-gpu/flowtrain bench -c "${BENCH_CONFIG:-configs/bench/dit_s2_latent.yaml}" --synthetic --steps "$steps" \
    --warmup 3 --set run.device=cuda --json "$OUT/bench-$name.json" "${sets[@]}" > "$OUT/bench-$name.log" 2>&1
  local rc=$? figure
  figure=$(python3 - "$OUT/bench-$name.json" <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
    print(f"{r['step_time_median_s'] * 1e3:.1f} ms/step, {r['samples_per_s']:.0f} samples/s, "
          f"{r['achieved_tflops']:.0f} TFLOP/s = MFU {100 * r['mfu']:.1f}% of {r['peak_tflops']:.0f} ({r['peak_source']}), "
          f"peak {r['peak_memory_bytes'] / 2**30:.2f} GiB allocated"
          + (f", frozen encoders {r['encode_median_s'] * 1e3:.0f} ms of it" if r.get('encode_median_s') else "")
          # the config-only estimate (trainer/memory_estimate.h) beside it: bf16 is unchecked until this runs
          + (f" (estimated {r['estimated_peak_bytes'] / 2**30:.2f} GiB, "
             f"{100 * (r['estimated_peak_bytes'] / r['peak_memory_bytes'] - 1):+.0f}%)"
             if r.get('estimated_peak_bytes') else ""))
except Exception as e:
    print(f"no report ({e})")
PY
)
  if ((rc == 0)); then record PASS "bench $name" "$figure"; else record FAIL "bench $name" "rc $rc (bench-$name.log)"; fi
}

train default_bf16 configs/fashion_dit.yaml 300 train.precision=bf16
train default_fp32_tf32 configs/fashion_dit.yaml 300 train.precision=fp32
bench dit_b2_bf16 20 model.size=B model.hidden=0 model.depth=0 model.heads=0 data.batch_size=256 train.precision=bf16
bench dit_xl2_bf16 20 model.size=XL model.hidden=0 model.depth=0 model.heads=0 data.batch_size=256 train.precision=bf16
# fp8 (docs/fp8.md): step time of each hardware recipe against bf16 at Flux width (target ≥ 1.3×)
# and at DiT-XL/2; the log's "fp8 … linears converted" line says what ran in fp8.
BENCH_CONFIG=configs/bench/flux_width_latent.yaml bench flux_width_bf16 15
for recipe in tensorwise rowwise delayed; do
  BENCH_CONFIG=configs/bench/flux_width_latent.yaml bench flux_width_fp8_$recipe 15 fp8.recipe=$recipe
done
# FLUX.1-dev's width with the frozen T5-XXL, CLIP-L and AE run in every step (online, issue 34): a
# random-weights release at their real sizes first (flowtrain_random_release: 4.97B parameters,
# ~10 GB in bf16), then the step; its figure gives the encoders' share and the memory estimate.
if in_budget; then
  ./build-gpu/flowtrain_random_release --out /tmp/flux1-random --t5-tokenizer tests/reference/golden/t5_spiece.model \
    --clip-tokenizer tests/reference/golden/clip_tokenizer_small > "$OUT/random_release.log" 2>&1 ||
    record FAIL "random release" "rc $? (random_release.log)"
fi
BENCH_CONFIG=configs/bench/flux_width_online.yaml bench flux_width_online_bf16 10
bench dit_xl2_fp8_tensorwise 20 model.size=XL model.hidden=0 model.depth=0 model.heads=0 data.batch_size=256 \
  train.precision=bf16 fp8.recipe=tensorwise

# What a checkpoint save costs at DiT-XL/2 (docs/checkpoints.md): the run twice, saving every 3
# steps synchronously then asynchronously (CUDA staging on a side stream). ~11 GB per checkpoint.
if in_budget; then
  ./build-gpu/flowtrain bench -c configs/bench/dit_s2_latent.yaml --synthetic --steps 9 --warmup 3 --checkpoint \
    --checkpoint-every 3 --set run.device=cuda --set model.size=XL --set model.hidden=0 --set model.depth=0 \
    --set model.heads=0 --set data.batch_size=64 --set train.precision=bf16 \
    --json "$OUT/bench-checkpoint-xl.json" > "$OUT/bench-checkpoint-xl.log" 2>&1
  rc=$?
  figure=$(python3 - "$OUT/bench-checkpoint-xl.json" <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
    print(f"sync {r['checkpoint_sync_s']:.2f} s, async blocks {r['checkpoint_blocked_s']:.3f} s "
          f"({100 * r['checkpoint_blocked_fraction']:.1f}%), persist {r['checkpoint_persist_s']:.2f} s, "
          f"step {r['checkpoint_step_clear_s'] * 1e3:.0f} -> {r['checkpoint_step_overlap_s'] * 1e3:.0f} ms overlapped")
except Exception as e:
    print(f"no report ({e})")
PY
)
  if ((rc == 0)); then record PASS "checkpoint cost xl" "$figure"; else record FAIL "checkpoint cost xl" "rc $rc (bench-checkpoint-xl.log)"; fi
fi

# FSDP on NCCL at world 1 (parallel.fsdp=on): trains, and a Kineto trace of 3 steps must show the
# FSDP ranges and NCCL kernels.
train fsdp_nccl_w1 configs/fashion_dit.yaml 100 train.precision=bf16 parallel.fsdp=on parallel.backend=nccl \
  profile.enabled=true profile.start_step=20 profile.num_steps=3
if [[ -d /tmp/gpu_runs/fsdp_nccl_w1/profiles ]]; then
  cp /tmp/gpu_runs/fsdp_nccl_w1/profiles/*.json "$OUT/" 2>/dev/null
  summary=$(python3 - /tmp/gpu_runs/fsdp_nccl_w1/profiles <<'PY'
import glob, json, sys
names = set()
for path in glob.glob(sys.argv[1] + "/*.json"):
    for e in json.load(open(path)).get("traceEvents", []):
        names.add(e.get("name", ""))
fsdp = sorted(n for n in names if n.startswith("fsdp."))
nccl = sorted(n for n in names if "nccl" in n.lower())
print(("ok " if fsdp and nccl else "bad ") + f"{len(fsdp)} fsdp ranges ({', '.join(fsdp[:4])}), {len(nccl)} NCCL kernel names")
PY
)
  if [[ $summary == ok* ]]; then record PASS "fsdp trace" "${summary#ok }"; else record FAIL "fsdp trace" "${summary#bad }"; fi
fi

# ---- flowtrain against PyTorch eager / torch.compile (needs safetensors: carried in .wheels) ----
if in_budget && ls .wheels/safetensors-*.whl >/dev/null 2>&1; then
  python3 -m pip install --quiet --no-index --find-links .wheels --target /tmp/pylib safetensors > "$OUT/pip.log" 2>&1
  export PYTHONPATH=/tmp/pylib:${PYTHONPATH:-}
  FLOWTRAIN_BIN=build-gpu/flowtrain FLOWTRAIN_PYTHON=python3 bash bench/compare_pytorch.sh \
    configs/bench/dit_s2_latent.yaml 20 3 --no-network-check -- --set run.device=cuda --set model.size=B \
    --set model.hidden=0 --set model.depth=0 --set model.heads=0 --set data.batch_size=256 \
    --set train.precision=bf16 > "$OUT/compare_pytorch_b2.log" 2>&1
  rc=$?
  ratios=$(grep -E "step time ratio, median" "$OUT/compare_pytorch_b2.log" | sed 's/, median of 1 paired rounds//' | tr '\n' ';')
  if ((rc == 0)); then record PASS "vs PyTorch DiT-B/2 bf16" "$ratios"
  else record FAIL "vs PyTorch DiT-B/2 bf16" "rc $rc: $(tail -3 "$OUT/compare_pytorch_b2.log" | tr '\n' ' ')"; fi
else
  record SKIP "vs PyTorch DiT-B/2 bf16" "$(in_budget && echo 'no .wheels/safetensors-*.whl' || echo 'time budget')"
fi

echo
echo "== flowtrain GPU check ($(cat "$OUT/gpu.txt")), $(elapsed) s =="
printf '%s\n' "${results[@]}" | tee "$OUT/summary.tsv" | awk -F'\t' '{printf "%-5s %-26s %s\n", $1, $2, $3}'
! printf '%s\n' "${results[@]}" | grep -q '^FAIL'
