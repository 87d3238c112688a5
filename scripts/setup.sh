#!/usr/bin/env bash
# Installs everything flowtrain needs on a fresh Debian 12 machine, and nothing twice:
#   - Debian packages (compiler tools, yaml-cpp, spdlog, fmt, json, gtest, libpng, CLI11, the
#     Fashion-MNIST data set, and Slurm's controller/node daemons and client for the `slurm`
#     test label), skipped when all are present;
#   - LibTorch, as the PyPI torch==2.11.0 wheel (CUDA 13.0 build) in a virtualenv outside the
#     repository: $FLOWTRAIN_DEPS/torch-2.11.0 (default FLOWTRAIN_DEPS=~/.cache/flowtrain), so
#     every clone and CI run reuses it. Skipped when FLOWTRAIN_TORCH_DIR (a directory holding
#     TorchConfig.cmake, e.g. from an NGC container) is set;
#   - OpenAI CLIP's BPE vocabulary as open_clip_torch==3.3.0 ships it, for the CLIP tokenizer's
#     tests: $FLOWTRAIN_DEPS/clip/bpe_simple_vocab_16e6.txt.gz (its sha256 checked).
# Prints the Torch CMake prefix on its last line.
set -euo pipefail

deb_packages=(build-essential cmake ninja-build ccache pkg-config python3-venv
  libyaml-cpp-dev libspdlog-dev libfmt-dev nlohmann-json3-dev libgtest-dev libgmock-dev
  libpng-dev libjpeg62-turbo-dev libcurl4-openssl-dev libavformat-dev libavcodec-dev libswscale-dev zlib1g-dev libicu-dev libcli11-dev libgloo-dev libsentencepiece-dev dataset-fashion-mnist
  slurmctld slurmd slurm-client)  # Slurm: tests/slurm/ starts its own cluster (scripts/slurm/local_cluster.sh)

missing=()
for p in "${deb_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "[setup] installing Debian packages: ${missing[*]}" >&2
  sudo_cmd=""; [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  # The Slurm (and munge) packages' postinst would start system daemons; the tests start their
  # own cluster instead. A policy-rc.d that exits 101 forbids service starts during the install;
  # only one we created is removed (containers often ship their own).
  policy_rc=/usr/sbin/policy-rc.d; own_policy_rc=""
  if [ ! -e "$policy_rc" ]; then
    printf '#!/bin/sh\nexit 101\n' | $sudo_cmd tee "$policy_rc" >/dev/null
    $sudo_cmd chmod 755 "$policy_rc"
    own_policy_rc=1
    trap '$sudo_cmd rm -f "$policy_rc"' EXIT  # also when the install fails
  fi
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
  if [ -n "$own_policy_rc" ]; then $sudo_cmd rm -f "$policy_rc"; trap - EXIT; fi
fi

deps=${FLOWTRAIN_DEPS:-$HOME/.cache/flowtrain}
# CLIP's vocabulary from the open_clip_torch wheel (downloaded, not installed: only the file).
fetch_clip_vocabulary() {
  local python=$1
  local clip_vocab=$deps/clip/bpe_simple_vocab_16e6.txt.gz
  local sha256=924691ac288e54409236115652ad4aa250f48203de50a9e4722a6ecd48d6804a
  echo "$sha256  $clip_vocab" | sha256sum -c --status 2>/dev/null && return 0
  echo "[setup] fetching CLIP's BPE vocabulary (open_clip_torch==3.3.0) into $clip_vocab" >&2
  local wheel_dir
  wheel_dir=$(mktemp -d)
  mkdir -p "$(dirname "$clip_vocab")"
  if ! "$python" -m pip download -q --disable-pip-version-check --no-deps open_clip_torch==3.3.0 -d "$wheel_dir" >&2 ||
     ! "$python" - "$wheel_dir" "$clip_vocab.part" <<'PY'
import glob, sys, zipfile
with zipfile.ZipFile(glob.glob(sys.argv[1] + "/*.whl")[0]) as wheel, open(sys.argv[2], "wb") as out:
    out.write(wheel.read("open_clip/bpe_simple_vocab_16e6.txt.gz"))
PY
  then
    rm -rf "$wheel_dir"
    echo "[setup] could not fetch open_clip_torch==3.3.0 from PyPI for CLIP's vocabulary" >&2
    exit 1
  fi
  rm -rf "$wheel_dir"
  echo "$sha256  $clip_vocab.part" | sha256sum -c --status || {
    echo "[setup] $clip_vocab.part: not the expected sha256 $sha256" >&2; exit 1; }
  mv "$clip_vocab.part" "$clip_vocab"
}

# The object-store tests' S3 server (tests/s3_server.py): moto's, pinned, in a venv of its own.
install_s3_test_server() {
  local venv=$deps/moto-venv
  "$venv/bin/python" -c 'import moto, sys; sys.exit(moto.__version__ != "5.2.6")' 2>/dev/null && return 0
  echo "[setup] installing moto[server]==5.2.6 (the tests' loopback S3 server) into $venv" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "moto[server]==5.2.6" >&2
}
install_s3_test_server

if [ -n "${FLOWTRAIN_TORCH_DIR:-}" ]; then
  [ -f "$FLOWTRAIN_TORCH_DIR/TorchConfig.cmake" ] || [ -f "$FLOWTRAIN_TORCH_DIR/Torch/TorchConfig.cmake" ] || {
    echo "[setup] FLOWTRAIN_TORCH_DIR=$FLOWTRAIN_TORCH_DIR holds no TorchConfig.cmake" >&2; exit 1; }
  # Debian's python3 has no pip: a small venv of its own has one (python3-venv is installed above).
  [ -x "$deps/pip-venv/bin/python" ] || python3 -m venv "$deps/pip-venv"
  fetch_clip_vocabulary "$deps/pip-venv/bin/python"
  echo "$FLOWTRAIN_TORCH_DIR"
  exit 0
fi

venv=$deps/torch-2.11.0
if ! "$venv/bin/python" -c 'import torch, sys; sys.exit(torch.__version__.split("+")[0] != "2.11.0")' 2>/dev/null; then
  echo "[setup] installing torch==2.11.0 (LibTorch, CUDA 13.0 build) into $venv" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check torch==2.11.0 numpy >&2
fi
fetch_clip_vocabulary "$venv/bin/python"
"$venv/bin/python" -c 'import torch; print(torch.utils.cmake_prefix_path)'
