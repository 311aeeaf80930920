// fp4moe quantize IN_DIR OUT_DIR [--format nvfp4|mxfp4] [--exclude GLOB ...] [--only GLOB ...]
//                 [--input-amax A]
//
// Turns a BF16/F16/F32 Hugging Face checkpoint into a weight-only ModelOpt-layout NVFP4
// (or MXFP4) checkpoint:
//   <module>.weight          U8       [N, K/2]     E2M1 pairs, element 0 in the low nibble
//   <module>.weight_scale    F8_E4M3  [N, K/16]    (MXFP4: U8 E8M0 [N, K/32])
//   <module>.weight_scale_2  F32      []           NVFP4 only: amax / (6 * 448)
// for every 2-D `*.weight` of a linear layer; embeddings, lm_head, norms, router gates and
// the --exclude globs are copied unchanged, as is every other tensor. Linear layers that
// read the same input and are fused by inference engines (gate_proj/up_proj of an MLP or a
// MoE expert, w1/w3, q/k/v, MLA's q_a_proj/kv_a_proj_with_mqa) share one weight_scale_2,
// taken from the larger amax, as ModelOpt's export does.
//
// It streams: output shards mirror the input shards and are written one tensor at a time;
// a tensor's FP32 copy is the largest buffer held. Configs: hf_quant_config.json and
// config.json's quantization_config (quant_algo W4A16_NVFP4 / W4A16_MXFP4, no activation
// scales); other files of IN_DIR (tokenizer, generation config, ...) are copied.
//
// --only GLOB restricts quantization to the matching modules (e.g. '*.mlp.experts.*', the
// routed experts, as NVIDIA's NVFP4 checkpoints of GLM-5 / DeepSeek-V3 do). --input-amax A
// (NVFP4 only) also writes `<module>.input_scale` F32 [] = A / (6 * 448) for every quantized
// linear and declares W4A4 (quant_algo NVFP4), the layout of NVIDIA's checkpoints; the value
// is nominal, not calibrated (this tool runs no forward pass).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "cli/command.hpp"
#include "cli/modelopt_config.hpp"
#include "core/bf16.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "core/threads.hpp"
#include "format/checkpoint.hpp"
#include "format/fp4.hpp"
#include "format/safetensors.hpp"

namespace fp4moe::cli {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct QuantizeOptions {
  std::string in_dir, out_dir;
  std::string format = "nvfp4";
  std::vector<std::string> exclude;
  std::vector<std::string> only;  // if not empty: quantize only modules matching one of these
  float input_amax = 0.0f;        // > 0: write input_scale = input_amax / (6 * 448), declare W4A4
  int threads = 0;
};

// ---- small helpers ---------------------------------------------------------------------

json read_json(const fs::path& p) {
  // A FIFO or device named config.json is refused before it can block (format/'s one reader).
  const std::string text = read_regular_file(p.string(), uint64_t(64) << 20);
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    FP4MOE_FAIL("{}: not valid JSON: {}", p.string(), e.what());
  }
}

void write_json(const fs::path& p, const json& j) {
  std::ofstream f(p);
  FP4MOE_CHECK(f.good(), "{}: cannot create", p.string());
  f << j.dump(2) << "\n";
  FP4MOE_CHECK(f.good(), "{}: write failed", p.string());
}

float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  const int exp = (h >> 10) & 0x1F;
  const uint32_t man = h & 0x3FF;
  float mag;
  if (exp == 0) {
    mag = std::ldexp(float(man), -24);  // subnormal (exact)
  } else if (exp == 31) {
    mag = man ? NAN : INFINITY;
  } else {
    mag = std::ldexp(float(man | 0x400), exp - 25);
  }
  uint32_t u;
  std::memcpy(&u, &mag, 4);
  u |= sign;
  std::memcpy(&mag, &u, 4);
  return mag;
}

// Widens a BF16/F16/F32 tensor [rows, cols] to FP32 (exact), in parallel.
std::vector<float> to_float(const TensorInfo& t, std::span<const uint8_t> bytes, int threads) {
  const int64_t n = t.numel();
  std::vector<float> out(static_cast<size_t>(n));
  const uint8_t* src = bytes.data();
  parallel_for(n, threads, 1 << 16, [&](int64_t b, int64_t e) {
    switch (t.dtype) {
      case DType::BF16:
        for (int64_t i = b; i < e; ++i) {
          uint16_t h;
          std::memcpy(&h, src + 2 * i, 2);
          out[size_t(i)] = bf16_to_float(h);
        }
        break;
      case DType::F16:
        for (int64_t i = b; i < e; ++i) {
          uint16_t h;
          std::memcpy(&h, src + 2 * i, 2);
          out[size_t(i)] = half_to_float(h);
        }
        break;
      default:
        std::memcpy(out.data() + b, src + 4 * b, size_t(e - b) * 4);
    }
  });
  return out;
}

// Drops the pages of a read-only mmap'd input view from this process once a tensor is
// done (they are re-read from the file if touched again), so that the resident set stays
// near one tensor rather than growing to the whole checkpoint.
void release_pages(std::span<const uint8_t> v) {
  static const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));
  const uintptr_t b = (reinterpret_cast<uintptr_t>(v.data()) + page - 1) & ~(page - 1);
  const uintptr_t e = (reinterpret_cast<uintptr_t>(v.data()) + v.size()) & ~(page - 1);
  if (e > b) ::madvise(reinterpret_cast<void*>(b), e - b, MADV_DONTNEED);  // advisory: errors ignored
}

// max |x| (FP32, as ModelOpt's reduce_amax); NaN/inf are reported by the quantizer.
float abs_max(const std::vector<float>& w, int threads) {
  float amax = 0.0f;
  std::mutex mu;
  parallel_for(int64_t(w.size()), threads, 1 << 16, [&](int64_t b, int64_t e) {
    float m = 0.0f;
    for (int64_t i = b; i < e; ++i) m = std::max(m, std::fabs(w[size_t(i)]));
    std::lock_guard<std::mutex> lock(mu);
    amax = std::max(amax, m);
  });
  return amax;
}

// The group of linears fused by engines (one weight_scale_2), or "" if none.
// `module` is the name without ".weight"; the key is parent + family.
std::string fusion_key(const std::string& module) {
  const size_t dot = module.rfind('.');
  if (dot == std::string::npos) return "";
  const std::string parent = module.substr(0, dot), leaf = module.substr(dot + 1);
  static const std::map<std::string, std::string> kFamily = {
      {"gate_proj", "gate_up"}, {"up_proj", "gate_up"},  // MLP, shared expert, routed experts
      {"w1", "w13"},           {"w3", "w13"},           // Mixtral-style experts
      {"q_proj", "qkv"},       {"k_proj", "qkv"},       {"v_proj", "qkv"},
      {"q_a_proj", "mla_a"},   {"kv_a_proj_with_mqa", "mla_a"}};
  auto it = kFamily.find(leaf);
  return it == kFamily.end() ? "" : parent + "|" + it->second;
}

// Why a tensor is not quantized ("" = quantize it). `only`: when not empty, a module must
// match one of its globs.
std::string skip_reason(const TensorInfo& t, const QuantConfig& excludes, const QuantConfig& only, int block) {
  const std::string& name = t.name;
  if (name.size() <= 7 || name.compare(name.size() - 7, 7, ".weight") != 0) return "not a weight";
  if (t.shape.size() != 2) return "not 2-D";
  const std::string module = name.substr(0, name.size() - 7);
  const std::string leaf = module.substr(module.rfind('.') == std::string::npos ? 0 : module.rfind('.') + 1);
  if (module.find("embed") != std::string::npos || leaf == "wte" || leaf == "wpe") return "embedding";
  if (leaf == "lm_head" || module == "lm_head") return "lm_head";
  if (leaf.find("norm") != std::string::npos) return "norm";
  if (leaf == "gate" || leaf == "router" || leaf == "shared_expert_gate") return "router gate";
  if (excludes.is_ignored(module) || excludes.is_ignored(name)) return "excluded";
  if (!only.ignore.empty() && !only.is_ignored(module)) return "not matched by --only";
  if (t.dtype != DType::BF16 && t.dtype != DType::F16 && t.dtype != DType::F32)
    return fmt::format("dtype {}", dtype_name(t.dtype));
  if (t.shape[1] % block != 0) return fmt::format("K = {} is not a multiple of {}", t.shape[1], block);
  return "";
}

struct InputCheckpoint {
  json config;
  bool sharded = false;
  std::vector<std::string> shard_names;                      // in index order
  std::vector<std::unique_ptr<SafetensorsFile>> shards;
};

InputCheckpoint open_input(const fs::path& dir) {
  std::error_code ec;
  FP4MOE_CHECK(fs::is_directory(dir, ec), "{}: not a directory", dir.string());
  InputCheckpoint in;
  FP4MOE_CHECK(fs::exists(dir / "config.json", ec), "{}: no config.json (not a Hugging Face checkpoint folder)",
               dir.string());
  in.config = read_json(dir / "config.json");
  FP4MOE_CHECK(in.config.is_object(), "{}: config is not a JSON object", (dir / "config.json").string());
  FP4MOE_CHECK(!in.config.contains("quantization_config") && !fs::exists(dir / "hf_quant_config.json", ec),
               "{}: the checkpoint is already quantized (it has a quantization config)", dir.string());
  const fs::path index = dir / "model.safetensors.index.json";
  if (fs::exists(index, ec)) {
    in.sharded = true;
    const json j = read_json(index);
    FP4MOE_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(),
                 "{}: no 'weight_map' object", index.string());
    std::set<std::string> seen;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      FP4MOE_CHECK(it.value().is_string(), "{}: weight_map['{}'] is not a file name", index.string(), it.key());
      const std::string s = it.value().get<std::string>();
      FP4MOE_CHECK(!s.empty() && s.find('/') == std::string::npos && s != "." && s != "..",
                   "{}: weight_map['{}'] = '{}' is not a file name in the folder", index.string(), it.key(), s);
      if (seen.insert(s).second) in.shard_names.push_back(s);
    }
    std::sort(in.shard_names.begin(), in.shard_names.end());
    FP4MOE_CHECK(!in.shard_names.empty(), "{}: empty weight_map", index.string());
  } else {
    FP4MOE_CHECK(fs::exists(dir / "model.safetensors", ec), "{}: no model.safetensors or model.safetensors.index.json",
                 dir.string());
    in.shard_names.push_back("model.safetensors");
  }
  for (const std::string& s : in.shard_names) in.shards.push_back(SafetensorsFile::open((dir / s).string()));
  return in;
}

// hf_quant_config.json as ModelOpt writes it, and its config.json quantization_config
// (convert_hf_quant_config_format: config group, "ignore", quant_method).
void write_quant_configs(const fs::path& out, json config, const ModelOptQuant& q) {
  write_json(out / "hf_quant_config.json", modelopt_hf_quant_config(q));
  config["quantization_config"] = modelopt_quantization_config(q);
  write_json(out / "config.json", config);
}

// ---- the command -----------------------------------------------------------------------

int run_quantize(const QuantizeOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  const Fp4Format format = o.format == "mxfp4" ? Fp4Format::MXFP4 : Fp4Format::NVFP4;
  const int block = fp4_block_size(format);
  const int threads = o.threads > 0 ? o.threads : default_num_threads();
  const fs::path in_dir(o.in_dir), out_dir(o.out_dir);
  std::error_code ec;

  InputCheckpoint in = open_input(in_dir);
  FP4MOE_CHECK(!(fs::exists(out_dir, ec) && fs::equivalent(in_dir, out_dir, ec)),
               "{}: OUT_DIR is the input folder", out_dir.string());
  if (fs::exists(out_dir, ec)) {
    FP4MOE_CHECK(fs::is_directory(out_dir, ec), "{}: exists and is not a directory", out_dir.string());
    FP4MOE_CHECK(fs::is_empty(out_dir, ec), "{}: exists and is not empty", out_dir.string());
  } else {
    fs::create_directories(out_dir, ec);
    FP4MOE_CHECK(!ec, "{}: cannot create: {}", out_dir.string(), ec.message());
  }

  QuantConfig excludes, only;
  excludes.ignore = o.exclude;
  only.ignore = o.only;
  const bool act_quant = o.input_amax > 0.0f;
  FP4MOE_CHECK(!act_quant || format == Fp4Format::NVFP4, "--input-amax applies to --format nvfp4 only");
  FP4MOE_CHECK(o.input_amax >= 0.0f && std::isfinite(o.input_amax), "--input-amax {} is not a finite positive number",
               o.input_amax);

  // Plan: which tensors to quantize, and the fused groups that share a global scale.
  struct Planned {
    const SafetensorsFile* file;
    const TensorInfo* t;
  };
  std::map<std::string, std::vector<Planned>> fused;  // fusion key -> members to quantize
  std::set<std::string> exclude_modules(o.exclude.begin(), o.exclude.end());
  std::map<std::string, int> skipped_by_reason;
  int64_t n_quant = 0;
  for (const auto& f : in.shards)
    for (const TensorInfo& t : f->tensors()) {
      const std::string why = skip_reason(t, excludes, only, block);
      const bool is_linear_weight = t.shape.size() == 2 && t.name.size() > 7 &&
                                    t.name.compare(t.name.size() - 7, 7, ".weight") == 0;
      if (!why.empty()) {
        if (is_linear_weight) {
          exclude_modules.insert(t.name.substr(0, t.name.size() - 7));
          ++skipped_by_reason[why];
          log_debug("quantize: keeping {} ({})", t.name, why);
        }
        continue;
      }
      ++n_quant;
      if (format == Fp4Format::NVFP4) {
        const std::string key = fusion_key(t.name.substr(0, t.name.size() - 7));
        if (!key.empty()) fused[key].push_back({f.get(), &t});
      }
    }
  FP4MOE_CHECK(n_quant > 0, "{}: no 2-D BF16/F16/F32 linear weight to quantize{}", in_dir.string(),
               o.only.empty() ? "" : " (matched by --only)");

  // Shared global scales: one pass over the fused groups' weights for their amax.
  std::map<std::string, float> shared_gs;  // tensor name -> weight_scale_2
  for (const auto& [key, members] : fused) {
    if (members.size() < 2) continue;
    float amax = 0.0f;
    for (const Planned& p : members) {
      const std::vector<float> w = to_float(*p.t, p.file->bytes(*p.t), threads);
      amax = std::max(amax, abs_max(w, threads));
      release_pages(p.file->bytes(*p.t));
    }
    for (const Planned& p : members) shared_gs[p.t->name] = nvfp4_global_scale_from_amax(amax);
  }

  json weight_map = json::object();
  uint64_t total_out = 0, total_in = 0;
  int64_t n_copied = 0;
  for (size_t si = 0; si < in.shards.size(); ++si) {
    const SafetensorsFile& f = *in.shards[si];
    const std::string shard = in.shard_names[si];
    SafetensorsWriter w((out_dir / shard).string());
    for (const auto& [k, v] : f.metadata()) w.set_metadata(k, v);
    auto add = [&](const std::string& name, DType dt, std::vector<int64_t> shape, std::span<const uint8_t> data) {
      w.add(name, dt, std::move(shape), data);
      weight_map[name] = shard;
      total_out += data.size();
    };
    for (const TensorInfo& t : f.tensors()) {
      total_in += t.nbytes();
      if (!skip_reason(t, excludes, only, block).empty()) {
        add(t.name, t.dtype, t.shape, f.bytes(t));
        release_pages(f.bytes(t));
        ++n_copied;
        continue;
      }
      const std::string module = t.name.substr(0, t.name.size() - 7);
      const int64_t rows = t.shape[0], cols = t.shape[1];
      const std::vector<float> x = to_float(t, f.bytes(t), threads);
      release_pages(f.bytes(t));
      std::optional<float> gs;
      if (format == Fp4Format::NVFP4) {
        auto it = shared_gs.find(t.name);
        gs = it != shared_gs.end() ? it->second : nvfp4_global_scale_from_amax(abs_max(x, threads));
      }
      // Blocks are independent once the global scale is fixed: quantize row chunks in
      // parallel; the bytes equal one whole-tensor call with the same global scale.
      std::vector<uint8_t> packed(size_t(rows * cols / 2)), scales(size_t(rows * cols / block));
      try {
        parallel_for(rows, threads, std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(cols, 1)),
                     [&](int64_t r0, int64_t r1) {
                       const float* src = x.data() + r0 * cols;
                       const Fp4Matrix q = format == Fp4Format::NVFP4 ? quantize_nvfp4(src, r1 - r0, cols, gs)
                                                                      : quantize_mxfp4(src, r1 - r0, cols);
                       std::memcpy(packed.data() + r0 * cols / 2, q.packed.data(), q.packed.size());
                       std::memcpy(scales.data() + r0 * (cols / block), q.scales.data(), q.scales.size());
                     });
      } catch (const Error& e) {
        FP4MOE_FAIL("{}: tensor '{}': {}", f.path(), t.name, e.what());
      }
      add(t.name, DType::U8, {rows, cols / 2}, packed);
      add(module + ".weight_scale", format == Fp4Format::NVFP4 ? DType::F8_E4M3 : DType::U8, {rows, cols / block},
          scales);
      if (format == Fp4Format::NVFP4) {
        const float g = *gs;
        add(module + ".weight_scale_2", DType::F32, {},
            std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(&g), 4));
        if (act_quant) {
          const float is = nvfp4_global_scale_from_amax(o.input_amax);
          add(module + ".input_scale", DType::F32, {},
              std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(&is), 4));
        }
      }
    }
    w.finish();
    log_info("quantize: wrote {}", (out_dir / shard).string());
  }

  // Configs, index, and the folder's other files.
  const std::string algo = format == Fp4Format::NVFP4 ? (act_quant ? "NVFP4" : "W4A16_NVFP4") : "W4A16_MXFP4";
  write_quant_configs(out_dir, in.config,
                      {algo, block, act_quant, std::vector<std::string>(exclude_modules.begin(), exclude_modules.end()),
                       {{"name", "fp4moe"}, {"version", FP4MOE_VERSION}}});
  if (in.sharded)
    write_json(out_dir / "model.safetensors.index.json",
               {{"metadata", {{"total_size", total_out}}}, {"weight_map", weight_map}});
  const std::set<std::string> generated = {"config.json", "hf_quant_config.json", "model.safetensors.index.json"};
  const std::set<std::string> shard_set(in.shard_names.begin(), in.shard_names.end());
  for (const auto& e : fs::directory_iterator(in_dir)) {
    const std::string name = e.path().filename().string();
    if (!e.is_regular_file() || generated.count(name) || shard_set.count(name) || e.path().extension() == ".safetensors")
      continue;
    fs::copy_file(e.path(), out_dir / name, fs::copy_options::overwrite_existing, ec);
    FP4MOE_CHECK(!ec, "{}: cannot copy to {}: {}", e.path().string(), out_dir.string(), ec.message());
  }

  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::string kept;
  for (const auto& [why, n] : skipped_by_reason) kept += fmt::format("{}{} {}", kept.empty() ? "" : ", ", n, why);
  std::printf("quantized %lld linear weights to %s (%zu groups share a global scale), copied %lld tensors "
              "unchanged%s%s%s; %.1f MB -> %.1f MB in %.1f s\n",
              (long long)n_quant, std::string(fp4_format_name(format)).c_str(),
              size_t(std::count_if(fused.begin(), fused.end(), [](const auto& kv) { return kv.second.size() > 1; })),
              (long long)n_copied, kept.empty() ? "" : " (linear weights kept: ", kept.c_str(), kept.empty() ? "" : ")",
              double(total_in) / 1e6, double(total_out) / 1e6, secs);
  return 0;
}

void setup(CLI::App& app, std::function<int()>& run) {
  auto o = std::make_shared<QuantizeOptions>();
  app.add_option("IN_DIR", o->in_dir, "Hugging Face checkpoint folder with BF16/F16/F32 weights")->required();
  app.add_option("OUT_DIR", o->out_dir, "Output folder (created; must be empty if it exists)")->required();
  app.add_option("--format", o->format, "FP4 format of the quantized weights")
      ->check(CLI::IsMember({"nvfp4", "mxfp4"}))
      ->capture_default_str();
  app.add_option("--exclude", o->exclude,
                 "Module name or glob ('*', '?'; 're:' for a regex) to keep unquantized; repeatable");
  app.add_option("--only", o->only,
                 "Quantize only modules matching this glob (e.g. '*.mlp.experts.*': the routed experts, as "
                 "NVIDIA's NVFP4 checkpoints); repeatable; default: every eligible linear");
  app.add_option("--input-amax", o->input_amax,
                 "NVFP4: also write input_scale = A / (6*448) per quantized linear and declare W4A4 "
                 "(quant_algo NVFP4); nominal, not calibrated")
      ->check(CLI::PositiveNumber);
  app.add_option("--threads", o->threads, "Worker threads (default: FP4MOE_THREADS or all cores)")
      ->check(CLI::NonNegativeNumber);
  run = [o] { return run_quantize(*o); };
}

const Registrar kRegistrar{"quantize", "Quantize a BF16/F32 checkpoint to ModelOpt-layout NVFP4 or MXFP4",
                           setup};

}  // namespace
}  // namespace fp4moe::cli
