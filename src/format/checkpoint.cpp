// Hugging Face checkpoint folders: open + validate, tensor groups by format, and the
// stacking of one MoE layer's experts into MoeLayerWeights.
//
// Tensor layouts recognised per linear layer (prefix "....{gate,up,down}_proj"):
//   ModelOpt NVFP4        weight U8 [N, K/2], weight_scale F8_E4M3 [N, K/16],
//                         weight_scale_2 F32 [] (or [1]), input_scale F32 [] (optional)
//   compressed-tensors    weight_packed U8 [N, K/2], weight_scale F8_E4M3 [N, K/16],
//     nvfp4-pack-quantized  weight_global_scale F32 [1] = 1 / weight_scale_2,
//                         input_global_scale (optional), weight_shape I64 [2] (optional)
//   MXFP4                 weight U8 [N, K/2] + weight_scale U8|F8_E8M0 [N, K/32] (ModelOpt
//                         layout, as `fp4moe quantize --format mxfp4` writes it), or
//                         weight_packed + weight_scale (compressed-tensors mxfp4-pack-quantized);
//                         gpt-oss's stacked `*_blocks` [E, N, K/32, 16] / `*_scales`
//                         [E, N, K/32] are recognised by groups() but not loaded.
//   BF16 / F32            weight [N, K]
#include "format/checkpoint.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "core/bf16.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "core/threads.hpp"
#include "format/codecs.hpp"

namespace fp4moe {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr uintmax_t kMaxJsonFileBytes = 256ull << 20;

// Untrusted text (tensor names from an index, JSON parser messages) made safe for a
// one-line message: control bytes escaped, long strings cut.
std::string clean(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < 200; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    out += c < 0x20 || c == 0x7f ? fmt::format("\\x{:02x}", c) : std::string(1, char(c));
  }
  if (s.size() > 200) out += "...";
  return out;
}

json read_json_file(const std::string& path) {
  const std::string text = read_regular_file(path, kMaxJsonFileBytes);  // refuses FIFOs, devices, folders
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    std::string what = e.what();
    if (auto p = what.find("] "); p != std::string::npos) what = what.substr(p + 2);
    FP4MOE_FAIL("{}: not valid JSON: {}", path, clean(what));
  }
}

bool is_scalar_f32(const TensorInfo& t) {
  return t.dtype == DType::F32 && t.numel() == 1 && t.shape.size() <= 1;
}


float read_f32(std::span<const uint8_t> b) {
  float x;
  std::memcpy(&x, b.data(), 4);
  return x;
}

// Converts a BF16 or F32 tensor to float. Unaligned views are read with memcpy.
std::vector<float> to_float(const TensorInfo& t, std::span<const uint8_t> b) {
  std::vector<float> out(size_t(t.numel()));
  if (t.dtype == DType::F32) {
    std::memcpy(out.data(), b.data(), b.size());
  } else {
    for (size_t i = 0; i < out.size(); ++i) {
      uint16_t h;
      std::memcpy(&h, b.data() + 2 * i, 2);
      out[i] = bf16_to_float(h);
    }
  }
  return out;
}

WeightFormat weight_format_of(TensorGroupFormat f) {
  switch (f) {
    case TensorGroupFormat::ModelOptNVFP4:
    case TensorGroupFormat::CompressedNVFP4: return WeightFormat::NVFP4;
    case TensorGroupFormat::MXFP4: return WeightFormat::MXFP4;
    default: return WeightFormat::BF16;
  }
}

}  // namespace

int64_t TensorGroup::bytes() const {
  int64_t n = 0;
  for (const auto& [k, t] : parts) n += int64_t(t->nbytes());
  return n;
}

Checkpoint::~Checkpoint() = default;

const nlohmann::json& Checkpoint::config_json() const { return *config_json_; }

std::unique_ptr<Checkpoint> Checkpoint::open(const std::string& dir) {
  std::error_code ec;
  FP4MOE_CHECK(fs::is_directory(dir, ec), "{}: not a directory", dir);
  std::unique_ptr<Checkpoint> ck(new Checkpoint());
  ck->dir_ = dir;
  const std::string config_path = (fs::path(dir) / "config.json").string();
  FP4MOE_CHECK(fs::exists(config_path, ec), "{}: no config.json (not a Hugging Face checkpoint folder)", dir);
  ck->config_json_ = std::make_unique<json>(read_json_file(config_path));
  ck->config_ = parse_model_config(*ck->config_json_, config_path);

  const std::string hf_quant_path = (fs::path(dir) / "hf_quant_config.json").string();
  if (fs::exists(hf_quant_path, ec)) {
    ck->quant_ = parse_quant_config(read_json_file(hf_quant_path), hf_quant_path);
  } else if (auto it = ck->config_json_->find("quantization_config");
             it != ck->config_json_->end() && !it->is_null()) {
    ck->quant_ = parse_quant_config(*it, config_path + " quantization_config");
  }

  const std::string index_path = (fs::path(dir) / "model.safetensors.index.json").string();
  const std::string single_path = (fs::path(dir) / "model.safetensors").string();
  if (fs::exists(index_path, ec)) {
    const json index = read_json_file(index_path);
    FP4MOE_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(),
                 "{}: no 'weight_map' object", index_path);
    const json& map = index["weight_map"];
    FP4MOE_CHECK(!map.empty(), "{}: empty weight_map", index_path);
    std::map<std::string, size_t> shard_ids;
    for (auto it = map.begin(); it != map.end(); ++it) {
      FP4MOE_CHECK(it.value().is_string(), "{}: weight_map['{}'] is not a file name", index_path, clean(it.key()));
      const std::string shard = it.value().get<std::string>();
      FP4MOE_CHECK(!shard.empty() && shard.find('/') == std::string::npos && shard != "." && shard != "..",
                   "{}: weight_map['{}'] = '{}' is not a file name in the folder", index_path, clean(it.key()),
                   clean(shard));
      shard_ids.emplace(shard, 0);
    }
    for (auto& [shard, id] : shard_ids) {
      const std::string p = (fs::path(dir) / shard).string();
      FP4MOE_CHECK(fs::exists(p, ec), "{}: shard '{}' is listed but missing", index_path, clean(shard));
      id = ck->files_.size();
      ck->files_.push_back(SafetensorsFile::open(p));
    }
    for (auto it = map.begin(); it != map.end(); ++it) {
      const size_t id = shard_ids.at(it.value().get<std::string>());
      const TensorInfo* t = ck->files_[id]->find(it.key());
      FP4MOE_CHECK(t != nullptr, "{}: tensor '{}' is listed in shard '{}' but not found there", index_path,
                   clean(it.key()), clean(it.value().get<std::string>()));
      ck->by_name_.emplace(it.key(), std::make_pair(id, t));
    }
    for (size_t id = 0; id < ck->files_.size(); ++id)
      for (const TensorInfo& t : ck->files_[id]->tensors()) {
        auto it = ck->by_name_.find(t.name);
        FP4MOE_CHECK(it != ck->by_name_.end(), "{}: tensor '{}' is not listed in {}", ck->files_[id]->path(),
                     clean(t.name), index_path);
        FP4MOE_CHECK(it->second.first == id, "{}: tensor '{}' is also in this shard; the index says {}",
                     ck->files_[id]->path(), clean(t.name), ck->files_[it->second.first]->path());
      }
  } else if (fs::exists(single_path, ec)) {
    ck->files_.push_back(SafetensorsFile::open(single_path));
    for (const TensorInfo& t : ck->files_[0]->tensors()) ck->by_name_.emplace(t.name, std::make_pair(size_t(0), &t));
  } else {
    FP4MOE_FAIL("{}: no model.safetensors or model.safetensors.index.json", dir);
  }
  return ck;
}

const TensorInfo* Checkpoint::find(std::string_view name, const SafetensorsFile** file) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return nullptr;
  if (file) *file = files_[it->second.first].get();
  return it->second.second;
}

// ---- tensor groups -------------------------------------------------------------------

namespace {

constexpr std::array<std::string_view, 10> kPartNames = {
    "weight", "weight_scale", "weight_scale_2", "input_scale", "weight_packed",
    "weight_global_scale", "input_global_scale", "weight_shape", "weight_zero_point", "bias"};

// Classifies a group and records what is malformed. `file_of` maps a part to its shard.
void classify(TensorGroup& g, const std::map<std::string, const SafetensorsFile*>& file_of) {
  auto part = [&](const char* k) -> const TensorInfo* {
    auto it = g.parts.find(k);
    return it == g.parts.end() ? nullptr : it->second;
  };
  auto problem = [&](std::string s) { g.problems.push_back(g.prefix + ": " + std::move(s)); };
  // Checks a packed [.., N, K/2] weight against [.., N, K/block] scales.
  auto check_fp4 = [&](const TensorInfo& w, const TensorInfo& s, int block, bool e4m3) {
    if (w.dtype != DType::U8) problem(fmt::format("packed weight is {}, expected U8", dtype_name(w.dtype)));
    if (e4m3 ? s.dtype != DType::F8_E4M3 : (s.dtype != DType::U8 && s.dtype != DType::F8_E8M0))
      problem(fmt::format("block scales are {}, expected {}", dtype_name(s.dtype), e4m3 ? "F8_E4M3" : "U8/F8_E8M0"));
    if (w.shape.size() != 2 || s.shape.size() != 2 || w.shape[0] != s.shape[0] ||
        w.shape[1] * 2 != s.shape[1] * block)
      problem(fmt::format("packed weight {} and scales {} do not match [N, K/2] / [N, K/{}]", shape_str(w.shape),
                          shape_str(s.shape), block));
  };

  const TensorInfo* w = part("weight");
  const TensorInfo* wp = part("weight_packed");
  const TensorInfo* ws = part("weight_scale");
  const TensorInfo* blocks = part("blocks");
  if (blocks) {
    g.format = TensorGroupFormat::MXFP4;
    const TensorInfo* sc = part("scales");
    if (!sc) {
      problem("_blocks without _scales");
    } else if (blocks->dtype != DType::U8 || sc->dtype != DType::U8 || blocks->shape.size() < 2 ||
               blocks->shape.back() != 16 || sc->shape.size() + 1 != blocks->shape.size() ||
               !std::equal(sc->shape.begin(), sc->shape.end(), blocks->shape.begin())) {
      problem(fmt::format("gpt-oss blocks {} {} / scales {} {} do not match [.., N, K/32, 16] / [.., N, K/32]",
                          dtype_name(blocks->dtype), shape_str(blocks->shape), dtype_name(sc->dtype),
                          shape_str(sc->shape)));
    }
  } else if (wp) {
    const TensorInfo* gs = part("weight_global_scale");
    g.format = gs ? TensorGroupFormat::CompressedNVFP4 : TensorGroupFormat::MXFP4;
    if (!ws) {
      problem("weight_packed without weight_scale");
    } else {
      check_fp4(*wp, *ws, gs ? 16 : 32, gs != nullptr);
    }
    if (gs && !is_scalar_f32(*gs)) problem("weight_global_scale is not a single F32");
  } else if (w && w->dtype == DType::U8) {
    if (!ws) {
      g.format = TensorGroupFormat::Other;
      problem("U8 weight without weight_scale");
    } else if (ws->dtype == DType::F8_E4M3) {
      g.format = TensorGroupFormat::ModelOptNVFP4;
      check_fp4(*w, *ws, 16, true);
      const TensorInfo* s2 = part("weight_scale_2");
      if (!s2) problem("missing weight_scale_2");
      else if (!is_scalar_f32(*s2)) problem("weight_scale_2 is not a single F32");
    } else {
      g.format = TensorGroupFormat::MXFP4;
      check_fp4(*w, *ws, 32, false);
    }
    if (const TensorInfo* is = part("input_scale"); is && !is_scalar_f32(*is))
      problem("input_scale is not a single F32");
  } else if (w && w->dtype == DType::BF16) {
    g.format = TensorGroupFormat::BF16;
  } else if (w && w->dtype == DType::F32) {
    g.format = TensorGroupFormat::F32;
  } else {
    g.format = TensorGroupFormat::Other;
  }
  std::set<const SafetensorsFile*> files;
  for (const auto& [k, t] : g.parts) files.insert(file_of.at(t->name));
  if (files.size() > 1) problem(fmt::format("parts are split over {} shards", files.size()));
}

}  // namespace

std::vector<TensorGroup> Checkpoint::groups() const {
  std::map<std::string, TensorGroup> by_prefix;
  std::map<std::string, const SafetensorsFile*> file_of;
  for (const auto& [name, loc] : by_name_) {
    file_of[name] = files_[loc.first].get();
    const size_t dot = name.rfind('.');
    const std::string_view last = dot == std::string::npos ? std::string_view(name) : std::string_view(name).substr(dot + 1);
    std::string prefix, part;
    if (std::find(kPartNames.begin(), kPartNames.end(), last) != kPartNames.end() && dot != std::string::npos) {
      prefix = name.substr(0, dot);
      part = std::string(last);
    } else {
      for (std::string_view suffix : {"_blocks", "_scales", "_bias"})  // gpt-oss stacked MXFP4 experts
        if (last.size() > suffix.size() && last.substr(last.size() - suffix.size()) == suffix) {
          prefix = name.substr(0, name.size() - suffix.size());
          part = std::string(suffix.substr(1));
          break;
        }
    }
    if (part.empty()) continue;
    TensorGroup& g = by_prefix[prefix];
    g.prefix = prefix;
    g.parts[part] = loc.second;
    if (!g.file || part == "weight" || part == "weight_packed" || part == "blocks") g.file = files_[loc.first].get();
  }
  std::vector<TensorGroup> out;
  for (auto& [prefix, g] : by_prefix) {
    const TensorInfo* main = g.parts.count("weight")          ? g.parts.at("weight")
                             : g.parts.count("weight_packed") ? g.parts.at("weight_packed")
                             : g.parts.count("blocks")        ? g.parts.at("blocks")
                                                              : nullptr;
    if (!main) {
      if (!g.parts.count("bias")) {  // stray scales: malformed
        classify(g, file_of);
        g.problems.push_back(prefix + ": scales without a weight");
        out.push_back(std::move(g));
      }
      continue;
    }
    if (main->shape.size() < 2 && !g.parts.count("blocks")) continue;  // norms, biases: not linear layers
    classify(g, file_of);
    out.push_back(std::move(g));
  }
  return out;
}

// ---- linear layers and the MoE layer ----------------------------------------------------

LinearTensors Checkpoint::find_linear(const std::string& prefix, int64_t n, int64_t k) const {
  const Checkpoint& ck = *this;
  LinearTensors r;
  r.prefix = prefix;
  const SafetensorsFile* f = nullptr;
  auto get = [&](const char* part, const SafetensorsFile** file) { return ck.find(prefix + "." + part, file); };
  auto expect_shape = [&](const TensorInfo* t, std::vector<int64_t> want) {
    FP4MOE_CHECK(t->shape == want, "{}: tensor '{}' has shape {}, expected {}", ck.dir(), t->name,
                 shape_str(t->shape), shape_str(want));
  };
  auto global_of = [&](const char* part, bool reciprocal) {
    const TensorInfo* g = get(part, &f);
    FP4MOE_CHECK(g != nullptr, "{}: missing tensor '{}.{}'", ck.dir(), prefix, part);
    r.names.push_back(g->name);
    FP4MOE_CHECK(is_scalar_f32(*g), "{}: tensor '{}' must be one F32 value, is {} {}", ck.dir(), g->name,
                 dtype_name(g->dtype), shape_str(g->shape));
    const float v = read_f32(f->bytes(*g));
    FP4MOE_CHECK(std::isfinite(v) && v > 0.0f, "{}: tensor '{}' = {} is not a finite positive scale", ck.dir(),
                 g->name, v);
    const float s = reciprocal ? 1.0f / v : v;
    FP4MOE_CHECK(std::isfinite(s) && s > 0.0f, "{}: tensor '{}' = {}: its reciprocal is not finite", ck.dir(),
                 g->name, v);
    return s;
  };

  if (const TensorInfo* wp = get("weight_packed", &r.wfile)) {
    r.weight = wp;
    r.format = ck.find(prefix + ".weight_global_scale") ? TensorGroupFormat::CompressedNVFP4 : TensorGroupFormat::MXFP4;
  } else if (const TensorInfo* w = get("weight", &r.wfile)) {
    r.weight = w;
    if (w->dtype == DType::U8) {
      const TensorInfo* s = ck.find(prefix + ".weight_scale");
      FP4MOE_CHECK(s != nullptr, "{}: U8 weight '{}' has no weight_scale", ck.dir(), w->name);
      r.format = s->dtype == DType::F8_E4M3 ? TensorGroupFormat::ModelOptNVFP4 : TensorGroupFormat::MXFP4;
    } else if (w->dtype == DType::BF16) {
      r.format = TensorGroupFormat::BF16;
    } else if (w->dtype == DType::F32) {
      r.format = TensorGroupFormat::F32;
    } else {
      FP4MOE_FAIL("{}: tensor '{}' has dtype {}; expected U8 (FP4), BF16 or F32", ck.dir(), w->name,
                  dtype_name(w->dtype));
    }
  } else {
    FP4MOE_FAIL("{}: missing tensor '{}.weight'", ck.dir(), prefix);
  }

  r.names.push_back(r.weight->name);
  if (r.format == TensorGroupFormat::BF16 || r.format == TensorGroupFormat::F32) {
    expect_shape(r.weight, {n, k});
    return r;
  }
  const bool nv = r.format != TensorGroupFormat::MXFP4;
  const int block = nv ? 16 : 32;
  FP4MOE_CHECK(k % block == 0, "{}: K = {} of '{}' is not a multiple of the {} block {}", ck.dir(), k, prefix,
               nv ? "NVFP4" : "MXFP4", block);
  FP4MOE_CHECK(r.weight->dtype == DType::U8, "{}: tensor '{}' must be U8, is {}", ck.dir(), r.weight->name,
               dtype_name(r.weight->dtype));
  expect_shape(r.weight, {n, k / 2});
  r.scales = get("weight_scale", &r.sfile);
  FP4MOE_CHECK(r.scales != nullptr, "{}: missing tensor '{}.weight_scale'", ck.dir(), prefix);
  if (nv) {
    FP4MOE_CHECK(r.scales->dtype == DType::F8_E4M3, "{}: tensor '{}' must be F8_E4M3, is {}", ck.dir(),
                 r.scales->name, dtype_name(r.scales->dtype));
  } else {
    FP4MOE_CHECK(r.scales->dtype == DType::U8 || r.scales->dtype == DType::F8_E8M0,
                 "{}: tensor '{}' must be U8 or F8_E8M0 (E8M0 codes), is {}", ck.dir(), r.scales->name,
                 dtype_name(r.scales->dtype));
  }
  expect_shape(r.scales, {n, k / block});
  r.names.push_back(r.scales->name);
  if (r.format == TensorGroupFormat::ModelOptNVFP4) r.global = global_of("weight_scale_2", false);
  if (r.format == TensorGroupFormat::CompressedNVFP4) r.global = global_of("weight_global_scale", true);
  // W4A4 activation scales (optional); compressed-tensors' weight_shape is [n, k] when present.
  if (r.format == TensorGroupFormat::ModelOptNVFP4 && get("input_scale", &f))
    r.input_scale = global_of("input_scale", false);
  if (r.format == TensorGroupFormat::CompressedNVFP4 && get("input_global_scale", &f))
    r.input_scale = global_of("input_global_scale", true);
  if (const TensorInfo* ws = get("weight_shape", &f)) {
    const auto b = f->bytes(*ws);
    int64_t dims[2] = {0, 0};
    if (ws->dtype == DType::I64 && ws->numel() == 2) std::memcpy(dims, b.data(), 16);
    FP4MOE_CHECK(dims[0] == n && dims[1] == k, "{}: tensor '{}' does not say [{}, {}]", ck.dir(), ws->name, n, k);
    r.names.push_back(ws->name);
  }
  return r;
}

namespace {

// Stacks experts; each expert's matrix is its `parts` (gate then up, or down alone) on
// top of each other, every part [n_part, k]. NVFP4 parts with different global scales
// are brought to the largest: block scales of the others are multiplied by
// (g_part / g_max) and re-rounded to E4M3 (nearest even).
ExpertStack stack_experts(const Checkpoint& ck, const std::vector<std::vector<std::string>>& prefixes,
                          int64_t n_part, int64_t k, const std::string& what, int64_t* rescaled_experts) {
  const int64_t E = int64_t(prefixes.size());
  const int64_t parts = int64_t(prefixes[0].size());
  std::vector<std::vector<LinearTensors>> refs(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e)
    for (const std::string& p : prefixes[size_t(e)]) refs[size_t(e)].push_back(ck.find_linear(p, n_part, k));
  const WeightFormat wf = weight_format_of(refs[0][0].format);
  for (int64_t e = 0; e < E; ++e)
    for (const LinearTensors& r : refs[size_t(e)])
      FP4MOE_CHECK(weight_format_of(r.format) == wf, "{}: {}: '{}' is {} but '{}' is {}", ck.dir(), what, r.prefix,
                   tensor_group_format_name(r.format), refs[0][0].prefix, tensor_group_format_name(refs[0][0].format));

  ExpertStack s;
  s.format = wf;
  s.num_experts = E;
  s.n = n_part * parts;
  s.k = k;
  const bool fp4 = s.is_fp4();
  const int64_t block = fp4 ? s.block() : 1;
  const size_t packed_part = size_t(n_part * k / 2), scales_part = size_t(n_part * k / block);
  if (fp4) {
    s.packed.resize(size_t(E * parts) * packed_part);  // [E, n, k/2]
    s.scales.resize(size_t(E * parts) * scales_part);  // [E, n, k/block]
    s.global_scale.assign(size_t(E), 1.0f);            // [E]
  } else {
    s.bf16.resize(size_t(E * s.n * k));  // [E, n, k]
  }
  for (const auto& rs : refs)
    for (const LinearTensors& r : rs) s.input_scale = std::max(s.input_scale, r.input_scale);
  std::atomic<int64_t> rescaled{0}, f32_parts{0};
  parallel_for(E, default_num_threads(), 1, [&](int64_t e0, int64_t e1) {
    for (int64_t e = e0; e < e1; ++e) {
      const auto& rs = refs[size_t(e)];
      float g_max = 0.0f;
      for (const LinearTensors& r : rs) g_max = std::max(g_max, r.global);
      bool any_rescaled = false;
      for (int64_t p = 0; p < parts; ++p) {
        const LinearTensors& r = rs[size_t(p)];
        const size_t slot = size_t(e * parts + p);
        if (!fp4) {
          uint16_t* dst = s.bf16.data() + slot * size_t(n_part * k);
          const auto src = r.wfile->bytes(*r.weight);
          if (r.format == TensorGroupFormat::BF16) {
            std::memcpy(dst, src.data(), src.size());
          } else {
            for (int64_t i = 0; i < n_part * k; ++i) dst[i] = float_to_bf16(read_f32(src.subspan(size_t(4 * i), 4)));
            f32_parts.fetch_add(1);
          }
          continue;
        }
        const auto pw = r.wfile->bytes(*r.weight);
        const auto ps = r.sfile->bytes(*r.scales);
        std::memcpy(s.packed.data() + slot * packed_part, pw.data(), packed_part);
        uint8_t* sc = s.scales.data() + slot * scales_part;
        std::memcpy(sc, ps.data(), scales_part);
        const bool nv = wf == WeightFormat::NVFP4;
        for (size_t i = 0; i < scales_part; ++i) {
          const bool nan = nv ? (sc[i] & 0x7F) == kE4M3NaN : sc[i] == kE8M0NaN;
          FP4MOE_CHECK(!nan, "{}: tensor '{}' has a NaN block scale (code 0x{:02x}) at row {}, block {}", ck.dir(),
                       r.scales->name, sc[i], int64_t(i) / (k / block), int64_t(i) % (k / block));
        }
        if (nv && r.global != g_max) {
          const float ratio = r.global / g_max;  // < 1: rescaled scales never exceed 448
          for (size_t i = 0; i < scales_part; ++i) sc[i] = e4m3_from_float(e4m3_to_float(sc[i]) * ratio);
          any_rescaled = true;
        }
      }
      if (fp4) s.global_scale[size_t(e)] = g_max;
      if (any_rescaled) rescaled.fetch_add(1);
    }
  });
  if (f32_parts.load() > 0) log_warn("{}: {}: {} F32 expert matrices rounded to BF16", ck.dir(), what, f32_parts.load());
  if (rescaled_experts) *rescaled_experts = rescaled.load();
  return s;
}

std::vector<float> load_float_tensor(const Checkpoint& ck, const std::string& name, std::vector<int64_t> shape,
                                     bool required, const char* what) {
  const SafetensorsFile* f = nullptr;
  const TensorInfo* t = ck.find(name, &f);
  if (!t) {
    FP4MOE_CHECK(!required, "{}: missing {} tensor '{}'", ck.dir(), what, name);
    return {};
  }
  FP4MOE_CHECK(t->dtype == DType::BF16 || t->dtype == DType::F32, "{}: {} '{}' must be BF16 or F32, is {}",
               ck.dir(), what, name, dtype_name(t->dtype));
  FP4MOE_CHECK(t->shape == shape, "{}: {} '{}' has shape {}, expected {}", ck.dir(), what, name,
               shape_str(t->shape), shape_str(shape));
  std::vector<float> v = to_float(*t, f->bytes(*t));
  for (size_t i = 0; i < v.size(); ++i)
    FP4MOE_CHECK(std::isfinite(v[i]), "{}: {} '{}' has a non-finite value {} at index {}", ck.dir(), what, name,
                 v[i], i);
  return v;
}

}  // namespace

MoeLayerWeights Checkpoint::load_moe_layer(int64_t layer) const {
  const ModelConfig& c = config_;
  FP4MOE_CHECK(layer >= 0 && layer < c.num_layers, "{}: layer {} is out of range (the model has {} layers)", dir_,
               layer, c.num_layers);
  FP4MOE_CHECK(c.is_moe_layer(layer), "{}: layer {} is a dense layer, not a MoE layer", dir_, layer);
  const MoeConfig& m = c.moe;
  const int64_t E = m.num_experts, H = m.hidden, I = m.inter;
  const std::string mlp = fmt::format("model.layers.{}.mlp.", layer);

  MoeLayerWeights w;
  w.cfg = m;
  w.router_w = load_float_tensor(*this, mlp + "gate.weight", {E, H}, true, "router");
  w.router_bias = load_float_tensor(*this, mlp + "gate.e_score_correction_bias", {E}, false, "correction bias");
  FP4MOE_CHECK(!w.router_bias.empty() || c.topk_method != "noaux_tc",
               "{}: topk_method noaux_tc needs the tensor '{}gate.e_score_correction_bias'", dir_, mlp);

  std::vector<std::vector<std::string>> w13(static_cast<size_t>(E)), w2(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    const std::string p = fmt::format("{}experts.{}.", mlp, e);
    w13[size_t(e)] = {p + "gate_proj", p + "up_proj"};
    w2[size_t(e)] = {p + "down_proj"};
  }
  const std::string where = fmt::format("layer {}", layer);
  int64_t rescaled = 0;
  w.w13 = stack_experts(*this, w13, I, H, where + " experts gate/up", &rescaled);
  w.w2 = stack_experts(*this, w2, H, I, where + " experts down", nullptr);
  if (rescaled > 0)
    log_warn("{}: layer {}: {} of {} experts have different gate/up weight_scale_2; the block scales of the smaller "
             "were rescaled to the larger (rounded to E4M3)",
             dir_, layer, rescaled, E);

  // Shared expert: DeepSeek/GLM "shared_experts", Qwen "shared_expert".
  std::string shared;
  for (const char* name : {"shared_experts", "shared_expert"}) {
    const std::string p = mlp + name + ".gate_proj";
    if (find(p + ".weight") || find(p + ".weight_packed")) shared = mlp + name;
  }
  FP4MOE_CHECK(!find(mlp + "shared_expert_gate.weight"),
               "{}: layer {} has a gated shared expert (shared_expert_gate, Qwen2-MoE style), which is not supported",
               dir_, layer);
  if (m.shared_inter > 0) {
    FP4MOE_CHECK(!shared.empty(), "{}: the config has a shared expert but '{}shared_experts.gate_proj' is missing",
                 dir_, mlp);
    int64_t shared_rescaled = 0;
    w.shared_w13 = stack_experts(*this, {{shared + ".gate_proj", shared + ".up_proj"}}, m.shared_inter, H,
                                 where + " shared expert gate/up", &shared_rescaled);
    w.shared_w2 = stack_experts(*this, {{shared + ".down_proj"}}, H, m.shared_inter, where + " shared expert down",
                                nullptr);
    if (shared_rescaled > 0)
      log_warn("{}: layer {}: shared expert gate/up have different weight_scale_2; rescaled to the larger", dir_,
               layer);
  } else {
    FP4MOE_CHECK(shared.empty(), "{}: '{}' exists but the config has no shared expert", dir_, shared);
  }
  return w;
}

}  // namespace fp4moe
