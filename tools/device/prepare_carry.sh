#!/usr/bin/env bash
# Packs the header-only dependencies and GoogleTest's static libraries (from this machine's
# Debian packages, see setup.sh) into .carry/ so the GPU machine, which reaches no registry,
# can build fp4moe with its own cmake and g++. Name ".carry" in the device call's carry list.
# FlashInfer's headers (third_party/flashinfer, unpacked by setup.sh: ~60 MB with its CUTLASS and
# CCCL) travel as one gzip tarball (~6 MB) that tools/device/build.sh unpacks.
set -euo pipefail
cd "$(dirname "$0")/../.."
rm -rf .carry && mkdir -p .carry/include .carry/lib
for d in nlohmann CLI fmt gtest gmock; do cp -r /usr/include/$d .carry/include/; done
# cpp-httplib is Debian's split build: its header, its library and what the library needs
# (OpenSSL headers for the header's CPPHTTPLIB_OPENSSL_SUPPORT layout; brotli, libssl3 at run time).
cp /usr/include/httplib.h .carry/include/
cp -r /usr/include/openssl .carry/include/
cp -r /usr/include/x86_64-linux-gnu/openssl/* .carry/include/openssl/
cp -P /usr/lib/x86_64-linux-gnu/libcpp-httplib.so* .carry/lib/
for l in libbrotlienc.so.1 libbrotlidec.so.1 libbrotlicommon.so.1 libssl.so.3 libcrypto.so.3; do
  cp -L /lib/x86_64-linux-gnu/$l .carry/lib/
done
cp /usr/lib/x86_64-linux-gnu/libgtest.a /usr/lib/x86_64-linux-gnu/libgtest_main.a .carry/lib/
# text/'s two compiled libraries, static (the GPU machine has neither): PCRE2 and utf8proc.
cp /usr/include/pcre2.h /usr/include/utf8proc.h .carry/include/
cp /usr/lib/x86_64-linux-gnu/libpcre2-8.a /usr/lib/x86_64-linux-gnu/libutf8proc.a .carry/lib/
[ -f third_party/flashinfer/VERSION ] && [ -f third_party/xgrammar/FP4MOE_VERSION ] || ./setup.sh --deps
tar czf .carry/flashinfer.tgz -C third_party flashinfer
# xgrammar's patched source (src/grammar builds it), without its tests, docs and web front end.
tar czf .carry/xgrammar.tgz -C third_party --exclude=xgrammar/tests --exclude=xgrammar/docs --exclude=xgrammar/web \
  --exclude=xgrammar/site --exclude=xgrammar/3rdparty/googletest --exclude=xgrammar/3rdparty/cpptrace xgrammar
# The pre-issue-11 tree, for the optional host-time comparison (tools/device/extra/host_time_baseline.sh).
if git rev-parse -q --verify c88aec0^{commit} >/dev/null; then
  git archive --format=tar.gz -o .carry/baseline_c88aec0.tar.gz c88aec0
fi
# The `openai` client and its dependencies as wheels for the GPU machine's python (any of 3.10 ..
# 3.13), for the server's end-to-end tests there (tools/device/steps/60_serve.sh); cached here.
WHEELS=${FP4MOE_WHEEL_CACHE:-$HOME/.cache/fp4moe-wheels}
if [ ! -f "$WHEELS/.done" ]; then
  mkdir -p "$WHEELS"
  for v in 3.10 3.11 3.12 3.13; do
    python3 -m pip download -q "openai==2.8.1" --python-version $v --only-binary=:all: --platform manylinux2014_x86_64 \
      --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 -d "$WHEELS"
  done
  touch "$WHEELS/.done"
fi
mkdir -p .carry/wheels && cp "$WHEELS"/*.whl .carry/wheels/
du -sh .carry
