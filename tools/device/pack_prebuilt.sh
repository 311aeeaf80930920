#!/usr/bin/env bash
# Packs binaries built HERE (build/, Release, sm_90a in them: the default arch list) into .pre/
# for a device call that skips the ~4-minute build on the GPU machine: name ".pre" in the
# call's carry list, then on the device
#     source tools/device/prebuilt_env.sh && bash tools/device/steps/80_serve_sweep.sh
# (or run a carried test binary: "$PRE_BIN/mla_attention_test"). Each binary travels xz-compressed
# (three CUDA archs in each; gpu_runner_test: ~60 MB -> ~9 MB, about half of gzip's size; the carry limit is 64 MiB in all), with the shared libraries the GPU
# machine lacks (text/'s PCRE2 and utf8proc, cpp-httplib and what it needs).
#   bash tools/device/pack_prebuilt.sh [test_binary ...]     fp4moe always
set -euo pipefail
cd "$(dirname "$0")/../.."
rm -rf .pre && mkdir -p .pre/lib
for b in fp4moe "$@"; do
  [ -x "build/bin/$b" ] || { echo "pack_prebuilt: build/bin/$b is not built (cmake --build build --target $b)" >&2; exit 1; }
  xz -T2 -6 -c "build/bin/$b" > ".pre/$b.xz"
done
# The shared libraries fp4moe links that are not CUDA's or the C / C++ runtime's.
ldd build/bin/fp4moe | awk '/=> \// {print $3}' |
  grep -E 'libpcre2|libutf8proc|libcpp-httplib|libssl|libcrypto|libbrotli' | while read -r l; do
    xz -T2 -6 -c "$l" > ".pre/lib/$(basename "$l").xz"  # unpacked by prebuilt_env.sh (7.6 MB -> ~2.5 MB)
  done
git rev-parse --short HEAD > .pre/COMMIT
pwd > .pre/SOURCE_DIR  # the test binaries' compiled-in FP4MOE_SOURCE_DIR (FP4MOE_BINARY_DIR = it/build)
git diff --quiet HEAD -- src tests CMakeLists.txt || echo "pack_prebuilt: note: src / tests differ from HEAD ($(cat .pre/COMMIT))" >&2
du -sh .pre | awk '{print "pack_prebuilt: .pre is " $1}'
# The device call carries the tracked tree + .pre, 64 MiB at most: say so before a call is refused.
# Counted as disk usage (4 KiB blocks), which is what the call's check comes closest to: with the
# apparent sizes, a tree of 30.3 MiB + a .pre of 32.7 MiB was refused (2026-12-07).
tree=$(( $(git ls-files -z | du -c --files0-from=- | tail -n 1 | cut -f1) * 1024 ))
pre=$(( $(du -s .pre | cut -f1) * 1024 ))
if [ $((tree + pre)) -gt $((64 * 1048576)) ]; then
  echo "pack_prebuilt: tree $((tree / 1048576)) MiB + .pre $((pre / 1048576)) MiB is over the 64 MiB carry limit: pack fewer binaries" >&2
fi
