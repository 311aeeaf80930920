// `bench attention`: decode, batch x context: dense MLA, and the sparse path (indexer, top-k, sparse MLA).
#include "cli/bench_attention.hpp"

#if defined(FP4MOE_HAVE_CUDA)
namespace fp4moe::cli::attn_bench {

void Bench::decode(KvElem elem) {
  const int maxB = *std::max_element(opt_.batches.begin(), opt_.batches.end());
  const int maxL = *std::max_element(opt_.contexts.begin(), opt_.contexts.end());
  const int64_t ps = opt_.page_size, ppr = (maxL + ps - 1) / ps, pages = int64_t(maxB) * ppr + 1;
  Pool pool(elem, ps, pages, s_);
  std::vector<int32_t> perm(static_cast<size_t>(pages));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937_64(7));
  const std::string kv = std::string(kv_elem_name(elem));
  const double eb = double(kv_elem_size(elem));
  at::MlaSm90 dense({kHeads, kSmScale, elem}), sparse({kHeads, kSmScale, elem});
  // The runner's decode path: the schedule built on the device (run_device), for both kernels.
  at::MlaSm90 dense_dev({kHeads, kSmScale, elem});
  dense_dev.reserve_device(maxB);
  const at::MlaDesc desc{kHeads, kSmScale, elem};
  const std::string ours_why = at::mla_decode_can_implement(desc);
  std::unique_ptr<at::MlaDecodeMma> ours_dense, ours_sparse, ours_wg, ours_ws, ours_wsq;
  if (ours_why.empty()) {
    ours_dense = std::make_unique<at::MlaDecodeMma>(desc);
    ours_sparse = std::make_unique<at::MlaDecodeMma>(desc);
    ours_dense->reserve_device(maxB);
  } else {
    std::printf("| decode | %s | ours-mma | skipped: %s\n", kv.c_str(), ours_why.c_str());
  }
  // The wgmma variant (sm_90): beside ours-mma, dense and sparse, host-planned and run_device.
  if (const std::string why = at::mla_decode_can_implement(desc, at::DecodeMath::kWgmma); why.empty()) {
    ours_wg = std::make_unique<at::MlaDecodeMma>(desc, at::DecodeMath::kWgmma);
    ours_wg->reserve_device(maxB);
  } else {
    std::printf("| decode | %s | ours-wgmma | skipped: %s\n", kv.c_str(), why.c_str());
  }
  // The warp-specialized wgmma variant (sm_90, FP8 cache only): its rows say how far it is from
  // the FP8 bytes' copy floor and from flashinfer-sm90's FP8 path.
  if (elem == KvElem::FP8_E4M3) {
    if (const std::string why = at::mla_decode_can_implement(desc, at::DecodeMath::kWgmmaWs); why.empty()) {
      ours_ws = std::make_unique<at::MlaDecodeMma>(desc, at::DecodeMath::kWgmmaWs);
      ours_ws->reserve_device(maxB);
      ours_wsq = std::make_unique<at::MlaDecodeMma>(desc, at::DecodeMath::kWgmmaWsQRegs);  // Q in registers
      ours_wsq->reserve_device(maxB);
    } else {
      std::printf("| decode | %s | ours-wgmma-ws | skipped: %s\n", kv.c_str(), why.c_str());
    }
  }
  // Queries / outputs / indexer buffers for the largest batch.
  DeviceMem q_nope(size_t(maxB) * kHeads * at::kCkvDim * 2), q_pe(size_t(maxB) * kHeads * at::kKpeDim * 2),
      out(size_t(maxB) * kHeads * at::kCkvDim * 2), qi(size_t(maxB) * at::kIndexHeads * at::kIndexDim * 2),
      qi8(size_t(maxB) * at::kIndexHeads * at::kIndexDim), w(size_t(maxB) * at::kIndexHeads * 4),
      w8(size_t(maxB) * at::kIndexHeads * 4), scores(size_t(maxB) * size_t(maxL) * 4),
      sel_pos(size_t(maxB) * size_t(opt_.top_k) * 4), sel_slot(size_t(maxB) * size_t(opt_.top_k) * 4);
  const size_t topk_ws_bytes = ix::top_k_workspace_bytes(maxB, maxL);  // any slice_keys ("ours-radix-wide")
  DeviceMem topk_ws(topk_ws_bytes), topk_counts(size_t(maxB) * 4);
  FP4MOE_CUDA_CHECK(cudaMemsetAsync(topk_ws.ptr(), 0, topk_ws_bytes, s_));  // once: the kernels leave it zeroed
  bench::fill_random_bf16(q_nope.ptr(), size_t(maxB) * kHeads * at::kCkvDim, 31, 0.5f, s_);
  bench::fill_random_bf16(q_pe.ptr(), size_t(maxB) * kHeads * at::kKpeDim, 32, 0.5f, s_);
  bench::fill_random_bf16(qi.ptr(), size_t(maxB) * at::kIndexHeads * at::kIndexDim, 33, 1.0f, s_);
  bench::fill_random_f32(w.as<float>(), size_t(maxB) * at::kIndexHeads, 34, -0.2f, 0.5f, s_);
  // One of our kernels, host-planned by `plan` and run with `args`, as a row beside FlashInfer's `fi`
  // (the same stage, bytes and floor); returns its time.
  auto ours_row = [&](const Row& fi, const std::string& path, at::MlaDecodeMma& k, const std::function<void()>& plan,
                      const at::MlaRunArgs& args) {
    plan();
    Row ro = fi;
    ro.path = path;
    ro.us = time_us([&] { k.run(args, s_); });
    ro.note = fmt::format("{:.2f}x flashinfer's time ({} items, {} split)", ro.us / fi.us, k.planned_items(),
                          k.planned_partials());
    report(ro);
    return ro.us;
  };
  for (int B : opt_.batches)
    for (int L : opt_.contexts) guard(fmt::format("decode {} B {} ctx {}", kv, B, L), [&] {
      const HostBatch hb = make_batch(B, L, 1, perm, ps);
      DevBatch db(hb, s_);
      const KvLayerView layer = pool.view();
      dense.plan(hb.view(), ps, pages, s_);
      at::MlaRunArgs a{q_nope.ptr(), q_pe.ptr(), layer, db.v.page_indices, out.ptr(), nullptr};
      const double q_bytes = double(B) * kHeads * (at::kCkvDim + at::kKpeDim + at::kCkvDim) * 2;
      Row r{"decode", kv, "flashinfer-sm90", B, L};
      r.bytes = double(B) * L * (at::kCkvDim + at::kKpeDim) * eb + q_bytes;
      r.flops = 2.0 * B * kHeads * double(L) * (at::kCkvDim + at::kKpeDim + at::kCkvDim);
      r.us = time_us([&] { dense.run(a, s_); });
      r.floor_us = copy_floor_us(r.bytes);
      report(r);
      // The floor kernel at this size: one launch that reads the same latents and queries and
      // writes the output, under the same timer (what the copy bandwidth buys at these bytes).
      Row rm = r;
      rm.path = "floor-move";
      rm.flops = 0;
      const size_t q_nope_bytes = size_t(B) * kHeads * at::kCkvDim * 2;
      rm.us = time_us([&] {
        bench::move_bytes({{pool.ckv->ptr(), size_t(double(B) * L * at::kCkvDim * eb)},
                           {pool.kpe->ptr(), size_t(double(B) * L * at::kKpeDim * eb)},
                           {q_nope.ptr(), q_nope_bytes},
                           {q_pe.ptr(), size_t(B) * kHeads * at::kKpeDim * 2}},
                          out.ptr(), q_nope_bytes, s_);
      });
      rm.note = fmt::format("one launch moving the same bytes; flashinfer takes {:.2f}x its time", r.us / rm.us);
      report(rm);
      // The same latents read through the batch's page table (the cache's scattered pages).
      Row rp = rm;
      rp.path = "floor-gather";
      rp.bytes = double(B) * L * (at::kCkvDim + at::kKpeDim) * eb;
      rp.floor_us = copy_floor_us(rp.bytes);
      const int64_t n_pages = int64_t(B) * ((L + ps - 1) / ps);
      rp.us = time_us([&] {
        bench::gather_pages({{pool.ckv->ptr(), size_t(double(ps) * at::kCkvDim * eb)},
                             {pool.kpe->ptr(), size_t(double(ps) * at::kKpeDim * eb)}},
                            db.v.page_indices, n_pages, s_);
      });
      rp.note = fmt::format("the latents alone through the page table ({} pages of {}); {:.2f}x floor-move's time",
                            n_pages, ps, rp.us / rm.us);
      report(rp);
      if (ours_dense) ours_row(r, "ours-mma", *ours_dense, [&] { ours_dense->plan(hb.view(), ps, pages, s_); }, a);
      // run_device: the schedule kernel + the attention kernel, as the runner's decode graphs run them.
      at::MlaDeviceRows rows;
      rows.tokens = B;
      rows.max_keys = L;
      rows.kv_len = db.v.kv_len;
      rows.page_indptr = db.v.page_indptr;
      rows.page_size = ps;
      // A run_device row beside `planned` (FlashInfer's host-planned row of the same stage).
      auto dev_row = [&](const Row& planned, const std::string& impl, const std::function<void()>& fn,
                         const std::string& note) {
        Row rd = planned;
        rd.path = impl;
        rd.us = time_us(fn);
        rd.note = fmt::format("{:.2f}x flashinfer's planned time{}", rd.us / planned.us, note);
        report(rd);
      };
      dev_row(r, "flashinfer-sm90-dev", [&] { dense_dev.run_device(a, rows, s_); },
              fmt::format("; {} splits per row", dense_dev.device_splits(B, L)));
      // Forced split counts beside the rule's (MlaDeviceRows::splits), where a batch cannot fill
      // the GPU by rows: fewer splits write fewer partial rows for the merge, more use more SMs.
      if (elem == KvElem::BF16 && B <= 16 && L >= 8192) {
        const int rule = dense_dev.device_splits(B, L), sms = int(cuda::current_device().sm_count);
        for (const int sp : {2, 4, 6, 8, 12, 16}) {
          if (sp == rule || B * sp > 2 * sms) continue;
          at::MlaDeviceRows forced = rows;
          forced.splits = sp;
          dev_row(r, fmt::format("flashinfer-sm90-dev-s{}", sp), [&] { dense_dev.run_device(a, forced, s_); },
                  fmt::format("; {} splits per row (forced; the rule's {})", sp, rule));
        }
      }
      if (ours_dense)
        dev_row(r, "ours-mma-dev", [&] { ours_dense->run_device(a, rows, s_); },
                fmt::format("; {} splits per row", ours_dense->device_splits(B, L)));
      if (ours_wg) {
        ours_row(r, "ours-wgmma", *ours_wg, [&] { ours_wg->plan(hb.view(), ps, pages, s_); }, a);
        dev_row(r, "ours-wgmma-dev", [&] { ours_wg->run_device(a, rows, s_); },
                fmt::format("; {} splits per row", ours_wg->device_splits(B, L)));
      }
      if (ours_ws) {
        ours_row(r, "ours-wgmma-ws", *ours_ws, [&] { ours_ws->plan(hb.view(), ps, pages, s_); }, a);
        dev_row(r, "ours-wgmma-ws-dev", [&] { ours_ws->run_device(a, rows, s_); },
                fmt::format("; {} splits per row", ours_ws->device_splits(B, L)));
        ours_row(r, "ours-wgmma-ws-qreg", *ours_wsq, [&] { ours_wsq->plan(hb.view(), ps, pages, s_); }, a);
        dev_row(r, "ours-wgmma-ws-qreg-dev", [&] { ours_wsq->run_device(a, rows, s_); },
                fmt::format("; {} splits per row", ours_wsq->device_splits(B, L)));
      }
      if (!opt_.sparse || L <= opt_.top_k) return;

      // Sparse: indexer (+ FP8 query quantization) -> top-k -> sparse MLA.
      const Selection sel = make_selection(qi.ptr(), w.as<float>(), qi8.ptr(), w8.as<float>(), layer, db.v, L,
                                           scores.as<float>(), opt_.top_k, sel_pos.as<int32_t>(),
                                           sel_slot.as<int32_t>(), topk_ws, topk_ws_bytes,
                                           topk_counts.as<int32_t>());
      sparse.plan_sparse(hb.view(), opt_.top_k, s_);
      at::MlaRunArgs sp{q_nope.ptr(), q_pe.ptr(), layer, sel_slot.as<int32_t>(), out.ptr(), nullptr};
      const double key_bytes = double(B) * L * at::kIndexDim * eb;
      Row ri{"indexer", kv, "ours-mma", B, L};
      ri.bytes = key_bytes;
      ri.flops = 2.0 * B * double(L) * at::kIndexHeads * at::kIndexDim;
      ri.us = time_us([&] { sel.run_indexer(s_); });
      ri.floor_us = copy_floor_us(key_bytes);
      const int tiles = ix::index_score_tiles_per_cta(B, L, layer.index_elem);
      ri.note = fmt::format("+{:.0f} MB scores written; {} key tiles per CTA", double(B) * L * 4 / 1e6, tiles);
      report(ri);
      waves_split_row(sel, ri, tiles);
      if (elem == KvElem::BF16) fused_query_row(sel, ri);
      Row rt{"topk", kv, "ours-radix", B, L};
      rt.bytes = double(B) * L * 4;
      rt.us = time_us([&] { sel.run_topk(s_); });
      rt.floor_us = copy_floor_us(rt.bytes);
      rt.note = sample_note(sel.topk);
      report(rt);
      // The pipeline rows below take the fastest top-k measured here (every variant selects the
      // same set: indexer_test).
      ix::TopKArgs best_topk = sel.topk;
      double best_topk_us = rt.us;
      std::string best_topk_name = rt.path;
      auto consider_topk = [&](const ix::TopKArgs& a, const Row& row) {
        if (row.us < best_topk_us) best_topk = a, best_topk_us = row.us, best_topk_name = row.path;
      };
      // Wider slices for many long rows (top_k_slice_keys), beside the default 4K; same selection.
      if (const int wide = ix::top_k_slice_keys(B, L); L > 16384 && wide != 4096) {
        ix::TopKArgs wide_args = sel.topk;
        wide_args.slice_keys = wide;
        Row rw{"topk", kv, "ours-radix-wide", B, L};
        rw.bytes = rt.bytes;
        rw.us = time_us([&] { ix::top_k(wide_args, s_); });
        rw.floor_us = rt.floor_us;
        rw.note = fmt::format("{} keys per CTA; {:.2f}x ours-radix's time; {}", wide, rw.us / rt.us,
                              sample_note(wide_args));
        report(rw);
        consider_topk(wide_args, rw);
      }
      // Smaller samples for the long rows' candidate threshold (TopKArgs::sample_lines); same selection.
      for (const int lines : {64, 128}) {
        if (L <= 16384) break;
        ix::TopKArgs small = sel.topk;
        small.sample_lines = lines;
        Row rl{"topk", kv, fmt::format("ours-radix-sample{}", lines), B, L};
        rl.bytes = rt.bytes;
        rl.us = time_us([&] { ix::top_k(small, s_); });
        rl.floor_us = rt.floor_us;
        rl.note = fmt::format("{:.2f}x ours-radix's time; {}", rl.us / rt.us, sample_note(small));
        report(rl);
        consider_topk(small, rl);
      }
      // Rows of 16K-32K keys on the one-CTA path (TopKArgs::one_cta_keys 32768) beside the sampled one.
      if (L > 16384 && L <= 32768 && ix::top_k_max_one_cta_keys() >= 32768) {
        ix::TopKArgs one = sel.topk;
        one.one_cta_keys = 32768;
        Row r1{"topk", kv, "ours-radix-1cta32k", B, L};
        r1.bytes = rt.bytes;
        r1.us = time_us([&] { ix::top_k(one, s_); });
        r1.floor_us = rt.floor_us;
        r1.note = fmt::format("one CTA and one launch per row; {:.2f}x ours-radix's time", r1.us / rt.us);
        report(r1);
        consider_topk(one, r1);
      }
      flashinfer_topk_row(sel, db.v, rt, ps);
      Row rs{"sparse-mla", kv, "flashinfer-sm90-ps1", B, L};
      rs.bytes = double(B) * opt_.top_k * (at::kCkvDim + at::kKpeDim) * eb + q_bytes;
      rs.flops = 2.0 * B * kHeads * double(opt_.top_k) * (at::kCkvDim + at::kKpeDim + at::kCkvDim);
      rs.us = time_us([&] { sparse.run(sp, s_); });
      rs.floor_us = copy_floor_us(rs.bytes);
      report(rs);
      {  // the selected latents alone, read through the slot list (one-token pages)
        Row rgp = rs;
        rgp.path = "floor-gather";
        rgp.bytes = double(B) * opt_.top_k * (at::kCkvDim + at::kKpeDim) * eb;
        rgp.flops = 0;
        rgp.floor_us = copy_floor_us(rgp.bytes);
        rgp.us = time_us([&] {
          bench::gather_pages({{pool.ckv->ptr(), size_t(at::kCkvDim * eb)}, {pool.kpe->ptr(), size_t(at::kKpeDim * eb)}},
                              sel_slot.as<int32_t>(), int64_t(B) * opt_.top_k, s_);
        });
        rgp.note = fmt::format("the selected latents alone through the slot list; flashinfer takes {:.2f}x its time",
                               rs.us / rgp.us);
        report(rgp);
      }
      // The sparse attention kernels the pipeline rows choose from (the fastest host-planned one;
      // the graphs run its device-scheduled form).
      struct SparseMla {
        std::string name;
        double us;
        std::function<void()> run;
        std::function<void(const at::MlaDeviceRows&)> run_device;
      };
      std::vector<SparseMla> mlas = {{"flashinfer", rs.us, [&] { sparse.run(sp, s_); },
                                      [&](const at::MlaDeviceRows& rows) { dense_dev.run_device(sp, rows, s_); }}};
      if (ours_sparse) {
        const double us =
            ours_row(rs, "ours-mma", *ours_sparse, [&] { ours_sparse->plan_sparse(hb.view(), opt_.top_k, s_); }, sp);
        mlas.push_back({"ours-mma", us, [&] { ours_sparse->run(sp, s_); },
                        [&](const at::MlaDeviceRows& rows) { ours_dense->run_device(sp, rows, s_); }});
      }
      at::MlaDeviceRows srows;  // the runner's sparse rows: device-built schedules
      srows.tokens = B;
      srows.max_keys = std::min(L, opt_.top_k);
      srows.positions = db.v.positions;
      srows.top_k = opt_.top_k;
      dev_row(rs, "flashinfer-sm90-ps1-dev", [&] { dense_dev.run_device(sp, srows, s_); }, "");
      if (ours_dense) dev_row(rs, "ours-mma-dev", [&] { ours_dense->run_device(sp, srows, s_); }, "");
      if (ours_wg) {
        const double us = ours_row(rs, "ours-wgmma", *ours_wg, [&] { ours_wg->plan_sparse(hb.view(), opt_.top_k, s_); }, sp);
        dev_row(rs, "ours-wgmma-dev", [&] { ours_wg->run_device(sp, srows, s_); }, "");
        mlas.push_back({"ours-wgmma", us, [&] { ours_wg->run(sp, s_); },
                        [&](const at::MlaDeviceRows& rows) { ours_wg->run_device(sp, rows, s_); }});
      }
      if (ours_ws) {
        const double us =
            ours_row(rs, "ours-wgmma-ws", *ours_ws, [&] { ours_ws->plan_sparse(hb.view(), opt_.top_k, s_); }, sp);
        dev_row(rs, "ours-wgmma-ws-dev", [&] { ours_ws->run_device(sp, srows, s_); }, "");
        mlas.push_back({"ours-wgmma-ws", us, [&] { ours_ws->run(sp, s_); },
                        [&](const at::MlaDeviceRows& rows) { ours_ws->run_device(sp, rows, s_); }});
        const double usq =
            ours_row(rs, "ours-wgmma-ws-qreg", *ours_wsq, [&] { ours_wsq->plan_sparse(hb.view(), opt_.top_k, s_); }, sp);
        dev_row(rs, "ours-wgmma-ws-qreg-dev", [&] { ours_wsq->run_device(sp, srows, s_); }, "");
        mlas.push_back({"ours-wgmma-ws-qreg", usq, [&] { ours_wsq->run(sp, s_); },
                        [&](const at::MlaDeviceRows& rows) { ours_wsq->run_device(sp, rows, s_); }});
      }
      const SparseMla& mla =
          *std::min_element(mlas.begin(), mlas.end(), [](const SparseMla& a, const SparseMla& b) { return a.us < b.us; });
      Selection best = sel;
      best.topk = best_topk;
      Row rall{"sparse-decode", kv, "indexer+topk+" + mla.name, B, L};
      rall.bytes = key_bytes + rs.bytes;
      rall.us = time_us([&] {
        best.run_indexer(s_);
        best.run_topk(s_);
        mla.run();
      });
      rall.floor_us = copy_floor_us(rall.bytes);
      rall.note = fmt::format("vs dense {:.2f}x; top-k {}", r.us / rall.us, best_topk_name);
      report(rall);
      // The runner's form of the same step: the three stages in one CUDA graph (device-built MLA
      // schedule), so no launch gap between them; still cold L2 before each replay.
      Row rg = rall;
      rg.path = "graph:indexer+topk+" + mla.name + "-dev";
      const GraphTime gt = graph_time([&] {
        best.run_indexer(s_);
        best.run_topk(s_);
        mla.run_device(srows);
      });
      rg.us = gt.us;
      rg.note = fmt::format("{:.2f}x the stream-launched pipeline's time; {} launches", rg.us / rall.us, gt.launches);
      report(rg);
      // The same graph with programmatic dependent launch on our kernels (each kernel's blocks
      // launch while the one before finishes; FlashInfer's attention kernel launches plainly).
      Selection sel_pdl = best;
      sel_pdl.score.pdl = sel_pdl.topk.pdl = true;
      at::MlaDeviceRows srows_pdl = srows;
      srows_pdl.pdl = true;
      Row rpd = rg;
      rpd.path = "graph+pdl:indexer+topk+" + mla.name + "-dev";
      rpd.us = graph_time_us([&] {
        sel_pdl.run_indexer(s_);
        sel_pdl.run_topk(s_);
        mla.run_device(srows_pdl);
      });
      rpd.note = fmt::format("{:.2f}x the plain graph's time", rpd.us / rg.us);
      report(rpd);
      floor_chain_rows(rg, gt.launches, pool, key_bytes, scores.ptr(), q_nope.ptr(), q_pe.ptr(), out.ptr());
    });
}

}  // namespace fp4moe::cli::attn_bench
#endif  // FP4MOE_HAVE_CUDA
