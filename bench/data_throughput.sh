#!/usr/bin/env bash
# Loader throughput from WebDataset shards (docs/perf.md "Data loader throughput"): packs
# Fashion-MNIST (PNG 28×28 gray) and, if given, a compositions directory (PNG 56×56 RGB +
# captions), then runs `flowtrain bench --data-only` for workers 1/2/4 from local disk and from a
# local `python3 -m http.server`, each REPEATS times; prints median [min–max] samples/s and MB/s.
# Usage: bench/data_throughput.sh [COMPOSITIONS_DIR]   (FLOWTRAIN=build/flowtrain, REPEATS=3)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${FLOWTRAIN:-build/flowtrain}
repeats=${REPEATS:-3}
work=$(mktemp -d)
port=$((20000 + RANDOM % 20000))
trap 'kill $server 2>/dev/null || true; rm -rf "$work"' EXIT

"$bin" data pack --from fashion-mnist --out "$work/fmnist" > /dev/null 2>&1
sets=("fmnist|configs/fashion_dit.yaml|")
if [[ $# -ge 1 ]]; then
  "$bin" data pack --from "compositions:$1" --out "$work/comp" --max-count 5000 > /dev/null 2>&1
  sets+=("comp|configs/fashion_t2i.yaml|--set data.path=$1")
fi
python3 -m http.server "$port" --bind 127.0.0.1 --directory "$work" > /dev/null 2>&1 &
server=$!
sleep 1

printf "%-7s %-6s %-7s %-28s %s\n" data where workers "samples/s median [min-max]" "MB/s median"
for set in "${sets[@]}"; do
  IFS='|' read -r name config extra <<< "$set"
  last=$(ls "$work/$name"/train-*.tar | wc -l)
  pattern="train-{000000..$(printf %06d $((last - 1)))}.tar"
  for where in local http; do
    if [[ $where == local ]]; then shards="$work/$name/$pattern"; index=""
    else shards="http://127.0.0.1:$port/$name/$pattern"; index="--set data.shard_index=http://127.0.0.1:$port/$name/index.json"; fi
    for workers in 1 2 4; do
      rates=(); mbs=()
      for ((i = 0; i < repeats; i++)); do
        "$bin" bench --data-only -c "$config" $extra --set data.source=shards --set "data.shards=$shards" $index \
          --set data.workers=$workers --steps 1000 --warmup 20 --json "$work/r.json" > /dev/null 2>&1
        rates+=("$(python3 -c "import json;print(round(json.load(open('$work/r.json'))['samples_per_s']))")")
        mbs+=("$(python3 -c "import json;print(round(json.load(open('$work/r.json'))['member_mb_per_s'],1))")")
      done
      summary=$(printf "%s\n" "${rates[@]}" | sort -n | awk '{a[NR]=$1} END {printf "%d [%d-%d]", a[int((NR+1)/2)], a[1], a[NR]}')
      mb=$(printf "%s\n" "${mbs[@]}" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
      printf "%-7s %-6s %-7s %-28s %s\n" "$name" "$where" "$workers" "$summary" "$mb"
    done
  done
done
