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
python3 -c 'import numpy, matplotlib, openai' >/dev/null 2>&1 || python3 -m pip install -q "${PIP_PACKAGES[@]}"

[ "${1:-}" = "--deps" ] && exit 0

BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
cmake_args=(-S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release)
[ -n "${FP4MOE_CUDA:-}" ] && cmake_args+=(-DFP4MOE_CUDA="$FP4MOE_CUDA")
[ -n "${CUDA_ARCHS:-}" ] && cmake_args+=(-DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCHS")
command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ] && export PATH=/usr/local/cuda/bin:$PATH
cmake "${cmake_args[@]}"
cmake --build "$BUILD_DIR" -j "$JOBS"
