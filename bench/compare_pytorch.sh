#!/usr/bin/env bash
# flowtrain against plain PyTorch (eager and torch.compile) on the same machine, threads, allocator
# settings, batch, config and initial weights, in paired rounds.
#
#   bench/compare_pytorch.sh CONFIG [STEPS] [WARMUP] [--rounds K] [--no-compile] [--no-network-check]
#                            [--allocator tuned|default] [-- FLOWTRAIN ARGS...]
#
# 1. Setup (untimed): `flowtrain bench --steps 0 --parity-dump` writes flowtrain's initial weights,
#    its first micro-batch (x0, labels, t, noise), the loss on it and what its step does
#    (precision, grad_clip, EMA, AdamW settings, timestep distribution, label dropout,
#    activation checkpointing) in the metadata. bench/pytorch_peer.py follows all of it, or
#    refuses (exit 2) a config it cannot follow, so a row never compares unequal work.
#    Arguments after `--` go to flowtrain (e.g. `-- --set train.threads=1 --set train.precision=bf16`)
#    and so reach the peer through the dump.
# 2. Parity: the peer's loss on the dump's inputs and weights against flowtrain's, and — unless
#    --no-network-check — the step-6 loss on flowtrain's trained step-5 weights (a 6-step
#    `flowtrain train` on synthetic data, lr 0.01), which exercises the whole network.
# 3. K paired rounds (--rounds, default 1). Each round times flowtrain (`flowtrain bench
#    --synthetic --steps STEPS --warmup WARMUP`, defaults 20 and 3), the eager peer and the
#    torch.compile peer (unless --no-compile) back to back; odd rounds run flowtrain first, even
#    rounds the peers first, so neither side always meets the VM's drift first. A compile
#    failure is reported in the summary, never hidden.
# 4. Allocator (--allocator): both sides run on glibc malloc with the SAME settings.
#    tuned (default): MALLOC_MMAP_THRESHOLD_=32 MiB and MALLOC_TRIM_THRESHOLD_=1 GiB exported to
#    every process — the values flowtrain sets for itself with mallopt at start (so flowtrain is
#    unchanged and the peer gets them too); default: glibc's defaults on both sides
#    (FLOWTRAIN_MALLOC_DEFAULTS=1 for flowtrain, nothing for the peer).
# 5. Summary last: a table per round, the parity lines, then per peer
#    `flowtrain/pytorch-<peer> step time ratio, median of K paired rounds: X.XX (range …), memory Y.YY`
#    (< 1: flowtrain faster / smaller).
#
# Environment: FLOWTRAIN_BIN (default build/flowtrain), FLOWTRAIN_PYTHON (the Python with torch
# that runs the peer; default $FLOWTRAIN_DEPS/torch-2.11.0/bin/python, FLOWTRAIN_DEPS defaulting
# to ~/.cache/flowtrain), KEEP_BENCH_DIR=1 keeps the
# temporary directory with the dump, every run's JSON report and log.
# Exit status: 0 ok; 1 a parity FAIL or a failed run; 2 usage or a config the peer cannot follow.
set -euo pipefail

usage() { sed -n '2,36p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
positional=() extra=() compile=1 network_check=1 rounds=1 allocator=tuned
while (($#)); do
  case "$1" in
    --rounds) shift; rounds="${1:-}" ;;
    --allocator) shift; allocator="${1:-}" ;;
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
case "$allocator" in
  tuned) export MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=1073741824; unset FLOWTRAIN_MALLOC_DEFAULTS ;;
  default) unset MALLOC_MMAP_THRESHOLD_ MALLOC_TRIM_THRESHOLD_; export FLOWTRAIN_MALLOC_DEFAULTS=1 ;;
  *) echo "compare_pytorch: --allocator is tuned or default, not '$allocator'" >&2; exit 2 ;;
esac

BIN="${FLOWTRAIN_BIN:-build/flowtrain}"
[[ -x "$BIN" || "$BIN" = /* ]] || BIN="$ROOT/$BIN"  # relative: from the cwd, else from the repo root
[[ -x "$BIN" ]] || { echo "compare_pytorch: no flowtrain binary at '$BIN' (build it or set FLOWTRAIN_BIN)" >&2; exit 1; }
PY="${FLOWTRAIN_PYTHON:-${FLOWTRAIN_DEPS:-$HOME/.cache/flowtrain}/torch-2.11.0/bin/python}"
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

# ---- setup: the parity dump (untimed, a process of its own) ----------------------------------
echo "== allocator: $allocator (both sides) | flowtrain bench -c $CONFIG --synthetic --steps 0 --parity-dump ${extra[*]:-}"
if ! "$BIN" bench -c "$CONFIG" --synthetic --steps 0 --parity-dump "$tmp/parity.safetensors" "${extra[@]}" \
    >"$tmp/dump.out" 2>"$tmp/dump.log"; then
  cat "$tmp/dump.out" "$tmp/dump.log" >&2
  echo "compare_pytorch: writing the parity dump failed" >&2
  exit 1
fi

# ---- one timed run of one side -----------------------------------------------------------------
# run_side ROUND SIDE -> 0 ok, 1 failed or parity FAIL, 2 the peer refused the config, 3 compile failed
run_side() {
  local round="$1" side="$2" rc=0 start
  local base="$tmp/round$round.$side"
  start=$(steal_ticks)
  case "$side" in
    flowtrain)
      "$BIN" bench -c "$CONFIG" --synthetic --steps "$STEPS" --warmup "$WARMUP" --json "$base.json" "${extra[@]}" \
        >"$base.out" 2>"$base.log" || rc=1 ;;
    eager|compile)
      local flags=()
      [[ "$side" == compile ]] && flags=(--compile)
      "$PY" "$ROOT/bench/pytorch_peer.py" --dump "$tmp/parity.safetensors" --steps "$STEPS" --warmup "$WARMUP" \
        --threads "$THREADS" --device "$DEVICE" --json "$base.json" "${flags[@]}" >"$base.out" 2>"$base.log" || rc=$? ;;
  esac
  echo "$(( $(steal_ticks) - start ))" >"$base.steal"
  if ((rc != 0 && rc != 3)); then tail -n 20 "$base.out" "$base.log" >&2; fi
  if ((rc == 3)); then grep -h 'torch.compile failed' "$base.out" >&2 || true; fi
  return "$rc"
}

field() { "$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"; }

sides=(flowtrain eager)
((compile)) && sides+=(compile)
for ((r = 1; r <= rounds; r++)); do
  order=("${sides[@]}")
  if ((r % 2 == 0)); then order=(); for ((i = ${#sides[@]} - 1; i >= 0; i--)); do order+=("${sides[i]}"); done; fi
  echo "== round $r/$rounds: ${order[*]}"
  for side in "${order[@]}"; do
    rc=0
    run_side "$r" "$side" || rc=$?
    if [[ "$side" == flowtrain && "$r" == 1 ]]; then
      ((rc == 0)) || { echo "compare_pytorch: flowtrain bench failed" >&2; exit 1; }
      # The peer takes flowtrain's thread count and device (round 1 runs flowtrain first).
      THREADS="$(field "$tmp/round1.flowtrain.json" threads)"
      DEVICE="$(field "$tmp/round1.flowtrain.json" device)"
    fi
    if ((rc == 2)); then cat "$tmp/round$r.$side.log" >&2; exit 2; fi
    if ((rc == 1)); then status=1; fi
  done
done

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

# ---- summary: per-round table, parity, ratios last --------------------------------------------
echo
"$PY" - "$tmp" "$rounds" "$allocator" "${sides[@]}" <<'EOF'
import json, os, statistics, sys

tmp, rounds, allocator, sides = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
hz = os.sysconf("SC_CLK_TCK")


def load(r, side):
    path = os.path.join(tmp, f"round{r}.{side}.json")
    if not os.path.exists(path):
        return None
    rep = json.load(open(path))
    steal = os.path.join(tmp, f"round{r}.{side}.steal")
    rep["steal_s"] = int(open(steal).read()) / hz if os.path.exists(steal) else float("nan")
    return rep


def compile_failure(r):
    path = os.path.join(tmp, f"round{r}.compile.out")
    if not os.path.exists(path):
        return ""
    lines = [l.strip() for l in open(path) if "torch.compile failed" in l]
    return lines[0] if lines else ""


runs = {(r, s): load(r, s) for r in range(1, rounds + 1) for s in sides}
ft = runs[(1, "flowtrain")]
print(f"device {ft['device']}, {ft['precision']}, {ft['threads']} threads, batch {ft['batch']} x "
      f"{ft['tokens_per_sample']} tokens, {ft['steps']} timed steps after {ft['warmup']} warm-up, "
      f"glibc malloc settings '{allocator}' on both sides")
head = (f"{'round':>5} {'implementation':<16} {'step median s':>13} {'(p10 - p90)':>19} {'samples/s':>10} "
        f"{'peak MiB':>9} {'steal s':>8}")
print(head)
print("-" * len(head))
for r in range(1, rounds + 1):
    for s in sides:
        rep = runs[(r, s)]
        if rep is None:
            why = compile_failure(r) if s == "compile" else "failed (see above)"
            print(f"{r:>5} {'pytorch-' + s if s != 'flowtrain' else s:<16} {why}")
            continue
        name = rep.get("implementation", "flowtrain")
        spread = f"({rep['step_time_p10_s']:.4f} - {rep['step_time_p90_s']:.4f})"
        print(f"{r:>5} {name:<16} {rep['step_time_median_s']:>13.4f} {spread:>19} {rep['samples_per_s']:>10.1f} "
              f"{rep['peak_memory_bytes'] / 1048576:>9.1f} {rep['steal_s']:>8.1f}")
print(f"  peak MiB: {ft['memory_kind']} of each process (the peer's includes the Python interpreter and "
      "`import torch`); steal s: CPU time other guests of this VM took during the run (/proc/stat).")
print()
parity_out = os.path.join(tmp, "parity.out")
if os.path.exists(parity_out):
    for line in open(parity_out):
        if line.startswith("parity"):
            print(line.rstrip())
for r in range(1, rounds + 1):
    for s in sides[1:]:
        rep = runs[(r, s)]
        if rep is not None and rep.get("parity") != "PASS":
            print(f"round {r} {s}: parity {rep.get('parity')} (rel diff {rep.get('parity_rel_diff')})")
print()
for s in sides[1:]:
    pairs = [(runs[(r, "flowtrain")], runs[(r, s)]) for r in range(1, rounds + 1)]
    pairs = [(f, p) for f, p in pairs if f is not None and p is not None]
    if not pairs:
        print(f"flowtrain/pytorch-{s}: no comparison ({compile_failure(1) or 'the peer failed'})")
        continue
    ratios = [f["step_time_median_s"] / p["step_time_median_s"] for f, p in pairs]
    mem = [f["peak_memory_bytes"] / p["peak_memory_bytes"] for f, p in pairs]
    detail = ", ".join(f"{f['step_time_median_s']:.4f}/{p['step_time_median_s']:.4f}={f['step_time_median_s'] / p['step_time_median_s']:.2f}"
                       for f, p in pairs)
    missing = rounds - len(pairs)
    print(f"paired rounds (flowtrain s / pytorch-{s} s): {detail}" + (f"; {missing} round(s) failed" if missing else ""))
    print(f"flowtrain/pytorch-{s} step time ratio, median of {len(pairs)} paired rounds: "
          f"{statistics.median(ratios):.2f} (range {min(ratios):.2f}-{max(ratios):.2f}), "
          f"memory ratio {statistics.median(mem):.2f}")
EOF
if ((status != 0)); then echo "compare_pytorch: a parity FAIL or a failed run (see above)" >&2; fi
exit "$status"
