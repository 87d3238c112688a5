#!/usr/bin/env bash
# Configures and builds flowtrain into build/ (or $FLOWTRAIN_BUILD_DIR). Runs setup first.
#   FLOWTRAIN_TORCH_DIR=/path/to/share/cmake   use your own LibTorch instead of the pip wheel
#   FLOWTRAIN_JOBS=N                           parallel compile jobs (default: cores)
set -euo pipefail
cd "$(dirname "$0")/.."
torch_prefix=$(./scripts/setup.sh | tail -n 1)
build=${FLOWTRAIN_BUILD_DIR:-build}
jobs=${FLOWTRAIN_JOBS:-$(nproc)}
export CCACHE_DIR=${CCACHE_DIR:-${FLOWTRAIN_DEPS:-$HOME/.cache/flowtrain}/ccache}
if [ ! -f "$build/build.ninja" ]; then
  cmake -G Ninja -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_PREFIX_PATH="$torch_prefix" "$@"
fi
ninja -C "$build" -j "$jobs"
