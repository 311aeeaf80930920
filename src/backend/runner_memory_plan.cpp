#include "backend/runner_memory_plan.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.hpp"

namespace fp4moe::engine {
namespace {

constexpr int64_t align256(int64_t b) { return (std::max<int64_t>(b, 1) + 255) / 256 * 256; }
std::string gb(int64_t b) { return fmt::format("{:.2f} GB", double(b) / 1e9); }

// Estimates of the device-side sizes where the caller gives none (the CPU tests; the runner's
// first plan, before the MoE layers exist). Each a little above what cuda/ lays out.
int64_t moe_estimate(const RunnerDims& d, int64_t T) {
  if (!d.moe) return 0;
  const int64_t E = d.experts, k = d.top_k, R = std::max(d.moe_rows_per_token, k), P = T * R, H = d.hidden,
                I = d.moe_inter;
  return align256(T * E * 4 + (int64_t(1) << 20)) + align256(T * E * 4) + 2 * align256(T * k * 4) +
         align256((E + R + 1) * 4) + 3 * align256(P * 4) + align256(P * 16 + E * 64) + align256(P * H * 2) +
         align256(P * I * 2) + align256(P * H * 2) + (int64_t(32) << 20);  // + the GEMMs' workspace
}
int64_t topk_estimate(int64_t rows, int64_t ctx) {
  if (ctx <= 16384) return 0;
  return align256(rows * 64) + align256(rows * 4096 * 8) + align256(rows * ((ctx + 31) / 32) * 4);
}
int64_t sample_estimate(int64_t rows, int64_t vocab) { return rows * (vocab * 5 / 8 + 4096) + (int64_t(1) << 20); }
// The greedy argmax's split form (cuda::sampling::argmax_rows_f32_workspace_bytes(): 5,136 B,
// any rows and vocab; its launch refuses a smaller one). Zeroed once with the whole workspace.
constexpr int64_t kArgmaxWorkspaceBytes = 8192;

}  // namespace

int64_t runner_score_rows(const RunnerPlanInput& in, int64_t tokens) {
  if (!in.dims.indexer) return tokens;
  const int64_t budget = int64_t(double(in.device_bytes) * in.workspace_fraction * in.indexer_share);
  int64_t rows = budget / (std::max<int64_t>(in.max_context, 1) * 4);
  if (in.max_score_rows > 0) rows = std::min(rows, in.max_score_rows);
  rows = std::max({rows, in.min_score_rows, int64_t(1)});
  return std::min(rows, tokens);
}

int64_t ws_layout_bytes(int64_t bytes) { return align256(bytes); }

std::vector<WsBuffer> runner_workspace_buffers(const RunnerPlanInput& in, int64_t tokens, int64_t logits_rows) {
  const RunnerDims& d = in.dims;
  const int64_t T = tokens, H = d.hidden, NH = d.heads, C = d.kv_lora, Rd = d.rope, D = d.index_dim,
                HI = d.index_heads, ctx = in.max_context, L = logits_rows, maxI = d.max_inter;
  const int64_t topk = std::max<int64_t>(d.index_topk, 1), SR = runner_score_rows(in, T);
  // The BF16-experts fallback's buffers (empty without it).
  const int64_t E = d.dense_experts ? d.experts : 0, k = d.dense_experts ? d.top_k : 0,
                I = d.dense_experts ? d.moe_inter : 0;
  const int64_t S = std::max<int64_t>(in.max_requests, 1), K = std::max<int64_t>(in.max_decode_steps, 1);
  using B = WsBuf;
  std::vector<WsBuffer> w = {
      {B::X, T * H * 4}, {B::H, T * H * 2}, {B::O, T * H * 2}, {B::Of, T * H * 4},
      {B::Qa, T * std::max<int64_t>(d.q_lora, 1) * 2}, {B::Q, T * NH * d.qk_head_dim * 2}, {B::Kva, T * (C + Rd) * 2},
      {B::Ckv, T * C * 2}, {B::Ql, T * NH * C * 2}, {B::Ol, T * NH * C * 2}, {B::Qpe, d.rope_queries ? T * NH * Rd * 2 : 1},
      {B::Ov, T * NH * d.v_head * 2}, {B::Ik, T * D * 2}, {B::Iq, T * HI * D * 2}, {B::Iw16, T * HI * 2},
      {B::Iw, T * HI * 4}};
  if (d.indexer && d.fp8_index_queries) w.insert(w.end(), {{B::Iq8, T * HI * D}, {B::Iw8, T * HI * 4}});
  w.insert(w.end(),
           {{B::Scores, d.indexer ? SR * ctx * 4 : 4}, {B::ChunkQo, (in.max_requests + 2) * 4},
            {B::TopkPos, T * topk * 4}, {B::TopkSlot, T * topk * 4}, {B::G, T * maxI * 2}, {B::U, T * maxI * 2},
            {B::Hm, T * maxI * 2}, {B::Rows, L * H * 2}, {B::Logits, L * d.vocab * 4}, {B::Greedy, L * 4},
            {B::ArgmaxWs, kArgmaxWorkspaceBytes},
            {B::Rlogits, T * E * 4}, {B::Rids, T * k * 4}, {B::Rw, T * k * 4}, {B::Gu, E * T * 2 * I * 2},
            {B::Eh, E * T * I * 2}, {B::Ey, E * T * H * 4},
            {B::MoeWs, in.moe_workspace ? in.moe_workspace(T) : moe_estimate(d, T)},
            {B::RouterWs, !d.dense_experts          ? 0
                          : in.router_workspace ? in.router_workspace(T)
                                                : T * E * 4 + (int64_t(1) << 20)},
            {B::TopkWs, !d.indexer ? 0 : in.topk_workspace ? in.topk_workspace(SR, ctx) : topk_estimate(SR, ctx)},
            {B::Fp4Ws, in.fixed_workspace_bytes},
            {B::SampleWs, in.sample_workspace ? in.sample_workspace(S) : sample_estimate(S, d.vocab)},
            {B::SampleIn, in.sample_in_bytes ? in.sample_in_bytes(S) : S * 56},
            {B::SampleOut, in.sample_out_bytes ? in.sample_out_bytes(K, S) : K * S * 42 * 4},
            {B::SampleHist, S * (ctx + K) * 4},
            // grammar masks: a slot per logits row + S masks
            {B::TokenMasks, in.token_mask_bytes ? in.token_mask_bytes(L, S) : L * 4 + S * ((d.vocab + 31) / 32) * 4}});
  return w;
}

RunnerWorkspace runner_workspace(const RunnerPlanInput& in, int64_t tokens, int64_t logits_rows) {
  RunnerWorkspace w;
  for (const WsBuffer& b : runner_workspace_buffers(in, tokens, logits_rows)) {
    const int64_t bytes = ws_layout_bytes(b.bytes);
    switch (b.id) {
      case WsBuf::Iq8: case WsBuf::Iw8: case WsBuf::Scores: case WsBuf::ChunkQo: case WsBuf::TopkPos:
      case WsBuf::TopkSlot: case WsBuf::TopkWs:
        w.indexer += bytes;
        break;
      case WsBuf::Rows: case WsBuf::Logits: case WsBuf::Greedy: case WsBuf::ArgmaxWs:
        w.logits += bytes;
        break;
      case WsBuf::Rlogits: case WsBuf::Rids: case WsBuf::Rw: case WsBuf::Gu: case WsBuf::Eh: case WsBuf::Ey:
      case WsBuf::MoeWs: case WsBuf::RouterWs:
        w.moe += bytes;
        break;
      case WsBuf::Fp4Ws:
        w.fixed += bytes;
        break;
      case WsBuf::SampleWs: case WsBuf::SampleIn: case WsBuf::SampleOut: case WsBuf::SampleHist:
      case WsBuf::TokenMasks:
        w.sampling += bytes;
        break;
      default:
        w.activations += bytes;
    }
  }
  return w;
}

RunnerPlan plan_runner_memory(const RunnerPlanInput& in) {
  const RunnerDims& d = in.dims;
  FP4MOE_CHECK(in.max_tokens >= 1 && in.max_requests >= 1 && in.max_context >= 1 && in.page_size >= 1 &&
                   in.device_bytes > 0 && d.kv_bytes_per_token > 0,
               "memory plan: tokens per step {}, requests {}, context {}, page {}, device {} B must be positive",
               in.max_tokens, in.max_requests, in.max_context, in.page_size, in.device_bytes);
  for (const KvNeed& n : in.kv_needs)
    FP4MOE_CHECK(n.tokens >= 0, "memory plan: a KV need of {} tokens ({})", n.tokens, n.what);
  RunnerPlan p;
  p.workspace_budget = int64_t(double(in.device_bytes) * in.workspace_fraction);
  p.graph_bytes = in.graph_buckets * kGraphBytesPerBucket;
  const int64_t bpt = d.kv_bytes_per_token, ps = in.page_size;
  const int64_t min_ctx = in.max_total_tokens > 0 ? std::min(in.max_context, in.max_total_tokens) : in.max_context;
  p.min_kv_tokens = ((min_ctx + ps - 1) / ps + 1) * ps;  // one request at the full context + the padding page
  p.min_kv_bytes = p.min_kv_tokens * bpt;
  // The needs as pool tokens (pages + the padding page), largest first, down to the smallest pool
  // (always the last: a caller whose larger needs all fail still runs what fits one request).
  const KvNeed smallest{p.min_kv_tokens, fmt::format("one request of {} tokens", min_ctx)};
  std::vector<KvNeed> needs;
  for (const KvNeed& n : in.kv_needs) {
    const int64_t t = in.max_total_tokens > 0 ? std::min(n.tokens, in.max_total_tokens) : n.tokens;
    const int64_t pool = ((t + ps - 1) / ps + 1) * ps;
    if (pool > smallest.tokens) needs.push_back({pool, n.what});
  }
  std::stable_sort(needs.begin(), needs.end(), [](const KvNeed& a, const KvNeed& b) { return a.tokens > b.tokens; });
  needs.push_back(smallest);
  const int64_t avail = int64_t(std::floor(double(in.device_bytes) * in.mem_fraction_static)) - in.in_use_bytes;
  const std::string of = fmt::format("{} x the device's {} less {} in use", in.mem_fraction_static,
                                     gb(in.device_bytes), gb(in.in_use_bytes));
  if (in.weight_bytes > avail) {
    p.error = fmt::format("memory plan: the weights ({}) do not fit {} = {}; raise --mem-fraction-static or shard the "
                          "model over more GPUs",
                          gb(in.weight_bytes), of, gb(std::max<int64_t>(avail, 0)));
    return p;
  }
  auto rows_at = [&](int64_t T) { return in.max_logits_rows > 0 ? std::min(in.max_logits_rows, T) : T; };
  auto ws_at = [&](int64_t T) { return runner_workspace(in, T, rows_at(T)).total(); };
  // The largest T in [lo, hi] whose workspace is at most `cap` (lo - 1 when none).
  auto fit = [&](int64_t lo, int64_t hi, int64_t cap) {
    if (ws_at(lo) > cap) return lo - 1;
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo + 1) / 2;
      if (ws_at(mid) <= cap) lo = mid; else hi = mid - 1;
    }
    return lo;
  };
  // 1. The workspace budget alone: the largest T in [lo, asked] within it (T as asked where it may not shrink).
  const int64_t asked = in.max_tokens;
  const int64_t lo = in.min_tokens > 0 ? std::min(in.min_tokens, asked) : asked;
  if (ws_at(lo) > p.workspace_budget) {  // over the budget at the fewest tokens: say what to lower
    const RunnerWorkspace w = runner_workspace(in, lo, rows_at(lo));
    const int64_t any = lo > 1 ? fit(1, lo - 1, p.workspace_budget) : 0;
    p.error = fmt::format(
        "memory plan: the step workspace for {} tokens/step at {} context is {} (indexer scores {}, activations {}, "
        "MoE {}, logits {}, sampling {}), over its budget of {} ({:.0f} % of the device's {}); ",
        lo, in.max_context, gb(w.total()), gb(w.indexer), gb(w.activations), gb(w.moe), gb(w.logits), gb(w.sampling),
        gb(p.workspace_budget), 100.0 * in.workspace_fraction, gb(in.device_bytes));
    if (any >= 1 && in.min_tokens > 0)
      p.error += fmt::format("lower --max-running-requests (at most {} fit) or --context-length", any);
    else if (any >= 1)
      p.error += fmt::format("lower {} (at most {} tokens/step fit) or --context-length", in.tokens_flag, any);
    else
      p.error += "lower --context-length or --max-running-requests";
    return p;
  }
  const int64_t t_budget = ws_at(asked) <= p.workspace_budget ? asked : fit(lo, asked, p.workspace_budget);
  // 2. The KV before the workspace: the largest need that some T in [lo, t_budget] leaves room
  // for, at the largest such T.
  const int64_t beside = avail - in.weight_bytes - p.graph_bytes;  // for the workspace and the KV pool
  int64_t T = 0;
  const KvNeed* chosen = nullptr;
  for (const KvNeed& n : needs) {
    const int64_t cap = std::min(p.workspace_budget, beside - n.tokens * bpt);
    if (ws_at(lo) <= cap) {
      T = ws_at(t_budget) <= cap ? t_budget : fit(lo, t_budget, cap);
      chosen = &n;
      break;
    }
    p.kv_needs_unmet.push_back(fmt::format("{} ({} tokens)", n.what, n.tokens));
  }
  if (!chosen) {  // not even the smallest pool beside the fewest tokens per step
    const KvNeed& n = needs.back();
    p.kv_needs_unmet.clear();
    p.max_tokens = lo, p.tokens_asked = asked, p.logits_rows = rows_at(lo), p.score_rows = runner_score_rows(in, lo);
    p.ws = runner_workspace(in, lo, p.logits_rows);
    const int64_t ws = p.ws.total();
    const int64_t ctx_fit = std::max<int64_t>((beside - ws) / bpt / ps - 1, 0) * ps;
    p.error = fmt::format(
        "memory plan: weights {} + workspace {} ({} tokens/step{}) + graphs ~{} + the smallest KV pool {} ({}; {} "
        "tokens with the padding page at {} B/token) = {} > {} = {}; lower {} (about {} tokens fit){}, or raise "
        "--mem-fraction-static",
        gb(in.weight_bytes), gb(ws), lo, lo < asked ? ", the fewest" : "", gb(p.graph_bytes), gb(n.tokens * bpt),
        n.what, n.tokens, bpt, gb(in.weight_bytes + ws + p.graph_bytes + n.tokens * bpt), of, gb(avail), in.kv_flag,
        ctx_fit,
        lo < asked ? std::string(", --max-running-requests")
                   : fmt::format(", --max-running-requests or {} (a smaller workspace)", in.tokens_flag));
    return p;
  }
  p.max_tokens = T;
  p.tokens_asked = asked;
  p.tokens_lowered = T < asked;
  p.lowered_for_kv = T < t_budget;
  p.kv_need_tokens = chosen->tokens;
  p.kv_need_what = chosen->what;
  p.logits_rows = rows_at(T);
  p.score_rows = runner_score_rows(in, T);
  p.ws = runner_workspace(in, T, p.logits_rows);
  p.kv_budget_bytes = beside - p.ws.total();
  p.kv_tokens = p.kv_budget_bytes / bpt;
  if (in.max_total_tokens > 0) p.kv_tokens = std::min(p.kv_tokens, in.max_total_tokens + ps);
  p.ok = true;
  return p;
}

std::string RunnerPlan::describe() const {
  return fmt::format(
      "workspace {} of its {} budget ({} tokens/step{}, {} logits rows, indexer scores in chunks of {} rows: "
      "attention/indexer {}, activations {}, MoE {}, logits {}, sampling {}, other {}), graphs ~{} (estimate)",
      gb(ws.total()), gb(workspace_budget), max_tokens,
      !tokens_lowered  ? std::string()
      : lowered_for_kv ? fmt::format(", lowered from {} to leave the KV pool {} tokens for {}", tokens_asked,
                                     kv_need_tokens, kv_need_what)
                       : fmt::format(", lowered from {} to fit", tokens_asked),
      logits_rows, score_rows, gb(ws.indexer), gb(ws.activations), gb(ws.moe), gb(ws.logits), gb(ws.sampling), gb(ws.fixed),
      gb(graph_bytes)) +
         (kv_needs_unmet.empty()
              ? std::string()
              : fmt::format("; no tokens/step leave the KV pool room for {}", fmt::join(kv_needs_unmet, ", ")));
}

int64_t kv_tokens_for_batch(int64_t batch, int64_t tokens, int64_t page_size) {
  return batch * ((tokens + page_size - 1) / page_size) * page_size;
}

int64_t runner_kv_bytes_per_token(int64_t layers, int64_t indexer_layers, int64_t kv_lora, int64_t rope,
                                  int64_t index_dim, KvElem elem, KvElem index_elem) {
  return layers * (kv_lora + rope) * int64_t(kv_elem_size(elem)) +
         indexer_layers * index_dim * int64_t(kv_elem_size(index_elem));
}

}  // namespace fp4moe::engine
