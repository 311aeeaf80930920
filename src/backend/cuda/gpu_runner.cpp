// GpuRunner: load (weights → device), the memory plan, the step (metadata upload, eager
// forward or graph replay, results back), the page pool.
#include "backend/cuda/gpu_runner.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <type_traits>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/log.hpp"
#include "core/threads.hpp"
#include "cuda/attention/kv_append.hpp"
#include "cuda/common/cuda_check.hpp"
#include "cuda/common/device.hpp"
#include "cuda/indexer/indexer.hpp"
#include "cuda/routing/router.hpp"
#include "cuda/sampling/sampling.hpp"
#include "backend/cuda/gpu_runner_impl.hpp"
#include "tuner/arch.hpp"

namespace fp4moe::engine::gpu {
namespace {

constexpr size_t align256(size_t b) { return (b + 255) / 256 * 256; }

DeviceNorm upload_norm(const model::NormWeights& n) {
  DeviceNorm d;
  d.w = cuda::DeviceBuffer::from(n.weight);
  if (!n.bias.empty()) d.b = cuda::DeviceBuffer::from(n.bias);
  return d;
}

// One linear of the checkpoint on the device (cuda/linear picks its kernel), its bytes counted
// by the loader.
Linear upload_linear(const cpu::LinearView& v, const std::string& name, int64_t max_tokens, Loader& ld,
                     bool bf16_only) {
  Linear l(v, name, max_tokens, bf16_only, ld.staging());
  ld.count(l.bytes());
  return l;
}

// Rows [row0, row0 + rows) of expert 0 of an owned stack as a linear view.
cpu::LinearView part_view(const ExpertStack& s, int64_t row0, int64_t rows) {
  cpu::LinearView v;
  v.n = rows;
  v.k = s.k;
  if (!s.is_fp4()) {
    v.format = cpu::LinearFormat::BF16;
    v.data = s.bf16.data() + row0 * s.k;
    return v;
  }
  v.format = s.format == WeightFormat::MXFP4 ? cpu::LinearFormat::MXFP4 : cpu::LinearFormat::NVFP4;
  v.packed = s.packed.data() + row0 * s.k / 2;
  v.scales = s.scales.data() + row0 * s.k / s.block();
  v.global_scale = s.global_scale[0];
  return v;
}

DenseMlp shared_mlp(const MoeLayerWeights& w, const std::string& name, int64_t max_tokens, Loader& ld) {
  const int64_t SI = w.cfg.shared_inter;
  DenseMlp m;
  m.inter = SI;
  m.gate = upload_linear(part_view(*w.shared_w13, 0, SI), name + ".gate_proj", max_tokens, ld, false);
  m.up = upload_linear(part_view(*w.shared_w13, SI, SI), name + ".up_proj", max_tokens, ld, false);
  m.down = upload_linear(part_view(*w.shared_w2, 0, w.cfg.hidden), name + ".down_proj", max_tokens, ld, false);
  return m;
}

// A bound MoE layer as MoeLayerCuda takes it: the routed experts stay views of the mmap'd
// shards (re-laid per tile into the loader's pinned staging on their way to the device, no
// host copy of the layer); the shared expert (one expert) gets an owned copy (the fold and
// BF16 paths slice it).
MoeLayerWeights moe_layer_for_upload(const MoeLayerWeights& v, const std::string& name) {
  if (v.w13.is_view() && v.w13.format == WeightFormat::NVFP4 && v.w13.parts == 2) {
    int64_t rescaled = 0;
    for (int64_t e = 0; e < v.w13.num_experts; ++e)
      rescaled += v.w13.views[size_t(2 * e)].global_scale != v.w13.views[size_t(2 * e + 1)].global_scale;
    if (rescaled > 0)
      log_warn("{}: {} of {} experts have different gate/up weight_scale_2; the block scales of the smaller are "
               "rescaled to the larger (rounded to E4M3)",
               name, rescaled, v.w13.num_experts);
  }
  MoeLayerWeights m = v;
  if (m.shared_w13) m.shared_w13 = owned_expert_stack(*v.shared_w13);
  if (m.shared_w2) m.shared_w2 = owned_expert_stack(*v.shared_w2);
  return m;
}

// BF16 routed experts run dense over all E experts (DenseExperts: cuBLAS batched, a fallback):
// their scratch at T tokens per step, and the most it may take.
constexpr int64_t kDenseExpertsScratchCap = int64_t(8) << 30;
int64_t dense_experts_scratch_bytes(const MoeConfig& m, int64_t T) {
  return m.num_experts * T * (2 * m.inter * 2 + m.inter * 2 + m.hidden * 4);
}

// A BF16 expert stack [E, n, k] (owned or views) to the device through the loader.
cuda::DeviceBuffer upload_bf16_stack(const ExpertStack& s, Loader& ld) {
  const size_t bytes = size_t(s.num_experts * s.n * s.k) * 2;
  if (!s.is_view()) {
    FP4MOE_CHECK(s.bf16.size() * 2 == bytes, "BF16 experts: {} values for [{}, {}, {}]", s.bf16.size(), s.num_experts,
                 s.n, s.k);
    return ld.upload(s.bf16.data(), bytes);
  }
  cuda::DeviceBuffer d(bytes);
  const size_t part = size_t(s.n / s.parts * s.k) * 2;
  for (size_t i = 0; i < s.views.size(); ++i) ld.upload_to(d.as<uint8_t>() + i * part, s.views[i].bf16, part);
  return d;
}

}  // namespace

std::vector<int64_t> graph_buckets(int64_t max_bs) {
  std::vector<int64_t> b;
  for (int64_t x : {1, 2, 4}) b.push_back(x);
  for (int64_t x = 8; x <= 64; x += 8) b.push_back(x);
  for (int64_t x = 96; x <= 256; x += 32) b.push_back(x);
  for (int64_t x = 320; x <= 1024; x += 64) b.push_back(x);
  for (int64_t x = 1280; x <= 8192; x += 256) b.push_back(x);
  std::vector<int64_t> out;
  for (int64_t x : b)
    if (x <= max_bs) out.push_back(x);
  if (max_bs > 0 && (out.empty() || out.back() < max_bs)) out.push_back(max_bs);
  return out;
}

void PinnedInts::alloc(size_t count) {
  if (p) cudaFreeHost(p);
  p = nullptr;
  n = count;
  FP4MOE_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&p), std::max<size_t>(count, 1) * 4));
}
PinnedInts::~PinnedInts() {
  if (p) cudaFreeHost(p);
}
StageMarks::~StageMarks() {
  for (cudaEvent_t e : events) cudaEventDestroy(e);
}

const char* step_stage_name(StepStage s) {
  static const char* const names[kNumStepStages] = {"embed", "attention", "indexer", "moe", "dense", "lm_head",
                                                    "sampling"};
  return names[int(s)];
}
double StageTimes::total() const {
  double t = 0.0;
  for (double x : ms) t += x;
  return t;
}

GpuRunner::Impl::~Impl() {
  for (auto& [bs, g] : graphs)
    if (g.exec) cudaGraphExecDestroy(g.exec);
  for (auto& [bs, g] : mtp_graphs)
    if (g.exec) cudaGraphExecDestroy(g.exec);
  if (ev_begin) cudaEventDestroy(ev_begin);
  if (ev_end) cudaEventDestroy(ev_end);
  if (meta_host) cudaFreeHost(meta_host);
  if (stream) cudaStreamDestroy(stream);
}

void GpuRunner::Impl::load_weights(const model::ModelWeights& w, Loader& ld) {
  const model::MlaModelConfig& c = cfg;
  const int64_t Tm = opt.max_tokens;
  if (w.embed.w.format == cpu::LinearFormat::BF16) {
    embed = ld.upload(w.embed.w.data, size_t(c.vocab * c.hidden) * 2);
  } else {
    const std::vector<uint16_t> e = linear_to_bf16(w.embed.w);  // F32 tables rounded to BF16
    embed = ld.upload(e.data(), e.size() * 2);
  }
  layers.resize(size_t(c.num_layers));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const int64_t src = layer_src[size_t(l)];
    load_layer(w.layers[size_t(src)], layers[size_t(l)], fmt::format("model.layers.{}.", src), ld);
  }
  final_norm = upload_norm(w.final_norm);
  ld.progress("lm_head");
  lm_head = upload_linear(w.lm_head.w, "lm_head", Tm, ld, true);
  inv_freq = cuda::DeviceBuffer::from(c.rope.inv_freq);
  if (opt.mtp) load_mtp(w, ld);
  ld.finish();
  weight_bytes = int64_t(ld.bytes());
}

void GpuRunner::Impl::load_mtp(const model::ModelWeights& w, Loader& ld) {
  const model::MlaModelConfig& c = cfg;
  const int64_t Tm = opt.max_tokens, ck_layers = int64_t(w.layers.size());
  FP4MOE_CHECK(!w.mtp.empty(), "gpu runner: the checkpoint has no MTP layer (model.layers.{}.*; "
               "num_nextn_predict_layers {})", ck_layers, c.num_nextn_predict_layers);
  const model::MtpWeights& mw = w.mtp[0];
  FP4MOE_CHECK(mw.layer.attn.indexer || !c.has_indexer(),
               "gpu runner: the MTP layer has no indexer weights of its own (model.layers.{}.self_attn.indexer.*): a "
               "shared top-k has no earlier layer to come from in the draft step", ck_layers);
  const size_t before = ld.bytes();
  auto d = std::make_unique<DeviceMtp>();
  const std::string P = fmt::format("model.layers.{}.", ck_layers);
  ld.progress(P + "eh_proj");
  d->enorm = upload_norm(mw.enorm);
  d->hnorm = upload_norm(mw.hnorm);
  d->head_norm = upload_norm(mw.shared_head_norm);
  d->eh_proj = upload_linear(mw.eh_proj.w, P + "eh_proj", Tm, ld, true);  // FP32 out: the block's residual
  if (mw.embed) {
    if (mw.embed->w.format == cpu::LinearFormat::BF16) {
      d->embed = ld.upload(mw.embed->w.data, size_t(c.vocab * c.hidden) * 2);
    } else {
      const std::vector<uint16_t> e = linear_to_bf16(mw.embed->w);
      d->embed = ld.upload(e.data(), e.size() * 2);
    }
  }
  if (mw.head) d->head = upload_linear(mw.head->w, P + "shared_head.head", Tm, ld, true);
  if (mw.layer.is_moe && !mw.layer.moe.w13.is_fp4()) {  // kept BF16: --speculative-draft-model-quantization unquant
    const int64_t bytes = dense_experts_scratch_bytes(mw.layer.moe.cfg, Tm);
    FP4MOE_CHECK(bytes <= kDenseExpertsScratchCap,
                 "--speculative-draft-model-quantization unquant: the MTP layer's {} BF16 routed experts run dense over "
                 "all experts, {:.1f} GB of scratch at {} tokens per step ({:.0f} GB at most); use nvfp4 (the default: "
                 "quantized at load) or fewer tokens per step",
                 mw.layer.moe.cfg.num_experts, double(bytes) / 1e9, Tm, double(kDenseExpertsScratchCap) / 1e9);
  }
  load_layer(mw.layer, d->block, P, ld);
  d->indexer = mw.layer.attn.indexer ? model::IndexerKind::Full : model::IndexerKind::None;
  d->bytes = int64_t(ld.bytes() - before);
  mtp = std::move(d);
}

void GpuRunner::Impl::load_layer(const model::LayerWeights& lw, DeviceLayer& L, const std::string& P, Loader& ld) {
  const model::MlaModelConfig& c = cfg;
  const int64_t Tm = opt.max_tokens;
  {
    ld.progress(P + "self_attn");
    L.input_norm = upload_norm(lw.input_norm);
    L.post_norm = upload_norm(lw.post_attention_norm);
    const model::AttentionWeights& a = lw.attn;
    if (c.q_lora_rank > 0) {
      L.q_a = upload_linear(a.q_a.w, P + "self_attn.q_a_proj", Tm, ld, false);
      L.q_a_norm = upload_norm(a.q_a_norm);
      L.q_b = upload_linear(a.q_b.w, P + "self_attn.q_b_proj", Tm, ld, false);
    } else {
      L.q_proj = upload_linear(a.q_proj.w, P + "self_attn.q_proj", Tm, ld, false);
    }
    L.kv_a = upload_linear(a.kv_a.w, P + "self_attn.kv_a_proj_with_mqa", Tm, ld, false);
    L.kv_a_norm = upload_norm(a.kv_a_norm);
    L.kv_b = upload_linear(a.kv_b.w, P + "self_attn.kv_b_proj", Tm, ld, true);  // absorbed per head: BF16
    L.o = upload_linear(a.o.w, P + "self_attn.o_proj", Tm, ld, false);
    if (a.indexer) {
      L.has_indexer = true;
      L.wq_b = upload_linear(a.indexer->wq_b.w, P + "self_attn.indexer.wq_b", Tm, ld, false);
      L.wk = upload_linear(a.indexer->wk.w, P + "self_attn.indexer.wk", Tm, ld, false);
      L.k_norm = upload_norm(a.indexer->k_norm);
      L.weights_proj = upload_linear(a.indexer->weights_proj.w, P + "self_attn.indexer.weights_proj", Tm, ld, false);
    }
    L.is_moe = lw.is_moe;
    ld.progress(P + "mlp");
    if (!lw.is_moe) {
      L.mlp.inter = c.intermediate;
      L.mlp.gate = upload_linear(lw.mlp.gate.w, P + "mlp.gate_proj", Tm, ld, false);
      L.mlp.up = upload_linear(lw.mlp.up.w, P + "mlp.up_proj", Tm, ld, false);
      L.mlp.down = upload_linear(lw.mlp.down.w, P + "mlp.down_proj", Tm, ld, false);
      return;
    }
    MoeLayerWeights mw = moe_layer_for_upload(lw.moe, P + "mlp.experts");
    const bool shared_fp4 = mw.shared_w13 && mw.shared_w13->is_fp4() && mw.shared_w2->is_fp4();
    if (mw.shared_w13 && (!shared_fp4 || !mw.w13.is_fp4())) {
      L.shared = shared_mlp(mw, P + "mlp.shared_experts", Tm, ld);
      mw.cfg.shared_inter = 0;
      mw.shared_w13.reset();
      mw.shared_w2.reset();
    }
    if (mw.w13.is_fp4()) {
      MoeCudaOptions mo;
      mo.max_tokens = int(Tm);
      mo.staging = &ld.staging();
      L.moe = std::make_unique<MoeLayerCuda>(mw, mo);
      ld.count(L.moe->expert_bytes() * size_t(mw.cfg.num_experts) + L.moe->shared_bytes() + L.moe->router_bytes());
    } else {
      static bool said = false;
      if (!said && !opt.quiet)
        log_info("gpu runner: BF16 routed experts run dense over all experts (cuBLAS batched; a fallback, "
                 "E x the routed FLOPs)");
      said = true;
      DenseExperts d;
      d.w13 = upload_bf16_stack(mw.w13, ld);
      d.w2 = upload_bf16_stack(mw.w2, ld);
      d.router_w = cuda::DeviceBuffer::from(mw.router_w);
      if (!mw.router_bias.empty()) d.router_bias = cuda::DeviceBuffer::from(mw.router_bias);
      d.router = cuda::router_desc_from(mw.cfg);
      cuda::check_router_desc(d.router);
      const int64_t bytes = dense_experts_scratch_bytes(mw.cfg, Tm);
      FP4MOE_CHECK(bytes <= kDenseExpertsScratchCap,
                   "BF16 experts at {} tokens per step need {:.1f} GB of dense-over-experts scratch; lower max_tokens",
                   Tm, double(bytes) / 1e9);
      L.dense_experts = std::move(d);
    }
  }
}

size_t GpuRunner::Impl::replicate_layers() {
  model::MlaModelConfig& c = cfg;
  layer_src.resize(size_t(c.num_layers));
  for (int64_t l = 0; l < c.num_layers; ++l) layer_src[size_t(l)] = l;
  const int64_t N = opt.replicate_layers;
  if (N <= c.num_layers) return 0;
  std::vector<int64_t> moe;
  for (int64_t l = 0; l < c.num_layers; ++l)
    if (c.moe_layer[size_t(l)]) moe.push_back(l);
  FP4MOE_CHECK(!moe.empty(), "--replicate-layers {}: the checkpoint has no MoE layer to copy", N);
  // Bytes of each checkpoint layer's tensors (the progress bar's total grows by the copies).
  std::vector<size_t> layer_bytes(size_t(c.num_layers), 0);
  for (const auto& f : ck->files())
    for (const TensorInfo& t : f->tensors()) {
      int64_t l = -1;
      if (std::sscanf(t.name.c_str(), "model.layers.%" SCNd64 ".", &l) == 1 && l >= 0 && l < c.num_layers)
        layer_bytes[size_t(l)] += t.nbytes();
    }
  size_t extra = 0;
  const int64_t L0 = c.num_layers;
  for (int64_t l = L0; l < N; ++l) {
    const int64_t s = moe[size_t(l - L0) % moe.size()];
    layer_src.push_back(s);
    c.moe_layer.push_back(true);
    c.indexer.push_back(c.indexer[size_t(s)]);
    extra += layer_bytes[size_t(s)];
  }
  c.num_layers = N;
  return extra;
}

void GpuRunner::Impl::choose_attention() {
  namespace at = cuda::attention;
  const model::MlaModelConfig& c = cfg;
  tuner::AttentionDims d;
  d.heads = c.num_heads, d.kv_lora = c.kv_lora_rank, d.rope = c.qk_rope_dim;
  d.softmax_scale = c.softmax_scale;
  d.kv_fp8 = kv_fp8;
  d.indexer = c.has_indexer();
  d.index_heads = c.index_n_heads, d.index_dim = c.index_head_dim, d.index_topk = c.index_topk;
  d.index_rope_interleaved = c.index_rope == model::RopeLayout::Interleaved;
  for (int64_t l = 0; l < c.num_layers; ++l)
    d.dsa_layer.push_back(layers[size_t(l)].has_indexer || c.indexer[size_t(l)] == model::IndexerKind::Shared);
  if (mtp) d.dsa_layer.push_back(mtp->block.has_indexer);
  const tuner::AttentionPlan p =
      tuner::plan_attention(tuner::device_arch(cuda::current_device_ordinal()), tuner::flashinfer_mla_built(), d,
                            opt.attention_kernels);
  FP4MOE_CHECK(p.error.empty(), "{}", p.error);
  attention_plan = p;
  at::MlaDesc desc;
  desc.num_heads = int(c.num_heads);
  desc.sm_scale = float(c.softmax_scale);
  desc.kv_elem = kv_fp8 ? KvElem::FP8_E4M3 : KvElem::BF16;
  if (p.mma_decode)
    mla_fast = std::make_unique<at::MlaDecodeMma>(desc, p.wgmma_ws ? at::DecodeMath::kWgmmaWs
                                                        : p.wgmma  ? at::DecodeMath::kWgmma
                                                                   : at::DecodeMath::kMmaSync);
  if (p.flashinfer_decode) {
    mla_fi_decode = std::make_unique<at::MlaSm90>(desc);
    mla_fi_decode->reserve_device(int(opt.max_tokens));
  }
  mma_sparse_max_rows = p.mma_sparse_max_rows;
  // MlaDecodeMma's workspace: beside FlashInfer's decode only for the smallest steps' DSA rows
  // (none when FlashInfer is forced), else for every decode and top-k row.
  if (mla_fast && !mla_fi_decode) mla_fast->reserve_device(int(opt.max_tokens));
  if (mla_fast && mla_fi_decode && mma_sparse_max_rows > 0) mla_fast->reserve_device(mma_sparse_max_rows);
  if (p.flashinfer_prefill) mla_prefill = std::make_unique<at::MlaSm90>(desc);
  fast_indexer = p.fast_indexer;
  fast_index_key = p.fast_index_key;
  fast_latent = p.fast_latent;
  topk_one_cta_keys_many_rows = p.topk_one_cta_keys_many_rows;
  topk_one_cta_max_rows = p.topk_one_cta_max_rows;
  attention_line = p.line;
}

RunnerPlanInput GpuRunner::Impl::plan_input(const model::ModelWeights& w, int64_t device_bytes) const {
  const model::MlaModelConfig& c = cfg;
  RunnerPlanInput in;
  RunnerDims& d = in.dims;
  d.hidden = c.hidden, d.heads = c.num_heads, d.qk_head_dim = c.qk_head_dim(), d.kv_lora = c.kv_lora_rank;
  d.rope = c.qk_rope_dim, d.v_head = c.v_head_dim, d.q_lora = c.q_lora_rank;
  d.index_heads = c.index_n_heads, d.index_dim = c.index_head_dim, d.index_topk = c.index_topk;
  d.indexer = c.has_indexer();
  d.fp8_index_queries = kv_fp8;  // (counted before choose_attention knows the scores' kernel: at most a few MB over)
  d.vocab = c.vocab;
  d.max_inter = c.intermediate;
  d.experts = c.moe.num_experts, d.top_k = c.moe.top_k, d.moe_inter = c.moe.inter;
  // Every block the runner loads: the target's layers, then the MTP layer's (RunnerOptions::mtp).
  std::vector<const model::LayerWeights*> blocks;
  for (int64_t l = 0; l < c.num_layers; ++l) blocks.push_back(&w.layers[size_t(layer_src[size_t(l)])]);
  if (opt.mtp && !w.mtp.empty()) blocks.push_back(&w.mtp[0].layer);
  for (const model::LayerWeights* lwp : blocks) {
    const model::LayerWeights& lw = *lwp;
    d.kv_bytes_per_token += runner_kv_bytes_per_token(1, lw.attn.indexer ? 1 : 0, c.kv_lora_rank, c.qk_rope_dim,
                                                      c.index_head_dim, opt.kv_elem, opt.kv_elem);
    if (!lw.is_moe) continue;
    const MoeLayerWeights& m = lw.moe;
    const bool fp4 = m.w13.is_fp4();
    const bool folded = fp4 && m.shared_w13 && m.shared_w13->is_fp4() && m.shared_w2 && m.shared_w2->is_fp4();
    if (m.shared_w13 && !folded) d.max_inter = std::max(d.max_inter, m.cfg.shared_inter);
    if (fp4) {
      d.moe = true;
      // the fold's pieces of inter rows each (moe::shared_fold_pieces), at least one
      const int64_t pieces = folded ? std::max<int64_t>(1, (m.cfg.shared_inter + m.cfg.inter - 1) / m.cfg.inter) : 0;
      d.moe_rows_per_token = std::max(d.moe_rows_per_token, m.cfg.top_k + pieces);
    } else {
      d.dense_experts = true;
    }
  }
  in.device_bytes = device_bytes;
  in.mem_fraction_static = opt.mem_fraction_static;
  in.workspace_fraction = opt.workspace_fraction;
  in.max_tokens = opt.max_tokens;
  in.min_tokens = opt.min_tokens;
  const int64_t gmax = opt.cuda_graph_max_bs < 0 ? opt.max_requests : opt.cuda_graph_max_bs;
  in.max_logits_rows = opt.max_logits_rows > 0 ? std::max({opt.max_logits_rows, opt.max_requests, gmax}) : 0;
  in.max_requests = opt.max_requests;
  in.max_context = opt.max_context;
  in.max_decode_steps = opt.max_decode_steps;
  in.page_size = opt.page_size;
  in.max_total_tokens = opt.max_total_tokens;
  in.graph_buckets = int64_t(graph_buckets(gmax).size());
  // Decode steps (graphs included) never chunk their score rows: at least a row per request.
  in.min_score_rows = std::max<int64_t>({opt.max_requests, gmax, 1});
  in.max_score_rows = opt.max_score_rows;
  in.tokens_flag = opt.tokens_flag;
  in.kv_needs = opt.kv_needs;
  in.kv_flag = opt.kv_flag;
  const int E = int(std::max<int64_t>(c.moe.num_experts, 1));
  in.router_workspace = [E](int64_t T) { return int64_t(cuda::router_workspace_bytes(T, E)); };
  in.topk_workspace = [](int64_t rows, int64_t ctx) {
    return int64_t(cuda::indexer::top_k_workspace_bytes(rows, int(ctx)));
  };
  const int64_t V = c.vocab;
  in.sample_workspace = [V](int64_t rows) { return int64_t(cuda::sampling::sample_workspace_bytes(rows, V)); };
  in.sample_in_bytes = [](int64_t rows) { return int64_t(sample_in_bytes(rows)); };
  in.sample_out_bytes = [](int64_t steps, int64_t rows) { return int64_t(sample_out_ints(steps, rows)) * 4; };
  in.token_mask_bytes = [V](int64_t logits_rows, int64_t rows) { return int64_t(token_mask_bytes(logits_rows, rows, V)); };
  return in;
}

void GpuRunner::Impl::plan_memory() {
  const model::MlaModelConfig& c = cfg;
  size_t fp4_ws = 0;
  std::vector<const DeviceLayer*> blocks;  // the target's layers and the MTP layer's block
  for (const DeviceLayer& L : layers) blocks.push_back(&L);
  if (mtp) blocks.push_back(&mtp->block);
  for (const DeviceLayer* Lp : blocks) {
    const DeviceLayer& L = *Lp;
    for (const Linear* g : {&L.q_a, &L.q_b, &L.q_proj, &L.kv_a, &L.o, &L.wq_b, &L.wk, &L.weights_proj, &L.mlp.gate,
                               &L.mlp.up, &L.mlp.down})
      fp4_ws = std::max(fp4_ws, g->fp4_workspace_bytes());
    if (L.shared)
      for (const Linear* g : {&L.shared->gate, &L.shared->up, &L.shared->down})
        fp4_ws = std::max(fp4_ws, g->fp4_workspace_bytes());
  }
  auto moe_ws_at = [&](int64_t tokens) {
    size_t b = 0;
    for (const DeviceLayer* L : blocks)
      if (L->moe) b = std::max(b, L->moe->workspace_bytes(tokens));
    return b;
  };
  // The plan again with what is measured now (weights and attention workspaces in use, the MoE
  // layers' own workspace sizes), before the workspace and the KV pool are allocated. Where
  // opt.min_tokens allows, the tokens per step may come down further (everything loaded was sized
  // for the larger count, which holds any smaller one).
  {
    size_t free0 = 0, total0 = 0;
    FP4MOE_CUDA_CHECK(cudaMemGetInfo(&free0, &total0));
    RunnerPlanInput in = plan_in;
    in.in_use_bytes = int64_t(total0 - free0);
    in.weight_bytes = 0;
    in.max_tokens = opt.max_tokens;
    in.min_tokens = opt.min_tokens > 0 ? std::min(opt.min_tokens, opt.max_tokens) : 0;
    in.fixed_workspace_bytes = int64_t(fp4_ws);
    in.moe_workspace = [&](int64_t tokens) { return int64_t(moe_ws_at(tokens)); };
    in.dims.rope_queries = mla_fast != nullptr;  // what the attention plan chose (the first plan counted both)
    in.dims.fp8_index_queries = kv_fp8 && fast_indexer;
    RunnerPlan p = plan_runner_memory(in);
    FP4MOE_CHECK(p.ok, "{}", p.error);
    if (plan.tokens_lowered) {  // said as the first plan lowered it, unless this one lowered further
      if (!p.tokens_lowered) p.tokens_lowered = true, p.lowered_for_kv = plan.lowered_for_kv;
      p.tokens_asked = plan.tokens_asked;
    }
    plan = p;
    opt.max_tokens = plan.max_tokens;
    logits_rows = plan.logits_rows;
    score_rows = plan.score_rows;
  }
  const int64_t T = opt.max_tokens, C = c.kv_lora_rank, Rd = c.qk_rope_dim, D = c.index_head_dim;
  // The workspace, buffer by buffer, as the plan counted it (engine::runner_workspace_buffers:
  // one list for the plan and the layout).
  RunnerPlanInput in = plan_in;
  in.dims.rope_queries = mla_fast != nullptr;
  in.dims.fp8_index_queries = kv_fp8 && fast_indexer;
  in.max_tokens = T;
  in.fixed_workspace_bytes = int64_t(fp4_ws);
  in.moe_workspace = [&](int64_t tokens) { return int64_t(moe_ws_at(tokens)); };
  constexpr size_t kAbsent = ~size_t(0);
  std::array<size_t, size_t(WsBuf::Count)> offset;
  std::array<size_t, size_t(WsBuf::Count)> bytes{};
  offset.fill(kAbsent);
  size_t off = 0;
  for (const WsBuffer& b : runner_workspace_buffers(in, T, logits_rows)) {
    offset[size_t(b.id)] = off;
    bytes[size_t(b.id)] = size_t(b.bytes);
    off += size_t(ws_layout_bytes(b.bytes));
  }
  FP4MOE_CHECK(int64_t(off) == plan.ws.total(), "memory plan: the workspace laid out is {} B, the plan's {} B", off,
               plan.ws.total());
  phase = "allocating the step workspace";
  workspace = cuda::DeviceBuffer(off);
  auto at = [&](WsBuf id, auto*& p) {
    using Ptr = std::remove_reference_t<decltype(p)>;
    p = offset[size_t(id)] == kAbsent ? nullptr
                                      : reinterpret_cast<Ptr>(static_cast<uint8_t*>(workspace.ptr()) + offset[size_t(id)]);
  };
  at(WsBuf::X, s.x), at(WsBuf::H, s.h), at(WsBuf::O, s.o), at(WsBuf::Of, s.of), at(WsBuf::Qa, s.qa);
  at(WsBuf::Q, s.q), at(WsBuf::Kva, s.kva), at(WsBuf::Ckv, s.ckv), at(WsBuf::Ql, s.ql), at(WsBuf::Ol, s.ol);
  at(WsBuf::Qpe, s.qpe), at(WsBuf::Ov, s.ov), at(WsBuf::Ik, s.ik), at(WsBuf::Iq, s.iq), at(WsBuf::Iw16, s.iw16);
  at(WsBuf::Iw, s.iw), at(WsBuf::Iq8, s.iq8), at(WsBuf::Iw8, s.iw8), at(WsBuf::Scores, s.scores);
  at(WsBuf::ChunkQo, s.chunk_qo), at(WsBuf::TopkPos, s.topk_pos), at(WsBuf::TopkSlot, s.topk_slot);
  at(WsBuf::G, s.g), at(WsBuf::U, s.u), at(WsBuf::Hm, s.hm), at(WsBuf::Rows, s.rows), at(WsBuf::Logits, s.logits);
  at(WsBuf::Greedy, s.greedy), at(WsBuf::ArgmaxWs, s.argmax_ws), at(WsBuf::Rlogits, s.rlogits), at(WsBuf::Rids, s.rids), at(WsBuf::Rw, s.rw);
  at(WsBuf::Gu, s.gu), at(WsBuf::Eh, s.eh), at(WsBuf::Ey, s.ey), at(WsBuf::MoeWs, s.moe_ws);
  at(WsBuf::RouterWs, s.router_ws), at(WsBuf::TopkWs, s.topk_ws), at(WsBuf::Fp4Ws, s.fp4_ws);
  at(WsBuf::SampleWs, s.sample_ws), at(WsBuf::SampleIn, s.sample_in), at(WsBuf::SampleOut, s.sample_out);
  at(WsBuf::SampleHist, s.sample_hist), at(WsBuf::TokenMasks, s.token_masks);
  const size_t moe_ws = bytes[size_t(WsBuf::MoeWs)], router_ws = bytes[size_t(WsBuf::RouterWs)],
               topk_ws = bytes[size_t(WsBuf::TopkWs)], sample_ws = bytes[size_t(WsBuf::SampleWs)];
  // Device sampling (gpu_sample.cpp): max_requests rows, max_decode_steps results per launch.
  sample_rows = std::max<int64_t>(opt.max_requests, 1);
  sample_steps = std::max<int64_t>(opt.max_decode_steps, 1);
  sample_hist_ints = sample_rows * (opt.max_context + sample_steps);
  s.moe_ws_bytes = moe_ws;
  s.router_ws_bytes = router_ws;
  s.topk_ws_bytes = topk_ws;
  s.sample_ws_bytes = sample_ws;
  s.argmax_ws_bytes = bytes[size_t(WsBuf::ArgmaxWs)];
  FP4MOE_CUDA_CHECK(cudaMemset(workspace.ptr(), 0, workspace.bytes()));  // the MoE / router counters start at 0
  workspace_bytes = int64_t(off);

  // Step metadata (fixed addresses: graphs read them).
  meta.max_tokens = T;
  meta.max_requests = std::max<int64_t>(opt.max_requests, 1) + 1;
  meta.max_page_entries = meta.max_requests * ((opt.max_context + opt.page_size - 1) / opt.page_size + 1);
  int32_t** ptrs[] = {&meta.tokens, &meta.positions,    &meta.token_req, &meta.qo_indptr, &meta.kv_len,
                      &meta.page_indptr, &meta.page_indices, &meta.rows, &meta.offsets, &meta.active};
  const int64_t sizes[] = {T, T, T, meta.max_requests + 1, meta.max_requests, meta.max_requests + 1,
                           meta.max_page_entries, T, 2, meta.max_requests};
  size_t ints = 0;
  for (int64_t sz : sizes) ints += size_t(sz);
  meta.ints = ints;
  meta_dev = cuda::DeviceBuffer(ints * 4);
  FP4MOE_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&meta_host), ints * 4));
  size_t o = 0;
  for (size_t i = 0; i < std::size(ptrs); ++i) {
    *ptrs[i] = meta_dev.as<int32_t>() + o;
    o += size_t(sizes[i]);
  }

  // KV pool from what is left.
  kv_per_token = 0;
  const KvElem elem = kv_fp8 ? KvElem::FP8_E4M3 : KvElem::BF16;
  const size_t esz = kv_elem_size(elem);
  for (const DeviceLayer* L : blocks)  // (the MTP layer's KV: the pool's layer num_layers)
    kv_per_token += runner_kv_bytes_per_token(1, L->has_indexer ? 1 : 0, C, Rd, D, elem, elem);
  size_t free_b = 0, total_b = 0;
  FP4MOE_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  const int64_t used = int64_t(total_b - free_b);
  // The graphs' estimate stays free for their capture (after the pool).
  const int64_t budget = int64_t(double(total_b) * opt.mem_fraction_static) - used - plan.graph_bytes;
  const int64_t page_bytes = kv_per_token * opt.page_size;
  int64_t pages = std::max<int64_t>(budget, 0) / page_bytes;
  if (opt.max_total_tokens > 0) pages = std::min<int64_t>(pages, (opt.max_total_tokens + opt.page_size - 1) / opt.page_size);
  // At least one request at the full context + the padding rows' page (less when --max-total-tokens caps it).
  int64_t need = plan.min_kv_tokens / opt.page_size;
  if (opt.max_total_tokens > 0) need = std::min(need, (opt.max_total_tokens + opt.page_size - 1) / opt.page_size);
  need = std::max<int64_t>(need, 2);
  FP4MOE_CHECK(pages >= need,
               "memory plan: the KV pool gets {} pages of {} tokens ({:.2f} GB of {:.2f} x {:.2f} GB after {:.2f} GB in "
               "use and ~{:.2f} GB for graphs), one request of {} tokens needs {}; lower --context-length or "
               "--max-running-requests, or raise --mem-fraction-static",
               pages, opt.page_size, double(std::max<int64_t>(budget, 0)) / 1e9, opt.mem_fraction_static,
               double(total_b) / 1e9, double(used) / 1e9, double(plan.graph_bytes) / 1e9, opt.max_context, need);
  pages = std::min<int64_t>(pages, INT32_MAX / opt.page_size - 1);
  num_pages = pages - 1;  // the last page takes the padding rows' cache writes
  trash_page = num_pages;
  phase = "allocating the KV pool";
  kv = cuda::DeviceBuffer(size_t(pages * page_bytes));
  FP4MOE_CUDA_CHECK(cudaMemset(kv.ptr(), 0, kv.bytes()));
  uint8_t* p = kv.as<uint8_t>();
  for (size_t l = 0; l < blocks.size(); ++l) {
    KvLayerView v;
    v.num_pages = pages;
    v.page_size = opt.page_size;
    v.ckv_dim = C;
    v.kpe_dim = Rd;
    v.elem = v.index_elem = elem;
    if (kv_fp8) v.ckv_scale = ckv_scale, v.kpe_scale = kpe_scale, v.index_scale = index_scale;
    const size_t slots = size_t(pages * opt.page_size);
    v.ckv = p, p += slots * C * esz;
    v.kpe = p, p += slots * Rd * esz;
    if (blocks[l]->has_indexer) {
      v.index_dim = D;
      v.index_k = p, p += slots * D * esz;
    }
    kv_layers.push_back(v);
  }
  page_pool = std::make_unique<PagePool>(int32_t(num_pages));  // the engine's allocator: page 0 first, LIFO
  plan_line = fmt::format(
      "memory plan: weights {:.2f} GB{}, {}; KV pool {:.2f} GB = {} tokens ({} pages of {}, {} B/token{}, {}); device "
      "{:.1f} GB ({:.2f} GB in use before the load), --mem-fraction-static {}",
      double(weight_bytes) / 1e9,
      mtp ? fmt::format(" (the MTP layer's {:.3f} GB included)", double(mtp->bytes) / 1e9) : std::string(),
      plan.describe(), double(kv.bytes()) / 1e9, num_pages * opt.page_size, num_pages, opt.page_size, kv_per_token,
      mtp ? fmt::format(" over {} + 1 MTP layers", c.num_layers) : std::string(), kv_fp8 ? kv_line : std::string("BF16"),
      double(total_b) / 1e9,
      double(start_in_use) / 1e9, opt.mem_fraction_static);
  if (int64_t(workspace_bytes) != plan.ws.total())
    plan_line += fmt::format(" (workspace laid out: {:.2f} GB)", double(workspace_bytes) / 1e9);
}

void GpuRunner::Impl::plan_counters() {
  StepCounters& c = counters;
  c.moe_slot.assign(layers.size(), -1);
  for (size_t l = 0; l < layers.size(); ++l)
    if (layers[l].moe || layers[l].dense_experts) {
      c.moe_slot[l] = int32_t(c.moe_ids.size());
      c.moe_ids.push_back(int32_t(l));
    }
  c.moe_layers = int64_t(c.moe_ids.size());
  c.experts = c.moe_layers > 0 ? cfg.moe.num_experts : 0;
  FP4MOE_CHECK(opt.max_decode_steps >= 1 && opt.max_stop_ids >= 0, "gpu runner: max decode steps {} (>= 1), stop ids {}",
               opt.max_decode_steps, opt.max_stop_ids);
  c.kmax = opt.max_decode_steps;
  c.rm = meta.max_requests;
  c.stops = opt.max_stop_ids;
  const size_t n = size_t(c.moe_layers * c.experts);
  c.counts = cuda::DeviceBuffer(std::max<size_t>(n, 1) * 4);
  c.step_counts = cuda::DeviceBuffer(std::max<size_t>(n * size_t(c.kmax), 1) * 4);
  c.counts_host.alloc(n * size_t(c.kmax));
  FP4MOE_CUDA_CHECK(cudaMemset(c.counts.ptr(), 0, c.counts.bytes()));
  c.dec = cuda::DeviceBuffer((c.in_ints() + size_t(c.kmax * c.rm)) * 4);
  c.dec_host.alloc(c.in_ints() + size_t(c.kmax * c.rm));
  FP4MOE_CUDA_CHECK(cudaEventCreate(&ev_begin));
  FP4MOE_CUDA_CHECK(cudaEventCreate(&ev_end));
}

int64_t GpuRunner::num_moe_layers() const { return impl_->counters.moe_layers; }
std::vector<int32_t> GpuRunner::moe_layer_ids() const { return impl_->counters.moe_ids; }
int64_t GpuRunner::num_experts() const { return impl_->counters.experts; }
int64_t GpuRunner::routed_expert_bytes() const {
  for (const DeviceLayer& L : impl_->layers)
    if (L.moe) return int64_t(L.moe->expert_bytes());
  return 0;
}

GpuRunner::GpuRunner() : impl_(std::make_unique<Impl>()) {}
GpuRunner::~GpuRunner() = default;

std::unique_ptr<GpuRunner> GpuRunner::load(const std::string& dir, const RunnerOptions& opt) {
  FP4MOE_CHECK(opt.page_size >= 1 && (opt.page_size & (opt.page_size - 1)) == 0, "--page-size {}: a power of two",
               opt.page_size);
  FP4MOE_CHECK(opt.max_tokens >= 1 && opt.max_requests >= 1 && opt.max_context >= 1,
               "gpu runner: max tokens {}, requests {}, context {} must be >= 1", opt.max_tokens, opt.max_requests,
               opt.max_context);
  FP4MOE_CHECK(opt.mem_fraction_static > 0 && opt.mem_fraction_static < 1, "--mem-fraction-static {}: in (0, 1)",
               opt.mem_fraction_static);
  std::unique_ptr<GpuRunner> r(new GpuRunner());
  Impl& m = *r->impl_;
  m.opt = opt;
  const auto t0 = std::chrono::steady_clock::now();
  m.ck = Checkpoint::open(dir);
  m.cfg = model::parse_mla_model_config(m.ck->config_json(), m.ck->config(), dir + "/config.json");
  m.choose_kv_elem();  // before the plan: it counts the KV bytes of this element
  model::ModelWeights w = model::bind_weights(*m.ck, m.cfg);
  FP4MOE_CHECK(!opt.mtp || !w.mtp.empty(),
               "gpu runner: the MTP layer was asked for (speculative decoding's draft) and the checkpoint has none "
               "(model.layers.{}.*; num_nextn_predict_layers {})",
               m.cfg.num_layers, m.cfg.num_nextn_predict_layers);
  // The MTP layer's BF16 routed experts (NVIDIA's NVFP4 checkpoints) to NVFP4 on the host, so
  // that they take the FP4 grouped GEMM; the plan below counts the quantized bytes.
  int64_t mtp_saved_bytes = 0;
  if (opt.mtp && opt.quantize_mtp_experts && w.mtp[0].layer.is_moe && !w.mtp[0].layer.moe.w13.is_fp4()) {
    const MoeLayerWeights& e = w.mtp[0].layer.moe;
    const int64_t bf16_bytes = int64_t(e.w13.num_experts) * int64_t(e.w13.weight_bytes_per_expert() + e.w2.weight_bytes_per_expert());
    const auto q0 = std::chrono::steady_clock::now();
    const int64_t n = model::quantize_mtp_experts(w, default_num_threads());
    const int64_t fp4_bytes = int64_t(e.w13.num_experts) * int64_t(e.w13.weight_bytes_per_expert() + e.w2.weight_bytes_per_expert());
    mtp_saved_bytes = bf16_bytes - fp4_bytes;
    m.mtp_note = fmt::format("its {} BF16 routed experts quantized to NVFP4 at load for the drafts ({:.1f} s; the "
                             "output is the target's either way; --speculative-draft-model-quantization unquant keeps "
                             "BF16)",
                             n, std::chrono::duration<double>(std::chrono::steady_clock::now() - q0).count());
  }
  FP4MOE_CHECK(m.cfg.kv_lora_rank % 32 == 0 && m.cfg.kv_lora_rank <= 1024 && m.cfg.qk_rope_dim <= 128,
               "gpu runner: kv_lora_rank {} (a multiple of 32, <= 1024) and qk_rope_head_dim {} (<= 128)",
               m.cfg.kv_lora_rank, m.cfg.qk_rope_dim);
  FP4MOE_CHECK(!m.cfg.has_indexer() || m.cfg.index_topk <= 4096, "gpu runner: index_topk {} > 4096",
               m.cfg.index_topk);
  size_t total = 0, weight_estimate = 0;  // the progress bar's total; the weights the runner uploads
  const int64_t ck_layers = m.cfg.num_layers;
  for (const auto& f : m.ck->files())
    for (const TensorInfo& t : f->tensors()) {
      total += t.nbytes();
      int64_t l = -1;  // MTP layers (past num_layers) are loaded with RunnerOptions::mtp only (the first)
      if (std::sscanf(t.name.c_str(), "model.layers.%" SCNd64 ".", &l) != 1 || l < ck_layers ||
          (opt.mtp && l == ck_layers))
        weight_estimate += t.nbytes();
    }
  const size_t extra = m.replicate_layers();
  total += extra;
  weight_estimate += extra;
  weight_estimate -= size_t(mtp_saved_bytes);  // the MTP experts' BF16 bytes counted above, now NVFP4
  // The plan before any device allocation: the weights as the checkpoint stores them, the
  // workspace from the dims (the MoE scratch estimated), the graphs, the smallest KV pool.
  size_t free0 = 0, total0 = 0;
  FP4MOE_CUDA_CHECK(cudaMemGetInfo(&free0, &total0));
  m.start_in_use = int64_t(total0 - free0);
  m.plan_in = m.plan_input(w, int64_t(total0));
  {
    RunnerPlanInput in = m.plan_in;
    // + the load's own overheads beyond the tensors (kernel modules, cuBLAS, attention
    // workspaces, allocation rounding): 0.5 GB + 1 % of the weights, re-planned when measured
    in.in_use_bytes = m.start_in_use + (int64_t(512) << 20) + int64_t(weight_estimate / 100);
    in.weight_bytes = int64_t(weight_estimate);
    m.plan = plan_runner_memory(in);
    FP4MOE_CHECK(m.plan.ok, "{}", m.plan.error);
  }
  m.opt.max_tokens = m.plan.max_tokens;  // lowered to fit where opt.min_tokens allows
  m.logits_rows = m.plan.logits_rows;
  m.score_rows = m.plan.score_rows;
  try {
    FP4MOE_CUDA_CHECK(cudaStreamCreateWithFlags(&m.stream, cudaStreamNonBlocking));
    {
      m.phase = "uploading the weights";
      Loader ld(opt.quiet ? 0 : total);
      m.load_weights(w, ld);
      m.description = fmt::format("gpu runner: {} ({}), {} layers{}{}, hidden {}, vocab {}; {}; uploaded {}", dir,
                                  m.cfg.architecture, m.cfg.num_layers,
                                  m.cfg.num_layers > ck_layers
                                      ? fmt::format(" ({} in the checkpoint, MoE layers copied)", ck_layers)
                                      : std::string(),
                                  m.mtp ? fmt::format(" + the MTP layer ({:.3f} GB, {}{})", double(m.mtp->bytes) / 1e9,
                                                      m.mtp->block.is_moe ? "MoE" : "dense",
                                                      m.mtp_note.empty() ? std::string() : "; " + m.mtp_note)
                                        : std::string(),
                                  m.cfg.hidden, m.cfg.vocab, w.summary, ld.summary());
    }
    m.phase = "reserving the attention kernels' workspaces";
    m.choose_attention();
    m.phase = "planning the workspace";
    m.plan_memory();
    m.phase = "allocating the step counters";
    m.plan_counters();
    m.phase = "allocating the device sampling buffers";
    m.plan_sampling();
    if (!opt.quiet) fmt::print(stderr, "{}\n{}\n{}\n", m.description, m.attention_line, m.plan_line);
    const int64_t gmax = opt.cuda_graph_max_bs < 0 ? opt.max_requests : opt.cuda_graph_max_bs;
    m.phase = "capturing the CUDA graphs";
    if (gmax > 0) m.capture_graphs();
    if (!opt.quiet && !m.graph_line.empty()) fmt::print(stderr, "{}\n", m.graph_line);
  } catch (const cuda::OutOfMemory&) {
    m.rethrow_out_of_memory(m.phase);
  }
  log_debug("gpu runner start-up {:.1f} s",
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return r;
}

void GpuRunner::Impl::rethrow_out_of_memory(const std::string& doing) const {
  (void)cudaGetLastError();  // clear it: the runtime stays usable after a failed cudaMalloc
  size_t free_b = 0, total_b = 0;
  cudaMemGetInfo(&free_b, &total_b);
  throw Error(fmt::format(
      "memory plan: the device ran out of memory while {} although the plan fit ({:.2f} GB in use now of {:.2f} GB, "
      "{:.2f} GB before the load; the plan: {}): another process may be using the device; lower "
      "--mem-fraction-static, --context-length, --max-running-requests or {}",
      doing, double(total_b - free_b) / 1e9, double(total_b) / 1e9, double(start_in_use) / 1e9,
      plan.ok ? plan.describe() : std::string("none yet"), opt.tokens_flag));
}

const model::MlaModelConfig& GpuRunner::config() const { return impl_->cfg; }
const std::string& GpuRunner::description() const { return impl_->description; }
const std::string& GpuRunner::plan_line() const { return impl_->plan_line; }
const std::string& GpuRunner::graph_line() const { return impl_->graph_line; }
const std::string& GpuRunner::attention_line() const { return impl_->attention_line; }
bool GpuRunner::fast_attention() const { return impl_->mla_fast != nullptr; }
bool GpuRunner::has_mtp() const { return impl_->mtp != nullptr; }
int64_t GpuRunner::mtp_weight_bytes() const {
  const Impl& m = *impl_;
  return m.mtp ? m.mtp->bytes + (m.mtp->head ? 0 : int64_t(m.lm_head.bytes())) : 0;
}
int64_t GpuRunner::mtp_kv_bytes_per_token() const {
  const Impl& m = *impl_;
  if (!m.mtp) return 0;
  const KvElem e = m.kv_fp8 ? KvElem::FP8_E4M3 : KvElem::BF16;
  return runner_kv_bytes_per_token(1, m.mtp->block.has_indexer ? 1 : 0, m.cfg.kv_lora_rank, m.cfg.qk_rope_dim,
                                   m.cfg.index_head_dim, e, e);
}
int64_t GpuRunner::target_weight_bytes() const {
  return impl_->weight_bytes - (impl_->mtp ? impl_->mtp->bytes : 0);
}
int64_t GpuRunner::target_kv_bytes_per_token() const { return impl_->kv_per_token - mtp_kv_bytes_per_token(); }
const RunnerOptions& GpuRunner::options() const { return impl_->opt; }
const RunnerStats& GpuRunner::stats() const { return impl_->stats; }
int64_t GpuRunner::num_pages() const { return impl_->num_pages; }
int64_t GpuRunner::page_size() const { return impl_->opt.page_size; }
int64_t GpuRunner::kv_bytes_per_token() const { return impl_->kv_per_token; }
int64_t GpuRunner::weight_bytes() const { return impl_->weight_bytes; }
int64_t GpuRunner::workspace_bytes() const { return impl_->workspace_bytes; }
int64_t GpuRunner::max_logits_rows() const { return impl_->logits_rows; }
void* GpuRunner::kv_pool_data() const { return impl_->kv.ptr(); }
size_t GpuRunner::kv_pool_bytes() const { return impl_->kv.bytes(); }
int64_t GpuRunner::free_pages() const { return impl_->page_pool ? impl_->page_pool->num_free() : 0; }
void GpuRunner::set_graphs_enabled(bool on) { impl_->graphs_enabled = on; }

std::vector<int32_t> GpuRunner::alloc_pages(int64_t n) {
  std::vector<int32_t> out;
  FP4MOE_CHECK(n >= 0 && n <= free_pages() && (n == 0 || impl_->page_pool->allocate(int32_t(n), out)),
               "KV pool: {} pages wanted, {} free", n, free_pages());
  return out;
}

void GpuRunner::release_pages(const std::vector<int32_t>& pages) {
  FP4MOE_CHECK(impl_->page_pool || pages.empty(), "KV pool: {} pages released before the pool exists", pages.size());
  if (impl_->page_pool) impl_->page_pool->release(pages);  // refuses a page out of the pool or released twice
}

}  // namespace fp4moe::engine::gpu
