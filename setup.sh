#!/usr/bin/env bash
# Installs every dependency of fp4moe on a fresh Debian 12 machine (pinned), then builds.
#   ./setup.sh            install + configure + build (build/)
#   ./setup.sh --deps     install only
# Environment: BUILD_DIR (default build), FP4MOE_CUDA (ON/OFF, default: auto), JOBS.
set -euo pipefail
cd "$(dirname "$0")"

APT_PACKAGES=(
  "cmake=3.25.1-1"
  "g++-12"
  "libgtest-dev=1.12.1-0.2"
  "nlohmann-json3-dev=3.11.2-2"
  "libcli11-dev=2.1.2+ds-1"
  "libfmt-dev=9.1.0+ds1-2"
  "libpcre2-dev=10.42-1+deb12u2"
  "libutf8proc-dev=2.8.0-1"
  "clang-14"
  "libclang-rt-14-dev"
  "libcpp-httplib-dev=0.11.4+ds-1+deb12u1"
)
PIP_PACKAGES=(
  "numpy==1.26.4"
  "matplotlib==3.8.4"
  "openai==2.8.1"
  "jsonschema==4.26.0"
)

need_apt=0
for p in "${APT_PACKAGES[@]}"; do
  name=${p%%=*}
  dpkg -s "$name" >/dev/null 2>&1 || need_apt=1
done
if [ "$need_apt" = 1 ]; then
  export DEBIAN_FRONTEND=noninteractive
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${APT_PACKAGES[@]}"
fi
python3 -c 'import numpy, matplotlib, openai, jsonschema' >/dev/null 2>&1 || python3 -m pip install -q "${PIP_PACKAGES[@]}"

# FlashInfer's C++ headers (SM90 MLA attention) with its bundled CUTLASS and CCCL, from the
# PyPI wheel (downloaded, never installed: installing pulls torch). Unpacked, trimmed to the
# include trees, into third_party/flashinfer/ (ignored); CMake finds it there.
FLASHINFER_VERSION=0.7.2.post1
FLASHINFER_WHEEL=flashinfer_python-${FLASHINFER_VERSION}-py3-none-any.whl
FLASHINFER_SHA256=bfdc18b9e1e4d8d0730fe4343dc0e284cd0c160086de80f99888bc4867922d49
FLASHINFER_DIR=third_party/flashinfer
FLASHINFER_STAMP="$FLASHINFER_VERSION (include, cutlass/include, cutlass/tools/util/include, cccl)"
if [ "$(cat "$FLASHINFER_DIR/VERSION" 2>/dev/null)" != "$FLASHINFER_STAMP" ]; then
  mkdir -p .whl
  [ -f ".whl/$FLASHINFER_WHEEL" ] ||
    python3 -m pip download -q --no-deps "flashinfer-python==${FLASHINFER_VERSION}" -d .whl
  echo "$FLASHINFER_SHA256  .whl/$FLASHINFER_WHEEL" | sha256sum -c --quiet
  rm -rf "$FLASHINFER_DIR" .whl/unpack && mkdir -p "$FLASHINFER_DIR"
  python3 -m zipfile -e ".whl/$FLASHINFER_WHEEL" .whl/unpack  # no unzip(1) needed
  d=.whl/unpack/flashinfer/data
  mkdir -p "$FLASHINFER_DIR/cutlass/tools/util" "$FLASHINFER_DIR/cccl/libcudacxx" "$FLASHINFER_DIR/cccl/cub" \
    "$FLASHINFER_DIR/cccl/thrust"
  mv "$d/include" "$FLASHINFER_DIR/include"
  mv "$d/cutlass/include" "$FLASHINFER_DIR/cutlass/include"
  mv "$d/cutlass/tools/util/include" "$FLASHINFER_DIR/cutlass/tools/util/include"
  mv "$d/cutlass/LICENSE.txt" "$FLASHINFER_DIR/cutlass/" 2>/dev/null || true
  mv "$d/cccl/libcudacxx/include" "$FLASHINFER_DIR/cccl/libcudacxx/include"
  mv "$d/cccl/cub/cub" "$FLASHINFER_DIR/cccl/cub/cub"
  mv "$d/cccl/thrust/thrust" "$FLASHINFER_DIR/cccl/thrust/thrust"
  mv "$d/cccl/LICENSE" "$FLASHINFER_DIR/cccl/" 2>/dev/null || true
  rm -rf .whl/unpack
  echo "$FLASHINFER_STAMP" > "$FLASHINFER_DIR/VERSION"
fi

# xgrammar's C++ core (constrained decoding, Apache-2.0), from its PyPI source distribution
# (downloaded, never installed), unpacked into third_party/xgrammar/ (ignored) and patched;
# src/grammar's CMake builds its static library from there (no Python bindings, tests or LTO).
XGRAMMAR_VERSION=0.2.9
XGRAMMAR_SDIST=xgrammar-${XGRAMMAR_VERSION}.tar.gz
XGRAMMAR_SHA256=87b466bca2475e29bb0323abc62c6c33cbcbcff47e5fb800a3e2099ac9620b90
XGRAMMAR_DIR=third_party/xgrammar
XGRAMMAR_STAMP="$XGRAMMAR_VERSION (tools/grammar/patch_xgrammar.py: 9 fixes)"
if [ "$(cat "$XGRAMMAR_DIR/FP4MOE_VERSION" 2>/dev/null)" != "$XGRAMMAR_STAMP" ]; then
  mkdir -p .whl
  [ -f ".whl/$XGRAMMAR_SDIST" ] ||
    python3 -m pip download -q --no-deps --no-binary xgrammar "xgrammar==${XGRAMMAR_VERSION}" -d .whl
  echo "$XGRAMMAR_SHA256  .whl/$XGRAMMAR_SDIST" | sha256sum -c --quiet
  rm -rf "$XGRAMMAR_DIR" ".whl/xgrammar-${XGRAMMAR_VERSION}" && mkdir -p third_party
  tar -xzf ".whl/$XGRAMMAR_SDIST" -C .whl
  mv ".whl/xgrammar-${XGRAMMAR_VERSION}" "$XGRAMMAR_DIR"
  # Fixes found by our tests (an over-strict mask, raw control characters in bounded JSON
  # strings, surrogates in character classes, escape overflow, a regex `?` after a loop) and the
  # email format's domain as an automaton (same masks, ~5x cheaper on average):
  # tools/grammar/patch_xgrammar.py says what and why.
  python3 tools/grammar/patch_xgrammar.py "$XGRAMMAR_DIR"
  echo "$XGRAMMAR_STAMP" > "$XGRAMMAR_DIR/FP4MOE_VERSION"
fi

[ "${1:-}" = "--deps" ] && exit 0

BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
cmake_args=(-S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release)
[ -n "${FP4MOE_CUDA:-}" ] && cmake_args+=(-DFP4MOE_CUDA="$FP4MOE_CUDA")
[ -n "${CUDA_ARCHS:-}" ] && cmake_args+=(-DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCHS")
command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ] && export PATH=/usr/local/cuda/bin:$PATH
cmake "${cmake_args[@]}"
cmake --build "$BUILD_DIR" -j "$JOBS"
