#!/usr/bin/env bash
# Builds a libFuzzer target (clang, ASan + UBSan) in its own build dir, writes a seed corpus
# and a dictionary, and fuzzes for a bounded time. Exit status is libFuzzer's: 0 when
# nothing was found.
#
#   tools/fuzz.sh [SECONDS] [TARGET]   (default 60 s, safetensors_header; FUZZ_BUILD_DIR
#                                       overrides build-fuzz)
# Targets: safetensors_header (format/ header parser), tokenizer_json (text/: tokenizer.json
# loading and encoding arbitrary bytes), chat_template (text/jinja: parser + interpreter),
# regex_scanner (text/: the hand-written pre-tokenizer scanners must match PCRE2), api_request
# (serve/: the HTTP request body parsers), bench_stream (bench serve: streamed responses and
# JSONL datasets).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
target="${2:-safetensors_header}"
build="${FUZZ_BUILD_DIR:-build-fuzz}"
case "$target" in
  safetensors_header) max_len=4096 ;;
  tokenizer_json) max_len=16384 ;;
  chat_template) max_len=8192 ;;
  regex_scanner) max_len=4096 ;;
  api_request) max_len=8192 ;;
  bench_stream) max_len=8192 ;;
  tool_call_parser) max_len=4096 ;;  # serve/: reasoning + tool-call parsers, streamed = one-shot
  http_request) max_len=16384 ;;
  *) echo "unknown fuzz target '$target' (safetensors_header, tokenizer_json, chat_template, regex_scanner, api_request, bench_stream)" >&2; exit 2 ;;
esac
cxx="$(command -v clang++-14 || command -v clang++)"
cc="$(command -v clang-14 || command -v clang)"

if [[ ! -f "$build/CMakeCache.txt" ]]; then
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" \
    -DFP4MOE_FUZZ=ON -DFP4MOE_CUDA=OFF -DFP4MOE_TESTS=OFF >/dev/null
fi
cmake --build "$build" -j"${FUZZ_JOBS:-2}" --target "${target}_fuzz"

corpus="$build/corpus/$target"
dict="$build/$target.dict"
mkdir -p "$corpus" "$build/artifacts"
if [[ "$target" == tool_call_parser ]]; then
  python3 tests/serve/data/gen_parser_goldens.py --fuzz-seeds "$corpus" "$dict"
elif [[ "$target" == api_request || "$target" == bench_stream || "$target" == http_request ]]; then
  python3 tools/serve/fuzz_seeds.py "$target" "$corpus" "$dict"
elif [[ "$target" != safetensors_header ]]; then
  python3 tools/text/fuzz_seeds.py "$target" "$corpus" "$dict"
else
python3 - "$corpus" "$dict" <<'PY'
import json, struct, sys, os
corpus, dict_path = sys.argv[1], sys.argv[2]
sizes = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "U8": 1, "I8": 1, "I16": 2, "I32": 4, "I64": 8,
         "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "BOOL": 1}
def file_bytes(entries, meta=None, pad=True):
    header, off = {}, 0
    if meta is not None:
        header["__metadata__"] = meta
    for name, dtype, shape in entries:
        n = 1
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + n * sizes[dtype]]}
        off += n * sizes[dtype]
    text = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + bytes(off)
seeds = {
    "empty": file_bytes([]),
    "meta": file_bytes([], {"format": "pt"}),
    "all_dtypes": file_bytes([(f"t.{d}", d, [2, 3]) for d in sizes], {"format": "pt", "k": "v"}),
    "scalar_and_empty": file_bytes([("s", "F32", []), ("z", "BF16", [0, 7]), ("v", "U8", [5])]),
    "nvfp4_layer": file_bytes([("model.layers.3.mlp.experts.0.gate_proj.weight", "U8", [4, 8]),
                               ("model.layers.3.mlp.experts.0.gate_proj.weight_scale", "F8_E4M3", [4, 1]),
                               ("model.layers.3.mlp.experts.0.gate_proj.weight_scale_2", "F32", [])]),
    "unpadded": file_bytes([("a", "I64", [3])], pad=False),
}
for name, b in seeds.items():
    with open(os.path.join(corpus, "seed_" + name), "wb") as f:
        f.write(b)
tokens = ['"dtype"', '"shape"', '"data_offsets"', '"__metadata__"', '{', '}', '[', ']', ':', ',', '"',
          '\\u0000', '\\n', '-1', '1.5', '1e309', '18446744073709551615', '9223372036854775808', 'null',
          'true'] + ['"%s"' % d for d in sizes]
with open(dict_path, "w") as f:
    for t in tokens:
        f.write('"%s"\n' % t.replace("\\", "\\\\").replace('"', '\\"'))
PY
fi

echo "fuzzing $target for ${seconds}s (corpus $corpus)"
set +e
"$build/bin/${target}_fuzz" "$corpus" -dict="$dict" -max_total_time="$seconds" -max_len="$max_len" -timeout=30 \
  -print_final_stats=1 -artifact_prefix="$build/artifacts/" 2>&1 | tee "$build/fuzz_$target.log" | tail -25
rc=${PIPESTATUS[0]}
set -e
echo "fuzz result ($target): exit $rc ($( [[ $rc -eq 0 ]] && echo 'no crash, no sanitizer report, no broken invariant' || echo "FAILURE: see $build/artifacts/"))"
exit "$rc"
