// `bench attention`: prefill (absorbed and expanded forms, the prefill selection), the cache writes,
// and the FP8 indexer's selection against FP32.
#include "cli/bench_attention.hpp"

#if defined(FP4MOE_HAVE_CUDA)
namespace fp4moe::cli::attn_bench {

void Bench::prefill(KvElem elem) {
  const int maxN = *std::max_element(opt_.prefill.begin(), opt_.prefill.end());
  const int64_t ps = opt_.page_size, pages = (maxN + ps - 1) / ps + 1;
  Pool pool(elem, ps, pages, s_);
  std::vector<int32_t> perm(static_cast<size_t>(pages));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937_64(8));
  DeviceMem q_nope(size_t(maxN) * kHeads * at::kCkvDim * 2), q_pe(size_t(maxN) * kHeads * at::kKpeDim * 2),
      out(size_t(maxN) * kHeads * at::kCkvDim * 2);
  bench::fill_random_bf16(q_nope.ptr(), size_t(maxN) * kHeads * at::kCkvDim, 41, 0.5f, s_);
  bench::fill_random_bf16(q_pe.ptr(), size_t(maxN) * kHeads * at::kKpeDim, 42, 0.5f, s_);
  // The expanded form's inputs: q [N, 64, 256], kv_b_proj [64 * 448, 512], out [N, 64, 256].
  const size_t wb = size_t(kHeads) * (at::kQkNopeDim + at::kVDim) * at::kCkvDim;
  DeviceMem q_exp(size_t(maxN) * kHeads * at::kExpandedHeadDim * 2), kv_b(wb * 2),
      out_exp(size_t(maxN) * kHeads * at::kVDim * 2);
  bench::fill_random_bf16(q_exp.ptr(), size_t(maxN) * kHeads * at::kExpandedHeadDim, 43, 0.5f, s_);
  bench::fill_random_bf16(kv_b.ptr(), wb, 44, 0.044f, s_);
  const std::string kv = std::string(kv_elem_name(elem));
  for (int N : opt_.prefill) guard(fmt::format("prefill {} N {}", kv, N), [&] {
    // Chunk c: queries [c0, c1) at the end of a context of c1 tokens (chunked prefill).
    std::vector<std::unique_ptr<at::MlaSm90>> plans;
    std::vector<std::unique_ptr<DevBatch>> batches;
    std::vector<at::MlaRunArgs> args;
    for (int c0 = 0; c0 < N; c0 += kPrefillChunk) {
      const int c1 = std::min(N, c0 + kPrefillChunk);
      HostBatch hb = make_batch(1, c1, c1 - c0, perm, ps);
      batches.push_back(std::make_unique<DevBatch>(hb, s_));
      plans.push_back(std::make_unique<at::MlaSm90>(at::MlaDesc{kHeads, kSmScale, elem}));
      plans.back()->plan(hb.view(), ps, pages, s_);
      const size_t qoff = size_t(c0) * kHeads;
      args.push_back({q_nope.as<uint16_t>() + qoff * at::kCkvDim, q_pe.as<uint16_t>() + qoff * at::kKpeDim,
                      pool.view(), batches.back()->v.page_indices, out.as<uint16_t>() + qoff * at::kCkvDim,
                      nullptr});
    }
    Row r{"prefill", kv, "flashinfer-sm90-absorbed", 1, N};
    const double pairs = double(N) * (N + 1) / 2;  // causal (query, key) pairs
    r.flops = 2.0 * kHeads * pairs * (at::kCkvDim + at::kKpeDim + at::kCkvDim);
    r.bytes = double(N) * (at::kCkvDim + at::kKpeDim) * double(kv_elem_size(elem)) +
              double(N) * kHeads * (at::kCkvDim * 2 + at::kKpeDim) * 2;
    r.us = time_us([&] {
      for (size_t i = 0; i < plans.size(); ++i) plans[i]->run(args[i], s_);
    });
    r.floor_us = r.flops / (ceil_.bf16_tflops * 1e6);  // BF16 tensor cores either way (FP8 KV is dequantized)
    const double expanded = 2.0 * kHeads * pairs * (192 + 64 + 256);
    r.note = fmt::format("{} chunk(s); expanded-form equivalent {:.0f} TFLOP/s", plans.size(),
                         expanded / (r.us * 1e6));
    report(r);

    // Expanded form: per chunk, the context's latents expanded by kv_b_proj, then FA3.
    std::vector<std::unique_ptr<at::MlaPrefillExpandedSm90>> eplans;
    std::vector<at::MlaPrefillRunArgs> eargs;
    double gemm_flops = 0;
    for (size_t i = 0; i < batches.size(); ++i) {
      const int c0 = int(i) * kPrefillChunk, c1 = std::min(N, c0 + kPrefillChunk);
      HostBatch hb = make_batch(1, c1, c1 - c0, perm, ps);
      eplans.push_back(std::make_unique<at::MlaPrefillExpandedSm90>(kHeads, kSmScale, c1));
      eplans.back()->plan(hb.view(), ps, pages, s_);
      at::MlaPrefillRunArgs ea;
      ea.q = q_exp.as<uint16_t>() + size_t(c0) * kHeads * at::kExpandedHeadDim;
      ea.kv_b_proj = kv_b.ptr();
      ea.layer = pool.view();
      ea.page_indices = batches[i]->v.page_indices;
      ea.out = out_exp.as<uint16_t>() + size_t(c0) * kHeads * at::kVDim;
      eargs.push_back(ea);
      gemm_flops += 2.0 * c1 * at::kCkvDim * kHeads * (at::kQkNopeDim + at::kVDim);
    }
    Row e{"prefill", kv, "expanded-cublas+fa3-sm90", 1, N};
    e.flops = expanded + gemm_flops;
    e.bytes = r.bytes;
    e.us = time_us([&] {
      for (size_t i = 0; i < eplans.size(); ++i) eplans[i]->run(eargs[i], s_);
    });
    e.floor_us = e.flops / (ceil_.bf16_tflops * 1e6);
    const at::MlaPrefillChoice rule = at::choose_mla_prefill_form(N, N, elem, kHeads);
    e.note = fmt::format("vs absorbed {:.2f}x ({:.0f} % of the flops are the expansion GEMMs); rule picks {} "
                         "(est. {:.0f} / {:.0f} us absorbed / expanded), measured winner {}",
                         r.us / e.us, 100 * gemm_flops / e.flops,
                         rule.form == at::MlaPrefillForm::Expanded ? "expanded" : "absorbed", rule.absorbed_us,
                         rule.expanded_us, e.us < r.us ? "expanded" : "absorbed");
    report(e);
    if (opt_.sparse && N > opt_.top_k && N <= kPrefillChunk) prefill_selection(pool, *batches[0], N, kv, r.us);
  });
}

// The DSA selection of a fresh N-token prefill (one chunk, causal): indexer scores of every
// query against its prefix, then the top-k of each row, beside the dense prefill's time
// (`dense_us`). Floors: the scores' flops at the BF16 peak (the keys come from L2: 256 B per
// (query, key) pair, one CTA per query row); one read of the N x N / 2 scores for the top-k.
void Bench::prefill_selection(const Pool& pool, const DevBatch& db, int N, const std::string& kv, double dense_us) {
  const size_t n = size_t(N);
  DeviceMem qi(n * at::kIndexHeads * at::kIndexDim * 2), qi8(n * at::kIndexHeads * at::kIndexDim),
      w(n * at::kIndexHeads * 4), w8(n * at::kIndexHeads * 4), scores(n * n * 4), pos(n * opt_.top_k * 4), ws(1);
  bench::fill_random_bf16(qi.ptr(), n * at::kIndexHeads * at::kIndexDim, 47, 1.0f, s_);
  bench::fill_random_f32(w.as<float>(), n * at::kIndexHeads, 48, -0.5f, 1.0f, s_);
  const Selection sel = make_selection(qi.ptr(), w.as<float>(), qi8.ptr(), w8.as<float>(), pool.view(), db.v, N,
                                       scores.as<float>(), opt_.top_k, pos.as<int32_t>(), nullptr, ws, 0);
  const double pairs = double(N) * (N + 1) / 2;
  Row ri{"prefill-dsa", kv, "indexer-scores", 1, N};
  ri.flops = 2.0 * pairs * at::kIndexHeads * at::kIndexDim;
  ri.bytes = pairs * at::kIndexDim * double(kv_elem_size(pool.elem)) / 2;  // from L2, two tokens per tile
  ri.us = time_us([&] { sel.run_indexer(s_); });
  ri.floor_us = ri.flops / (ceil_.bf16_tflops * 1e6);
  ri.note = fmt::format("two query tokens per CTA; {:.2f}x the dense prefill's time; {:.1f} TB/s of keys from L2",
                        ri.us / dense_us, ri.bytes / (ri.us * 1e6));
  report(ri);
  Row r1 = ri;  // one query token per CTA (the decode layout) on the same chunk
  r1.path = "indexer-scores-1tok";
  r1.bytes = 2 * ri.bytes;
  ix::IndexerScoreArgs one = sel.score;
  one.tokens_per_cta = 1;
  r1.us = time_us([&] { sel.run_indexer_as(one, s_); });
  r1.note = fmt::format("one query token per CTA; {:.2f}x the two-token time; {:.1f} TB/s of keys from L2",
                        r1.us / ri.us, r1.bytes / (r1.us * 1e6));
  report(r1);
  Row rt{"prefill-dsa", kv, "topk", 1, N};
  rt.bytes = pairs * 4;
  rt.us = time_us([&] { sel.run_topk(s_); });
  rt.floor_us = copy_floor_us(rt.bytes);
  rt.note = fmt::format("{:.2f}x the dense prefill's time", rt.us / dense_us);
  report(rt);
}

// A step's cache writes for its new tokens (GLM-5 dims, BF16 cache): the runner's unfused
// sequence (RMSNorm + RoPE of the latent, LayerNorm + RoPE of the index key, the append: 5
// launches) against the fused pair (kv_latent_prep + index_key_prep: 2 launches). Decode batches
// (one token per request at position 4095) and one 4096-token prefill chunk. Floor: the
// projections read and the cache rows written once, at copy bandwidth.
void Bench::key_writes() {
#if defined(FP4MOE_HAVE_GPU_RUNNER)
  constexpr int kCtx = 4096, kRow = at::kCkvDim + at::kKpeDim, kRope = 64;
  for (auto [R, per] : {std::pair{1, 1}, {16, 1}, {64, 1}, {256, 1}, {1, kCtx}}) {
    const int T = R * per, ppr = kCtx / opt_.page_size;
    HostBatch hb;
    std::vector<int32_t> token_req;
    hb.qo_indptr = {0};
    hb.page_indptr = {0};
    for (int r = 0; r < R; ++r) {
      for (int p = kCtx - per; p < kCtx; ++p) hb.positions.push_back(p), token_req.push_back(r);
      hb.qo_indptr.push_back(int32_t(hb.positions.size()));
      hb.kv_len.push_back(kCtx);
      for (int i = 0; i < ppr; ++i) hb.page_indices.push_back(r * ppr + i);
      hb.page_indptr.push_back(int32_t(hb.page_indices.size()));
    }
    DevBatch db(hb, s_);
    auto dreq = upload(token_req, s_);
    Pool pool(KvElem::BF16, opt_.page_size, int64_t(R) * ppr, s_);
    const KvLayerView layer = pool.view();
    DeviceMem kva(size_t(T) * kRow * 2), ik(size_t(T) * at::kIndexDim * 2), ckv(size_t(T) * at::kCkvDim * 2),
        w(at::kCkvDim * 4), lnw(at::kIndexDim * 4), lnb(at::kIndexDim * 4), freq(kRope / 2 * 4);
    bench::fill_random_bf16(kva.ptr(), size_t(T) * kRow, 41, 1.0f, s_);
    bench::fill_random_bf16(ik.ptr(), size_t(T) * at::kIndexDim, 42, 1.0f, s_);
    bench::fill_random_f32(w.as<float>(), at::kCkvDim, 43, 0.5f, 1.5f, s_);
    bench::fill_random_f32(lnw.as<float>(), at::kIndexDim, 44, 0.5f, 1.5f, s_);
    bench::fill_random_f32(lnb.as<float>(), at::kIndexDim, 45, -0.1f, 0.1f, s_);
    bench::fill_random_f32(freq.as<float>(), kRope / 2, 46, 1e-4f, 1.0f, s_);
    const double bytes = double(T) * 2 * 2 * (kRow + at::kIndexDim);  // read + written, BF16
    Row ru{"key-writes", "bf16", "runner-unfused-5", R, per};
    ru.bytes = bytes;
    ru.floor_us = copy_floor_us(bytes);
    cuda::DeviceBatch gb;
    gb.tokens = T;
    gb.requests = R;
    gb.qo_indptr = db.v.qo_indptr;
    gb.positions = db.v.positions;
    gb.kv_len = db.v.kv_len;
    gb.page_indptr = db.v.page_indptr;
    gb.page_indices = db.v.page_indices;
    gb.token_req = dreq->as<int32_t>();
    gb.page_size = opt_.page_size;
    auto* k16 = kva.as<uint16_t>();
    auto* i16 = ik.as<uint16_t>();
    ru.us = time_us([&] {
      cuda::norm::rms_norm(k16, kRow, T, at::kCkvDim, w.as<float>(), 1e-6f, ckv.as<uint16_t>(), at::kCkvDim, s_);
      cuda::rope::rope(k16, T, 1, kRow, 0, at::kCkvDim, kRope, db.v.positions, freq.as<float>(), 1.0f, true, s_);
      cuda::norm::layer_norm(i16, T, at::kIndexDim, lnw.as<float>(), lnb.as<float>(), 1e-6f, i16, s_);
      cuda::rope::rope(i16, T, 1, at::kIndexDim, 0, 0, kRope, db.v.positions, freq.as<float>(), 1.0f, true, s_);
      at::kv_append_bf16(layer, gb, ckv.as<uint16_t>(), at::kCkvDim, k16 + at::kCkvDim, kRow, i16, s_);
    });
    ru.note = fmt::format("{} new tokens ({} per request)", T, per);
    report(ru);
    at::KvLatentPrepArgs la;
    la.kv = kva.ptr();
    la.kv_stride = kRow;
    la.norm_w = w.as<float>();
    la.inv_freq = freq.as<float>();
    la.layer = layer;
    la.batch = db.v;
    ix::IndexKeyPrepArgs ka;
    ka.k = ik.ptr();
    ka.ln_w = lnw.as<float>();
    ka.ln_b = lnb.as<float>();
    ka.rope_dim = kRope;
    ka.inv_freq = freq.as<float>();
    ka.layer = layer;
    ka.batch = db.v;
    Row rf = ru;
    rf.path = "fused-2";
    rf.us = time_us([&] {
      at::kv_latent_prep(la, s_);
      ix::index_key_prep(ka, s_);
    });
    rf.note = fmt::format("{} new tokens; {:.2f}x the unfused time", T, rf.us / ru.us);
    report(rf);
  }
#endif
}

// FP8 vs FP32 (BF16-exact) indexer selections: B rows of context L, random or model-like data.
void Bench::fp8_agreement(bool model_like, nlohmann::json& out) {
  const int B = 8, L = 32768, k = opt_.top_k;
  const int64_t ps = opt_.page_size, pages = int64_t(B) * L / ps;
  std::mt19937_64 g(model_like ? 91 : 92);
  std::normal_distribution<float> nd(0.f, 1.f);
  // Keys [B * L, 128]; model-like: LayerNorm'd with per-channel gains (a few outliers) and a
  // shared direction; queries of each head lean towards 16 "hot" keys of their row.
  std::vector<float> keys(size_t(B) * L * at::kIndexDim), q(size_t(B) * at::kIndexHeads * at::kIndexDim);
  std::vector<float> gain(at::kIndexDim, 1.f), mu(at::kIndexDim, 0.f);
  if (model_like) {
    for (int d = 0; d < at::kIndexDim; ++d) gain[size_t(d)] = 0.5f + 1.5f * float(g() % 1000) / 1000.f, mu[size_t(d)] = 0.7f * nd(g);
    for (int d = 0; d < 4; ++d) gain[size_t(d * 31)] = 6.f;
  }
  for (size_t t = 0; t < size_t(B) * L; ++t) {
    float* k_row = &keys[t * at::kIndexDim];
    double mean = 0, var = 0;
    for (int d = 0; d < at::kIndexDim; ++d) k_row[d] = nd(g) + mu[size_t(d)], mean += k_row[d];
    mean /= at::kIndexDim;
    for (int d = 0; d < at::kIndexDim; ++d) var += (k_row[d] - mean) * (k_row[d] - mean);
    const float inv = model_like ? float(1.0 / std::sqrt(var / at::kIndexDim + 1e-6)) : 1.f;
    for (int d = 0; d < at::kIndexDim; ++d)
      k_row[d] = model_like ? float((k_row[d] - mean) * inv) * gain[size_t(d)] : k_row[d];
  }
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < at::kIndexHeads; ++h) {
      float* qr = &q[(size_t(b) * at::kIndexHeads + size_t(h)) * at::kIndexDim];
      for (int d = 0; d < at::kIndexDim; ++d) qr[d] = nd(g);
      if (model_like)
        for (int i = 0; i < 16; ++i) {
          const size_t j = size_t(b) * L + g() % size_t(L);
          for (int d = 0; d < at::kIndexDim; ++d) qr[d] += 0.4f * keys[j * at::kIndexDim + size_t(d)];
        }
    }
  std::vector<uint16_t> kb(keys.size()), qb(q.size());
  float amax = 0;
  for (size_t i = 0; i < keys.size(); ++i) kb[i] = float_to_bf16(keys[i]), amax = std::max(amax, std::fabs(keys[i]));
  for (size_t i = 0; i < q.size(); ++i) qb[i] = float_to_bf16(q[i]);
  std::vector<float> wh(size_t(B) * at::kIndexHeads);
  for (auto& x : wh) x = 0.3f * nd(g) + 0.1f;

  // Identity page tables; the BF16 pool is written directly, the FP8 one by kv_append.
  HostBatch hb;
  hb.qo_indptr = {0};
  hb.page_indptr = {0};
  for (int b = 0; b < B; ++b) {
    hb.positions.push_back(L - 1);
    hb.qo_indptr.push_back(b + 1);
    hb.kv_len.push_back(L);
    for (int64_t i = 0; i < L / ps; ++i) hb.page_indices.push_back(int32_t(b * (L / ps) + i));
    hb.page_indptr.push_back(int32_t(hb.page_indices.size()));
  }
  DevBatch db(hb, s_);
  auto d_keys = upload(kb, s_);
  auto d_q = upload(qb, s_);
  auto d_w = upload(wh, s_);
  DeviceMem k8(keys.size()), dummy(size_t(B) * L * at::kCkvDim * 2), q8(q.size()), w8(wh.size() * 4),
      sc(size_t(B) * L * 4), pos32(size_t(B) * k * 4), pos8(size_t(B) * k * 4);
  // kv_append writes ckv / kpe too: one scratch array (BF16) takes both.
  const KvLayerView L8 = glm5_layer(dummy.ptr(), dummy.ptr(), k8.ptr(), pages, ps, KvElem::BF16, KvElem::FP8_E4M3, 1.f, amax / 448.f);
  {  // append all B * L keys (ckv / kpe inputs: the key bytes, reused as scratch values)
    HostBatch fb = hb;
    fb.positions.clear();
    fb.qo_indptr = {0};
    for (int b = 0; b < B; ++b) {
      for (int p = 0; p < L; ++p) fb.positions.push_back(p);
      fb.qo_indptr.push_back(int32_t(fb.positions.size()));
    }
    DevBatch dfb(fb, s_);
    DeviceMem zeros(size_t(B) * L * at::kCkvDim * 2);
    FP4MOE_CUDA_CHECK(cudaMemsetAsync(zeros.ptr(), 0, size_t(B) * L * at::kCkvDim * 2, s_));
    at::KvAppendArgs aa{zeros.ptr(), zeros.ptr(), d_keys->ptr(), L8, dfb.v};
    at::kv_append(aa, s_);
    FP4MOE_CUDA_CHECK(cudaStreamSynchronize(s_));
  }
  const KvLayerView L16 = glm5_layer(dummy.ptr(), dummy.ptr(), d_keys->ptr(), pages, ps, KvElem::BF16, KvElem::BF16, 1.f, 1.f);
  const size_t topk_ws_bytes = ix::top_k_workspace_bytes(B, L);
  DeviceMem topk_ws(topk_ws_bytes), topk_counts(size_t(B) * 4);
  FP4MOE_CUDA_CHECK(cudaMemsetAsync(topk_ws.ptr(), 0, topk_ws_bytes, s_));
  auto select = [&](const KvLayerView& layer, DeviceMem& dst) {
    const Selection sel = make_selection(d_q->ptr(), d_w->as<float>(), q8.ptr(), w8.as<float>(), layer, db.v, L,
                                         sc.as<float>(), k, dst.as<int32_t>(), nullptr, topk_ws, topk_ws_bytes,
                                         topk_counts.as<int32_t>());
    sel.run_indexer(s_);
    sel.run_topk(s_);
    return sample_note(sel.topk);
  };
  const std::string note32 = select(L16, pos32), note8 = select(L8, pos8);
  std::vector<int32_t> a(size_t(B) * k), b8(size_t(B) * k);
  FP4MOE_CUDA_CHECK(cudaMemcpyAsync(a.data(), pos32.ptr(), a.size() * 4, cudaMemcpyDeviceToHost, s_));
  FP4MOE_CUDA_CHECK(cudaMemcpyAsync(b8.data(), pos8.ptr(), b8.size() * 4, cudaMemcpyDeviceToHost, s_));
  FP4MOE_CUDA_CHECK(cudaStreamSynchronize(s_));
  double min_overlap = 1, sum = 0;
  int identical = 0;
  for (int r = 0; r < B; ++r) {
    std::set<int32_t> sa(a.begin() + r * k, a.begin() + (r + 1) * k);
    int common = 0;
    for (int i = 0; i < k; ++i) common += int(sa.count(b8[size_t(r * k + i)]));
    const double ov = double(common) / k;
    min_overlap = std::min(min_overlap, ov);
    sum += ov;
    identical += common == k;
  }
  const char* name = model_like ? "model-like" : "random";
  std::printf("| fp8-vs-fp32 selection | %s | rows %d | ctx %d | mean overlap %.2f %% | min %.2f %% | identical sets %d/%d | "
              "top-k: BF16 %s, FP8 %s |\n",
              name, B, L, 100 * sum / B, 100 * min_overlap, identical, B, note32.c_str(), note8.c_str());
  out.push_back({{"data", name}, {"rows", B}, {"ctx", L}, {"top_k", k}, {"mean_overlap", sum / B},
                 {"min_overlap", min_overlap}, {"identical_rows", identical}, {"topk_bf16", note32}, {"topk_fp8", note8}});
}

}  // namespace fp4moe::cli::attn_bench
#endif  // FP4MOE_HAVE_CUDA
