#!/usr/bin/env bash
# Builds a libFuzzer target (clang, ASan + UBSan) in its own build dir, writes a seed corpus
# and a JSON dictionary, and fuzzes for a bounded time. Exit status is libFuzzer's: 0 when
# nothing was found.
#
#   tools/fuzz.sh [SECONDS] [TARGET]   (default 60 s; TARGET safetensors_header (default) or
#                                       api_request; FUZZ_BUILD_DIR overrides build-fuzz)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
target="${2:-safetensors_header}"
build="${FUZZ_BUILD_DIR:-build-fuzz}"
cxx="$(command -v clang++-14 || command -v clang++)"
cc="$(command -v clang-14 || command -v clang)"

if [[ ! -f "$build/CMakeCache.txt" ]]; then
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" \
    -DFP4MOE_FUZZ=ON -DFP4MOE_CUDA=OFF -DFP4MOE_TESTS=OFF >/dev/null
fi
cmake --build "$build" -j"${FUZZ_JOBS:-2}" --target "${target}_fuzz"

case "$target" in
  safetensors_header) what="parse_safetensors_header"; max_len=4096 ;;
  api_request) what="the server's request parsers"; max_len=8192 ;;
  *) echo "unknown fuzz target '$target' (safetensors_header, api_request)"; exit 2 ;;
esac
corpus="$build/corpus/$target"
mkdir -p "$corpus" "$build/artifacts"
python3 - "$corpus" "$build/$target.dict" "$target" <<'PY'
import json, os, struct, sys
corpus, dict_path, target = sys.argv[1], sys.argv[2], sys.argv[3]
if target == "safetensors_header":
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
else:  # api_request: the first byte picks the parser (0 chat, 1 completions, 2 generate, 3 tokenize, 4 detokenize)
    seeds = {
        0: {"model": "m", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": [
            {"type": "text", "text": "hi"}]}], "max_tokens": 5, "temperature": 0.5, "top_p": 0.9, "top_k": 4,
            "logprobs": True, "top_logprobs": 2, "stream": True, "stream_options": {"include_usage": True}, "n": 2,
            "stop": ["a", "b"], "seed": 3, "max_completion_tokens": 4},
        1: {"prompt": ["a", "b"], "n": 2, "stop": "x", "logprobs": 3, "min_p": 0.1, "presence_penalty": 1,
            "frequency_penalty": -1, "repetition_penalty": 1.2, "ignore_eos": True, "stop_token_ids": [1, 2]},
        2: {"text": "a", "sampling_params": {"max_new_tokens": 3, "top_k": 5, "stop_token_ids": [1], "sampling_seed": 9},
            "return_logprob": True, "top_logprobs_num": 2, "stream": False},
        3: {"prompt": "abc", "messages": [{"role": "user", "content": "x"}]},
        4: {"tokens": [1, 2, 3]},
    }
    for kind, body in seeds.items():
        with open(os.path.join(corpus, f"seed_{kind}"), "wb") as f:
            f.write(bytes([kind]) + json.dumps(body).encode())
        with open(os.path.join(corpus, f"seed_ids_{kind}"), "wb") as f:
            f.write(bytes([kind]) + b'{"prompt": [[1, 2], [3]], "input_ids": [[4]], "text": ["x", "y"]}')
    keys = ["model", "messages", "role", "content", "type", "text", "prompt", "input_ids", "sampling_params",
            "max_tokens", "max_new_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "min_p",
            "presence_penalty", "frequency_penalty", "repetition_penalty", "seed", "sampling_seed", "stop",
            "stop_token_ids", "n", "logprobs", "top_logprobs", "top_logprobs_num", "return_logprob", "stream",
            "stream_options", "include_usage", "ignore_eos", "skip_special_tokens", "echo", "logit_bias", "tokens",
            "add_generation_prompt", "user", "assistant", "system", "tool"]
    tokens = ['"%s"' % k for k in keys] + ['{', '}', '[', ']', ':', ',', 'null', 'true', 'false', '-1', '0', '1e309',
                                          '2.5', '18446744073709551616', '9223372036854775807', '\\u0000', '\\ud800']
with open(dict_path, "w") as f:
    for t in tokens:
        f.write('"%s"\n' % t.replace("\\", "\\\\").replace('"', '\\"'))
PY

echo "fuzzing $what for ${seconds}s (corpus $corpus)"
set +e
"$build/bin/${target}_fuzz" "$corpus" -dict="$build/$target.dict" -max_total_time="$seconds" \
  -max_len="$max_len" -print_final_stats=1 -artifact_prefix="$build/artifacts/" 2>&1 | tee "$build/fuzz.log" | tail -25
rc=${PIPESTATUS[0]}
set -e
echo "fuzz result: exit $rc ($( [[ $rc -eq 0 ]] && echo 'no crash, no sanitizer report, no broken invariant' || echo "FAILURE: see $build/artifacts/"))"
exit "$rc"
