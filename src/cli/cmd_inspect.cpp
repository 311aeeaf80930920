// fp4moe inspect DIR: what a Hugging Face checkpoint folder holds and what is wrong with it.
//
// Prints the architecture, the dense/MoE layers, the routing and expert configuration,
// the MLA and indexer dimensions, the quantization config, the format of every tensor
// group (counted per role: routed experts, shared experts, router, attention, dense MLP,
// other) with bytes per format, and a list of problems. For the architectures with a forward
// pass, the problems include what loading for `generate` / `serve` refuses: the config's
// range checks (model::parse_mla_model_config) and the whole weight binding
// (model::bind_weights) run on the tensor headers, no tensor data read. The quant config's
// ignore patterns go through the one bounded matcher (format/quant_config.cpp). Exit 1 when
// the folder cannot be opened (bad config, bad safetensors, bad index); with --strict also
// when problems exist.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli/command.hpp"
#include "core/error.hpp"
#include "core/units.hpp"
#include "format/checkpoint.hpp"
#include "model/model_config.hpp"
#include "model/weights.hpp"

namespace fp4moe {
namespace {

struct InspectArgs {
  std::string dir;
  bool strict = false;
  int max_problems = 50;
};

// "0-2, 5, 7-9" from a sorted list.
std::string ranges(const std::vector<int64_t>& v) {
  std::string out;
  for (size_t i = 0; i < v.size();) {
    size_t j = i;
    while (j + 1 < v.size() && v[j + 1] == v[j] + 1) ++j;
    if (!out.empty()) out += ", ";
    out += j == i ? fmt::format("{}", v[i]) : fmt::format("{}-{}", v[i], v[j]);
    i = j + 1;
  }
  return out.empty() ? "none" : out;
}

std::string role_of(const std::string& prefix) {
  if (prefix.find(".mlp.experts.") != std::string::npos || prefix.ends_with(".mlp.experts.gate_up_proj") ||
      prefix.ends_with(".mlp.experts.down_proj"))
    return "routed experts";
  if (prefix.find(".mlp.shared_expert") != std::string::npos) return "shared experts";
  if (prefix.ends_with(".mlp.gate")) return "router";
  if (prefix.find(".self_attn.") != std::string::npos) return "attention";
  if (prefix.find(".mlp.") != std::string::npos) return "dense mlp";
  return "other";
}

// Layer index of "model.layers.{L}.…", or -1.
int64_t layer_of(const std::string& prefix) {
  constexpr std::string_view kHead = "model.layers.";
  if (!prefix.starts_with(kHead)) return -1;
  int64_t l = 0;
  size_t i = kHead.size();
  if (i >= prefix.size() || !std::isdigit(static_cast<unsigned char>(prefix[i]))) return -1;
  while (i < prefix.size() && std::isdigit(static_cast<unsigned char>(prefix[i])) && l < (int64_t(1) << 40))
    l = l * 10 + (prefix[i++] - '0');
  return l;
}

int run_inspect(const InspectArgs& a) {
  const auto ck = Checkpoint::open(a.dir);
  const ModelConfig& c = ck->config();
  const MoeConfig& m = c.moe;
  std::vector<std::string> problems;

  fmt::print("checkpoint:   {}\n", a.dir);
  fmt::print("architecture: {} (model_type {})\n", c.architecture, c.model_type.empty() ? "?" : c.model_type);
  std::vector<int64_t> dense, moe;
  for (int64_t l = 0; l < c.num_layers; ++l) (c.is_moe_layer(l) ? moe : dense).push_back(l);
  fmt::print("layers:       {} ({} dense: {}; {} MoE: {})\n", c.num_layers, dense.size(), ranges(dense), moe.size(),
             ranges(moe));
  fmt::print("dims:         hidden {}, vocab {}, heads {} (kv {}), dense intermediate {}\n", c.hidden_size,
             c.vocab_size, c.num_attention_heads, c.num_key_value_heads, c.intermediate_size);
  fmt::print("experts:      {} routed x intermediate {}, top-{}; {} router, n_group {}, topk_group {}, "
             "topk_method {}, norm_topk_prob {}, routed scaling {}\n",
             m.num_experts, m.inter, m.top_k, m.scoring == ScoringFunc::Sigmoid ? "sigmoid" : "softmax", m.n_group,
             m.topk_group, c.topk_method.empty() ? "-" : c.topk_method, m.norm_topk_prob, m.routed_scaling);
  fmt::print("shared:       {}\n", m.shared_inter > 0 ? fmt::format("{} expert(s), intermediate {}",
                                                                      std::max<int64_t>(c.n_shared_experts, 1),
                                                                      m.shared_inter)
                                                      : std::string("none"));
  if (c.kv_lora_rank > 0)
    fmt::print("MLA:          q_lora_rank {}, kv_lora_rank {}, qk_nope_head_dim {}, qk_rope_head_dim {}, "
               "v_head_dim {}\n",
               c.q_lora_rank, c.kv_lora_rank, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim);
  else
    fmt::print("attention:    GQA, head_dim {}\n", c.head_dim);
  if (c.index_topk > 0)
    fmt::print("indexer:      {} heads x {}, top-{} tokens (DSA)\n", c.index_n_heads, c.index_head_dim, c.index_topk);
  const QuantConfig& q = ck->quant();
  if (q.quant_method.empty()) {
    fmt::print("quantization: none declared\n");
  } else {
    fmt::print("quantization: {} {} (group {}{}), from {}\n", q.quant_method, q.quant_algo, q.group_size,
               q.format.empty() ? "" : ", " + q.format, q.source);
    fmt::print("ignored:      {}\n", q.ignore.empty() ? std::string("-") : fmt::format("{}", fmt::join(q.ignore, ", ")));
  }
  int64_t total = 0;
  for (const auto& f : ck->files())
    for (const TensorInfo& t : f->tensors()) total += int64_t(t.nbytes());
  fmt::print("files:        {} safetensors file(s), {} of tensor data\n", ck->files().size(), human_bytes(total));

  // What generate and serve do at load, on the headers only.
  if (c.architecture == "GlmMoeDsaForCausalLM" || c.architecture == "DeepseekV3ForCausalLM" ||
      c.architecture == "DeepseekV32ForCausalLM") {
    try {
      const model::MlaModelConfig mc =
          model::parse_mla_model_config(ck->config_json(), c, (std::filesystem::path(a.dir) / "config.json").string());
      (void)model::bind_weights(*ck, mc, /*check_only=*/true);
      fmt::print("model load:   ok (generate and serve bind every tensor)\n");
    } catch (const Error& e) {
      fmt::print("model load:   refused (generate and serve cannot load this folder)\n");
      problems.push_back(fmt::format("model load: {}", e.what()));
    }
  } else {
    fmt::print("model load:   no forward pass for {} (MoE commands only)\n", c.architecture);
  }

  // Tensor groups: role x format counts, bytes per format.
  const std::vector<TensorGroup> groups = ck->groups();
  bool ignore_ok = true;  // false once a pattern failed to match (reported once)
  std::map<std::string, std::map<TensorGroupFormat, int64_t>> by_role;
  std::map<TensorGroupFormat, std::pair<int64_t, int64_t>> by_format;  // groups, bytes
  std::set<std::string> grouped;
  std::map<int64_t, std::set<std::string>> experts_seen;  // layer -> expert prefixes
  for (const TensorGroup& g : groups) {
    by_role[role_of(g.prefix)][g.format]++;
    by_format[g.format].first++;
    by_format[g.format].second += g.bytes();
    for (const auto& [k, t] : g.parts) grouped.insert(t->name);
    for (const std::string& p : g.problems) problems.push_back(p);
    const bool fp4 = g.format == TensorGroupFormat::ModelOptNVFP4 || g.format == TensorGroupFormat::CompressedNVFP4 ||
                     g.format == TensorGroupFormat::MXFP4;
    if (fp4 && !q.quant_method.empty() && ignore_ok) {
      try {
        if (q.is_ignored(g.prefix))
          problems.push_back(fmt::format("{}: is {} but the quant config ignores it", g.prefix,
                                         tensor_group_format_name(g.format)));
      } catch (const Error& e) {
        problems.push_back(fmt::format("{}: {}", q.source, e.what()));
        ignore_ok = false;
      }
    }
    if (fp4 && q.quant_method.empty())
      problems.push_back(fmt::format("{}: is {} but no quantization config is declared", g.prefix,
                                     tensor_group_format_name(g.format)));
    const int64_t layer = layer_of(g.prefix);
    if (role_of(g.prefix) == "routed experts" && layer >= 0) {
      experts_seen[layer].insert(g.prefix.substr(0, g.prefix.rfind('.')));
      if (layer < c.num_layers && !c.is_moe_layer(layer))
        problems.push_back(fmt::format("{}: experts in layer {}, which the config makes dense", g.prefix, layer));
      // Shape against the config: gate/up [I, H], down [H, I].
      const TensorInfo* w = g.parts.count("weight") ? g.parts.at("weight")
                            : g.parts.count("weight_packed") ? g.parts.at("weight_packed")
                                                             : nullptr;
      if (w && w->shape.size() == 2) {
        const int64_t n = w->shape[0], k = fp4 ? w->shape[1] * 2 : w->shape[1];
        const bool down = g.prefix.ends_with(".down_proj");
        const bool gate_up = g.prefix.ends_with(".gate_proj") || g.prefix.ends_with(".up_proj");
        if ((down && (n != m.hidden || k != m.inter)) || (gate_up && (n != m.inter || k != m.hidden)))
          problems.push_back(fmt::format("{}: is [{}, {}], the config says [{}, {}]", g.prefix, n, k,
                                         down ? m.hidden : m.inter, down ? m.inter : m.hidden));
      }
    }
  }
  for (int64_t l : moe) {
    const std::string mlp = fmt::format("model.layers.{}.mlp.", l);
    const size_t n = experts_seen.count(l) ? experts_seen[l].size() : 0;
    const bool stacked = ck->find(mlp + "experts.gate_up_proj_blocks") != nullptr;
    if (!stacked && int64_t(n) != m.num_experts)
      problems.push_back(fmt::format("layer {}: {} of {} routed experts found", l, n, m.num_experts));
    if (!ck->find(mlp + "gate.weight")) problems.push_back(fmt::format("layer {}: no router {}gate.weight", l, mlp));
    if (c.topk_method == "noaux_tc" && !ck->find(mlp + "gate.e_score_correction_bias"))
      problems.push_back(fmt::format("layer {}: topk_method noaux_tc but no {}gate.e_score_correction_bias", l, mlp));
  }

  fmt::print("\ntensor groups (linear layers) by role and format:\n");
  for (const auto& [role, formats] : by_role) {
    std::vector<std::string> parts;
    for (const auto& [f, n] : formats) parts.push_back(fmt::format("{} {}", n, tensor_group_format_name(f)));
    fmt::print("  {:<15} {}\n", role, fmt::join(parts, ", "));
  }
  fmt::print("bytes per format:\n");
  for (const auto& [f, nb] : by_format)
    fmt::print("  {:<25} {:>7} groups  {:>12}\n", tensor_group_format_name(f), nb.first, human_bytes(nb.second));
  int64_t other_n = 0, other_bytes = 0;
  for (const auto& f : ck->files())
    for (const TensorInfo& t : f->tensors())
      if (!grouped.count(t.name)) ++other_n, other_bytes += int64_t(t.nbytes());
  fmt::print("  {:<25} {:>7} tensors {:>12}\n", "ungrouped (norms, biases)", other_n, human_bytes(other_bytes));

  if (problems.empty()) {
    fmt::print("\nproblems: none\n");
  } else {
    fmt::print("\nproblems: {}\n", problems.size());
    for (size_t i = 0; i < problems.size() && int(i) < a.max_problems; ++i) fmt::print("  - {}\n", problems[i]);
    if (int(problems.size()) > a.max_problems)
      fmt::print("  ... and {} more (--max-problems)\n", problems.size() - size_t(a.max_problems));
  }
  std::fflush(stdout);
  return a.strict && !problems.empty() ? 1 : 0;
}

void setup(CLI::App& app, std::function<int()>& run) {
  auto a = std::make_shared<InspectArgs>();
  app.add_option("dir", a->dir, "Hugging Face checkpoint folder (config.json + safetensors)")->required();
  app.add_flag("--strict", a->strict, "exit 1 when any problem is found");
  app.add_option("--max-problems", a->max_problems, "problems to list (default 50)")->check(CLI::NonNegativeNumber);
  run = [a] { return run_inspect(*a); };
}

const cli::Registrar kRegistrar{"inspect", "Describe a checkpoint: architecture, layers, experts, formats, problems",
                                setup};

}  // namespace
}  // namespace fp4moe
