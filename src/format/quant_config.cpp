// The quantization config (hf_quant_config.json, config.json's quantization_config) and the
// one matcher of module names against its ignore / exclude_modules lists, used by every
// command (inspect, quantize, loading).
//
// Patterns: fnmatch-style globs ('*', '?'; iterative, O(|pattern| x |name|)), or "re:<regex>"
// as compressed-tensors writes them (Python's re.match: anchored at the start of the name).
// Regexes run on PCRE2 (Perl syntax, close to Python's) without JIT and with a match limit
// and a depth limit, so that a catastrophic pattern such as "re:(.|.)*X" costs at most
// kMatchLimit backtracking steps per name and ends in a one-line error naming it, never a hang.
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <pcre2.h>

#include "core/error.hpp"
#include "format/checkpoint.hpp"
#include "format/json_reader.hpp"

namespace fp4moe {
namespace {

using json = nlohmann::json;

constexpr size_t kMaxPatternBytes = 4096;
constexpr uint32_t kMatchLimit = 200000;  // backtracking steps per name (~1 ms)
constexpr uint32_t kDepthLimit = 10000;   // nested backtracking frames

bool glob_match(std::string_view p, std::string_view s) {
  // Iterative '*' backtracking: O(|p|·|s|) worst case, no recursion.
  size_t pi = 0, si = 0, star = std::string_view::npos, mark = 0;
  while (si < s.size()) {
    if (pi < p.size() && (p[pi] == '?' || p[pi] == s[si])) {
      ++pi, ++si;
    } else if (pi < p.size() && p[pi] == '*') {
      star = pi++;
      mark = si;
    } else if (star != std::string_view::npos) {
      pi = star + 1;
      si = ++mark;
    } else {
      return false;
    }
  }
  while (pi < p.size() && p[pi] == '*') ++pi;
  return pi == p.size();
}


// A compiled "re:" pattern (without the prefix); a bad pattern throws naming `what`.
class ModuleRegex {
 public:
  ModuleRegex(std::string_view pattern, const std::string& what) {
    int err = 0;
    PCRE2_SIZE off = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), 0, &err, &off, nullptr);
    if (!code_) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      FP4MOE_FAIL("{} is not a valid regex: {} at offset {}", what, reinterpret_cast<const char*>(msg), size_t(off));
    }
  }
  ~ModuleRegex() {
    pcre2_code_free(code_);
  }
  ModuleRegex(const ModuleRegex&) = delete;
  ModuleRegex& operator=(const ModuleRegex&) = delete;

  // Anchored at the start of the name (Python's re.match).
  bool match(std::string_view full_pattern, std::string_view name) const {
    pcre2_match_context* ctx = pcre2_match_context_create(nullptr);
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
    FP4MOE_CHECK(ctx && md, "out of memory matching a module pattern");
    pcre2_set_match_limit(ctx, kMatchLimit);
    pcre2_set_depth_limit(ctx, kDepthLimit);
    const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(name.data()), name.size(), 0, PCRE2_ANCHORED, md, ctx);
    pcre2_match_data_free(md);
    pcre2_match_context_free(ctx);
    if (rc >= 0) return true;
    if (rc == PCRE2_ERROR_NOMATCH) return false;
    FP4MOE_FAIL("the module pattern '{}' is too costly to match against '{}' (over {} backtracking steps, PCRE2 "
                "error {}): rewrite it without nested alternatives",
                full_pattern, name, kMatchLimit, rc);
  }

 private:
  pcre2_code* code_ = nullptr;
};

}  // namespace

bool module_glob_match(std::string_view pattern, std::string_view name) {
  if (pattern.substr(0, 3) == "re:") return ModuleRegex(pattern.substr(3), "the pattern").match(pattern, name);
  return glob_match(pattern, name);
}

bool QuantConfig::is_ignored(std::string_view module) const {
  for (const std::string& p : ignore) {
    if (module_glob_match(p, module)) return true;
    // A plain module name also covers its children ("model.layers.0.mlp" -> "...mlp.gate_proj").
    if (p.find_first_of("*?") == std::string::npos && p.substr(0, 3) != "re:" && module.size() > p.size() &&
        module.substr(0, p.size()) == p && module[p.size()] == '.')
      return true;
  }
  return false;
}

QuantConfig parse_quant_config(const json& root, const std::string& path) {
  FP4MOE_CHECK(root.is_object(), "{}: quantization config is not a JSON object", path);
  QuantConfig q;
  q.source = path;
  // hf_quant_config.json nests ModelOpt's fields under "quantization".
  const json& j = root.contains("quantization") && root["quantization"].is_object() ? root["quantization"] : root;
  const Reader r{j, path};
  auto read_globs = [&](const char* key) {
    const json* v = r.field(key);
    if (!v) return;
    FP4MOE_CHECK(v->is_array(), "{}: '{}' must be a list of module names or globs", path, key);
    for (const json& g : *v) {
      FP4MOE_CHECK(g.is_string(), "{}: '{}' entry {} is not a string", path, key, g.dump());
      std::string s = g.get<std::string>();
      FP4MOE_CHECK(s.size() <= kMaxPatternBytes, "{}: '{}' entry of {} bytes is over the {} byte limit", path, key,
                   s.size(), kMaxPatternBytes);
      if (s.substr(0, 3) == "re:") ModuleRegex(std::string_view(s).substr(3), fmt::format("{}: '{}' entry '{}'", path, key, s));
      q.ignore.push_back(std::move(s));
    }
  };

  std::string method = r.string("quant_method");
  const std::string algo = r.string("quant_algo");
  if (method.empty() && !algo.empty()) method = "modelopt";  // hf_quant_config.json has no quant_method
  if (method == "modelopt") {
    q.quant_method = "modelopt";
    q.quant_algo = algo;
    FP4MOE_CHECK(algo == "NVFP4" || algo == "W4A16_NVFP4" || algo == "MXFP4" || algo == "W4A16_MXFP4",
                 "{}: ModelOpt quant_algo '{}' is not supported (NVFP4, W4A16_NVFP4, MXFP4)", path, algo);
    const bool mx = algo.find("MXFP4") != std::string::npos;
    q.group_size = int(r.integer("group_size", mx ? 32 : 16, 1));
    q.activation_quant = algo == "NVFP4" || algo == "MXFP4";
    read_globs("exclude_modules");
    read_globs("ignore");
    if (const json* kv = r.field("kv_cache_quant_algo"); kv && !kv->is_null()) {
      FP4MOE_CHECK(kv->is_string(), "{}: 'kv_cache_quant_algo' must be a string or null", path);
      q.kv_cache_quant_algo = kv->get<std::string>();
    }
  } else if (method == "compressed-tensors") {
    q.quant_method = method;
    q.format = r.string("format");
    const json* groups = r.field("config_groups");
    FP4MOE_CHECK(groups && groups->is_object() && !groups->empty(),
                 "{}: compressed-tensors config has no 'config_groups'", path);
    for (auto it = groups->begin(); it != groups->end(); ++it) {
      FP4MOE_CHECK(it.value().is_object(), "{}: config_groups.{} is not an object", path, it.key());
      const Reader g{it.value(), path};
      const std::string fmt = g.string("format", q.format);
      FP4MOE_CHECK(fmt == "nvfp4-pack-quantized" || fmt == "mxfp4-pack-quantized",
                   "{}: compressed-tensors format '{}' is not supported (nvfp4-pack-quantized, mxfp4-pack-quantized)",
                   path, fmt);
      FP4MOE_CHECK(q.format.empty() || q.format == fmt || q.format == "mixed-precision",
                   "{}: config groups mix formats '{}' and '{}'", path, q.format, fmt);
      q.format = fmt;
      if (const json* w = g.field("weights"); w && w->is_object())
        q.group_size = int(Reader{*w, path}.integer("group_size", 0));
      if (const json* a = g.field("input_activations"); a && a->is_object()) q.activation_quant = true;
    }
    const bool mx = q.format == "mxfp4-pack-quantized";
    if (q.group_size == 0) q.group_size = mx ? 32 : 16;
    q.quant_algo = mx ? (q.activation_quant ? "MXFP4" : "W4A16_MXFP4") : (q.activation_quant ? "NVFP4" : "W4A16_NVFP4");
    read_globs("ignore");
    if (const json* kv = r.field("kv_cache_scheme"); kv && !kv->is_null()) {
      FP4MOE_CHECK(kv->is_object(), "{}: 'kv_cache_scheme' must be an object or null", path);
      const Reader k{*kv, path};
      const std::string type = k.string("type", "float");
      const int64_t bits = k.integer("num_bits", 8, 1);
      q.kv_cache_quant_algo = type == "float" && bits == 8 ? std::string("FP8") : fmt::format("{}{}", type, bits);
    }
  } else if (method == "mxfp4") {
    q.quant_method = method;
    q.quant_algo = "MXFP4";
    q.group_size = 32;
    read_globs("modules_to_not_convert");
    read_globs("ignore");
  } else {
    FP4MOE_FAIL("{}: quant_method '{}' is not supported (modelopt, compressed-tensors, mxfp4)", path, method);
  }
  const int want = q.quant_algo.find("MXFP4") != std::string::npos ? 32 : 16;
  FP4MOE_CHECK(q.group_size == want, "{}: group_size {} does not match {} (needs {})", path, q.group_size,
               q.quant_algo, want);
  return q;
}

}  // namespace fp4moe
