#!/usr/bin/env bash
# On the GPU machine: configure (sm_90a only) and build the given targets (default: all)
# into build-dev/, with the header-only deps carried in .carry/ (tools/device/prepare_carry.sh).
# Keeps going past a broken target so one bad test cannot cost the whole device call.
#   bash tools/device/build.sh [target ...]
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH=/usr/local/cuda/bin:$PATH
# FlashInfer's headers come in .carry/flashinfer.tgz (prepare_carry.sh); unpack once per version.
if [ -f .carry/flashinfer.tgz ] && ! cmp -s <(tar xzf .carry/flashinfer.tgz -O flashinfer/VERSION) third_party/flashinfer/VERSION 2>/dev/null; then
  rm -rf third_party/flashinfer && mkdir -p third_party && tar xzf .carry/flashinfer.tgz -C third_party
fi
# xgrammar's patched source, likewise (.carry/xgrammar.tgz).
if [ -f .carry/xgrammar.tgz ] && ! cmp -s <(tar xzf .carry/xgrammar.tgz -O xgrammar/FP4MOE_VERSION) third_party/xgrammar/FP4MOE_VERSION 2>/dev/null; then
  rm -rf third_party/xgrammar && mkdir -p third_party && tar xzf .carry/xgrammar.tgz -C third_party
fi
cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a -DFP4MOE_REQUIRE_CUDA=ON \
  -DFP4MOE_DEPS_PREFIX="$PWD/.carry" >build-dev.configure.log 2>&1 || { cat build-dev.configure.log; exit 1; }
if [ $# -eq 0 ]; then
  cmake --build build-dev -j "$(nproc)" -- -k
else
  for t in "$@"; do cmake --build build-dev -j "$(nproc)" --target "$t" -- -k; done
fi
