#!/usr/bin/env bash
# flowtrain against plain PyTorch on the same machine, threads, batch, config and initial weights.
#
#   bench/compare_pytorch.sh CONFIG [STEPS] [WARMUP] [--no-compile] [--no-network-check] [--rounds K]
#                            [-- FLOWTRAIN ARGS...]
#
# 1. `flowtrain bench -c CONFIG --synthetic` times STEPS training steps after WARMUP (defaults 20
#    and 3) and writes a parity dump: its initial weights and first micro-batch (x0, labels, t,
#    noise) with the loss on them. Arguments after `--` go to flowtrain bench, e.g.
#    `-- --set train.threads=1 --set data.batch_size=64` (the `--set`s also reach the network
#    check's training run); the peer follows through the dump's metadata.
# 2. Parity: bench/pytorch_peer.py loads the dump and compares the first-step loss. That loss does
#    not depend on the network (adaLN-Zero: the model outputs 0 at initialisation), so a short
#    `flowtrain train` on the same config and synthetic data (lr 0.01, checkpoint at step 5) also
#    checks the step-6 loss on the step-5 weights (--check-run; --no-network-check skips it).
# 3. Timing: the peer times the same step in eager PyTorch with flowtrain's thread count and
#    device, then under torch.compile unless --no-compile (a compile failure is reported, not fatal).
# 4. --rounds K (default 1): K−1 more timing rounds, each flowtrain bench then the eager peer
#    back to back, so that both sides of a pair see the same machine weather (on a shared VM the
#    speed drifts by ±10% over minutes); the summary gives each pair's ratio and their median.
# 5. A table, the parity lines and, last, the ratio lines
#    `flowtrain/pytorch-eager step time ratio: X.XX (memory ratio Y.YY)` (< 1: flowtrain faster).
#
# Environment: FLOWTRAIN_BIN (default build/flowtrain), FLOWTRAIN_DEPS (default
# ~/.cache/flowtrain; its torch-2.11.0/bin/python runs the peer), KEEP_BENCH_DIR=1 keeps the
# temporary directory with the dump, the runs' JSON reports and logs.
# Exit status: 0 ok; 1 a parity FAIL or a failed run; 2 usage.
set -euo pipefail

usage() { sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
positional=() extra=() compile=1 network_check=1 rounds=1
while (($#)); do
  case "$1" in
    --rounds) shift; rounds="${1:-}" ;;
    --no-compile) compile=0 ;;
    --no-network-check) network_check=0 ;;
    -h|--help) usage ;;
    --) shift; extra=("$@"); break ;;
    *) positional+=("$1") ;;
  esac
  shift
done
((${#positional[@]} >= 1 && ${#positional[@]} <= 3)) || usage
CONFIG="${positional[0]}"
STEPS="${positional[1]:-20}"
WARMUP="${positional[2]:-3}"
[[ -f "$CONFIG" ]] || { echo "compare_pytorch: no config file '$CONFIG'" >&2; exit 2; }
[[ "$STEPS" =~ ^[0-9]+$ && "$STEPS" -ge 1 && "$WARMUP" =~ ^[0-9]+$ ]] || usage
[[ "$rounds" =~ ^[0-9]+$ && "$rounds" -ge 1 ]] || { echo "compare_pytorch: --rounds needs a positive integer" >&2; exit 2; }

BIN="${FLOWTRAIN_BIN:-build/flowtrain}"
[[ -x "$BIN" || "$BIN" = /* ]] || BIN="$ROOT/$BIN"  # relative: from the cwd, else from the repo root
[[ -x "$BIN" ]] || { echo "compare_pytorch: no flowtrain binary at '$BIN' (build it or set FLOWTRAIN_BIN)" >&2; exit 1; }
PY="${FLOWTRAIN_DEPS:-$HOME/.cache/flowtrain}/torch-2.11.0/bin/python"
[[ -x "$PY" ]] || { echo "compare_pytorch: no Python with torch at '$PY' (run scripts/setup.sh or set FLOWTRAIN_DEPS)" >&2; exit 1; }
if ! "$PY" -c 'import safetensors' 2>/dev/null; then
  echo "installing safetensors into $PY" >&2
  "$PY" -m pip install --quiet safetensors >&2
fi

tmp="$(mktemp -d "${TMPDIR:-/tmp}/compare_pytorch.XXXXXX")"
if [[ "${KEEP_BENCH_DIR:-0}" == 1 ]]; then echo "keeping $tmp" >&2; else trap 'rm -rf "$tmp"' EXIT; fi
status=0

# CPU time the hypervisor gave to other guests while a run was timed (/proc/stat "steal", in
# USER_HZ ticks): on a shared VM it is the first thing to check when two runs disagree.
steal_ticks() { awk '/^cpu /{print $9}' /proc/stat 2>/dev/null || echo 0; }
record_steal() {  # record_steal NAME START_TICKS
  echo "$(( $(steal_ticks) - $2 ))" >"$tmp/$1.steal"
}

# ---- flowtrain bench (timing + parity dump) ------------------------------------------------
steal0=$(steal_ticks)
echo "== flowtrain bench -c $CONFIG --synthetic --steps $STEPS --warmup $WARMUP ${extra[*]:-}"
if ! "$BIN" bench -c "$CONFIG" --synthetic --steps "$STEPS" --warmup "$WARMUP" \
    --parity-dump "$tmp/parity.safetensors" --json "$tmp/flowtrain.json" "${extra[@]}" \
    >"$tmp/flowtrain.out" 2>"$tmp/flowtrain.log"; then
  cat "$tmp/flowtrain.out" "$tmp/flowtrain.log" >&2
  echo "compare_pytorch: flowtrain bench failed" >&2
  exit 1
fi
record_steal flowtrain "$steal0"
cat "$tmp/flowtrain.out"

field() { "$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"; }
THREADS="$(field "$tmp/flowtrain.json" threads)"
DEVICE="$(field "$tmp/flowtrain.json" device)"

# ---- parity: first-step loss, and the network on trained weights -----------------------------
check_args=()
if ((network_check)); then
  sets=()  # only the --set overrides apply to `flowtrain train`
  for ((i = 0; i < ${#extra[@]}; i++)); do
    case "${extra[i]}" in
      --set) sets+=(--set "${extra[i + 1]:-}"); i=$((i + 1)) ;;
      --set=*) sets+=("${extra[i]}") ;;
    esac
  done
  echo "== network check: flowtrain train -c $CONFIG (synthetic data, lr 0.01, 6 steps, checkpoint at step 5)"
  if "$BIN" train -c "$CONFIG" "${sets[@]}" --set data.source=synthetic --set run.out_dir="$tmp/trained" \
      --set train.steps=6 --set train.log_every=1 --set checkpoint.every=5 --set checkpoint.keep=0 \
      --set checkpoint.resume=never --set optim.lr=0.01 --set optim.warmup_steps=0 --set optim.schedule=constant \
      --set sample.every=0 --set eval.every=0 --set train.tensorboard=false --set profile.enabled=false \
      >"$tmp/trained.log" 2>&1; then
    check_args=(--check-run "$tmp/trained")
  else
    tail -n 20 "$tmp/trained.log" >&2
    echo "compare_pytorch: the network check's training run failed" >&2
    status=1
  fi
fi
echo "== parity: pytorch_peer.py --steps 0 --threads $THREADS --device $DEVICE ${check_args[*]:+--check-run DIR}"
if ! "$PY" "$ROOT/bench/pytorch_peer.py" --dump "$tmp/parity.safetensors" --steps 0 --threads "$THREADS" \
    --device "$DEVICE" "${check_args[@]}" >"$tmp/parity.out" 2>"$tmp/parity.log"; then
  tail -n 20 "$tmp/parity.log" >&2
  status=1
fi
cat "$tmp/parity.out"

# ---- the peer's timing runs ----------------------------------------------------------------
run_peer() {  # run_peer NAME [ARGS...] -> 0 ok, 1 parity FAIL or error, 3 compile failed
  local name="$1" rc=0
  shift
  echo "== $name: pytorch_peer.py --steps $STEPS --warmup $WARMUP --threads $THREADS --device $DEVICE $*"
  local start
  start=$(steal_ticks)
  "$PY" "$ROOT/bench/pytorch_peer.py" --dump "$tmp/parity.safetensors" --steps "$STEPS" --warmup "$WARMUP" \
    --threads "$THREADS" --device "$DEVICE" --json "$tmp/$name.json" "$@" \
    >"$tmp/$name.out" 2>"$tmp/$name.log" || rc=$?
  record_steal "$name" "$start"
  grep -v '^parity note' "$tmp/$name.out" || true
  if ((rc != 0 && rc != 3)); then tail -n 20 "$tmp/$name.log" >&2; fi
  return "$rc"
}

peers=(eager)
run_peer eager || status=1

# ---- more paired rounds (--rounds) -----------------------------------------------------------
for ((r = 2; r <= rounds; r++)); do
  echo "== round $r/$rounds: flowtrain bench, then the eager peer"
  if ! "$BIN" bench -c "$CONFIG" --synthetic --steps "$STEPS" --warmup "$WARMUP" --json "$tmp/round$r.flowtrain.json" \
      "${extra[@]}" >"$tmp/round$r.flowtrain.out" 2>"$tmp/round$r.flowtrain.log"; then
    tail -n 20 "$tmp/round$r.flowtrain.log" >&2
    echo "compare_pytorch: flowtrain bench failed in round $r" >&2
    exit 1
  fi
  if ! "$PY" "$ROOT/bench/pytorch_peer.py" --dump "$tmp/parity.safetensors" --steps "$STEPS" --warmup "$WARMUP" \
      --threads "$THREADS" --device "$DEVICE" --json "$tmp/round$r.eager.json" \
      >"$tmp/round$r.eager.out" 2>"$tmp/round$r.eager.log"; then
    tail -n 20 "$tmp/round$r.eager.log" >&2
    echo "compare_pytorch: the eager peer failed in round $r" >&2
    exit 1
  fi
done
if ((compile)); then
  rc=0
  run_peer compile --compile || rc=$?
  if ((rc == 0)); then peers+=(compile)
  elif ((rc == 3)); then echo "(torch.compile failed on this machine: the reason is above; not compared)"
  else status=1
  fi
fi

# ---- summary: table, parity, ratios last -----------------------------------------------------
echo
"$PY" - "$tmp" "$rounds" "${peers[@]}" <<'EOF'
import json, os, statistics, sys

tmp, rounds, peers = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
hz = os.sysconf("SC_CLK_TCK")


def steal_s(name):
    path = os.path.join(tmp, name + ".steal")
    return int(open(path).read()) / hz if os.path.exists(path) else float("nan")


ft = json.load(open(os.path.join(tmp, "flowtrain.json")))
ft["steal_s"] = steal_s("flowtrain")
rows = [("flowtrain", ft)]
for p in peers:
    path = os.path.join(tmp, p + ".json")
    if os.path.exists(path):
        r = json.load(open(path))
        r["steal_s"] = steal_s(p)
        rows.append((r["implementation"], r))

print(f"device {ft['device']}, fp32, {ft['threads']} threads, batch {ft['batch']} x {ft['tokens_per_sample']} tokens, "
      f"{ft['steps']} timed steps after {ft['warmup']} warm-up")
head = (f"{'implementation':<16} {'step median s':>13} {'(p10 - p90)':>19} {'min s':>8} {'samples/s':>10} "
        f"{'peak MiB':>9} {'steal s':>8}  memory")
print(head)
print("-" * len(head))
for name, r in rows:
    spread = f"({r['step_time_p10_s']:.4f} - {r['step_time_p90_s']:.4f})"
    print(f"{name:<16} {r['step_time_median_s']:>13.4f} {spread:>19} {r['step_time_min_s']:>8.4f} "
          f"{r['samples_per_s']:>10.1f} {r['peak_memory_bytes'] / 1048576:>9.1f} {r['steal_s']:>8.1f}  {r['memory_kind']}")
print("  steal s: CPU time taken by other guests of this VM during the whole run (warm-up, timing,\n"
      "  start-up), from /proc/stat; compare rows only when it is small next to the run's length.")
for name, r in rows[1:]:
    if r["memory_kind"] == "cpu peak RSS":
        print(f"  {name}: RSS after `import torch` {r['rss_after_import_bytes'] / 1048576:.1f} MiB, "
              f"before the first step {r['rss_before_first_step_bytes'] / 1048576:.1f} MiB"
              + (f"; compiled in {r['compile_s']:.1f} s before timing" if r.get("compile_s") else ""))
print()
for name, r in rows[1:]:
    print(f"parity ({name}): first-step loss flowtrain {r['reference_loss']:.9f}, pytorch {r['first_loss']:.9f}, "
          f"abs diff {r['parity_abs_diff']:.3e}, rel diff {r['parity_rel_diff']:.3e} -> {r['parity']}")
parity_out = os.path.join(tmp, "parity.out")
if os.path.exists(parity_out):
    for line in open(parity_out):
        if line.startswith(("parity (network", "network parity")):
            print(line.rstrip())
# With gradient accumulation the benchmark's first loss is the whole step's, the dump's the first
# micro-batch's: they differ by design.
grad_accum = int(rows[1][1].get("grad_accum", 1)) if rows[1:] else 1
if rows[1:] and grad_accum == 1 and ft["first_loss"] != rows[1][1]["reference_loss"]:
    print(f"note: flowtrain's benchmark run reported first loss {ft['first_loss']:.9f}, its parity dump "
          f"{rows[1][1]['reference_loss']:.9f}: the dump does not reproduce the trainer's first step")
for name, r in rows[1:]:
    print(f"flowtrain/{name} step time ratio: {ft['step_time_median_s'] / r['step_time_median_s']:.2f} "
          f"(memory ratio {ft['peak_memory_bytes'] / r['peak_memory_bytes']:.2f})")
if rounds > 1 and "eager" in peers:
    pairs = [(ft["step_time_median_s"], json.load(open(os.path.join(tmp, "eager.json")))["step_time_median_s"])]
    for k in range(2, rounds + 1):
        f = json.load(open(os.path.join(tmp, f"round{k}.flowtrain.json")))
        e = json.load(open(os.path.join(tmp, f"round{k}.eager.json")))
        pairs.append((f["step_time_median_s"], e["step_time_median_s"]))
    ratios = [f / e for f, e in pairs]
    print(f"paired rounds (flowtrain s / eager s): "
          + ", ".join(f"{f:.4f}/{e:.4f}={f / e:.2f}" for f, e in pairs))
    print(f"flowtrain/pytorch-eager step time ratio, median of {rounds} paired rounds: "
          f"{statistics.median(ratios):.2f} (range {min(ratios):.2f}-{max(ratios):.2f})")
EOF
if ((status != 0)); then echo "compare_pytorch: a parity FAIL or a failed run (see above)" >&2; fi
exit "$status"
