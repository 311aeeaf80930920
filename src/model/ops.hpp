// The ops the model's layer stack (model/layer_stack.hpp) is written against: coarse ops over
// typed views (core/tensor.hpp: dtype, shape, strides, device). An op is as coarse as the
// fastest device path needs — "MLA with its projections, the DSA indexer's scores + top-k and
// the cache write" is ONE op, "route + experts + combine + shared expert, added to the
// residual" is ONE op — so an op set loses no fusion by being driven from here.
//
// Who implements them: model/cpu_ops.* (the CPU op set: src/cpu's kernels, the reference and
// the embedded default; Model::step runs it) and backend/cuda/cuda_ops.* (the CUDA op set:
// src/cuda's launches on the runner's stream; GpuRunner's forward runs it, eager or captured).
// Both op sets live above model/ because they implement its interface (layer arrows point down).
//
// Weights are named, not passed: an op says which layer (and role) it runs and the op set
// resolves that to its own weights (host views of the mmap'd checkpoint, or device buffers).
// Workspace: an op set is bound to a caller-owned step workspace before a step (CPU: the
// Model's arena, reset per step; CUDA: the runner's planned workspace buffer) and runs every op
// of the step inside it; the activations the layer stack passes (x, h, o) come from the same
// caller. State that lives across the layers of ONE step (the RoPE tables, the last "full"
// indexer layer's top-k that "shared" layers reuse) lives in that workspace.
//
// can_implement(args) says why the op set cannot run an op as asked ("" = it can); the layer
// stack checks it before each run and throws the reason (one line) — e.g. the CUDA op set has
// no MTP layer, an op set wants its own activation dtype.
#pragma once

#include <cstdint>
#include <string>

#include "core/tensor.hpp"
#include "model/model_config.hpp"

namespace fp4moe::model {

// The stages of a step, for per-stage timing (same order as engine::gpu::StepStage).
enum class Stage : int { Embed, Attention, Indexer, Moe, Dense, LmHead, Sampling };

// Which embedding / head / norm / linear weights an op reads.
enum class Table : uint8_t { Target, Mtp };  // the target model's, or the MTP layer's (own, else the target's)
enum class NormRole : uint8_t {
  Input,          // model.layers.{l}.input_layernorm
  PostAttention,  // model.layers.{l}.post_attention_layernorm
  Final,          // model.norm
  MtpEmbed,       // the MTP layer's enorm
  MtpHidden,      // the MTP layer's hnorm
  MtpSharedHead,  // the MTP layer's shared_head.norm
};

// A decoder block's layer: `layer` indexes the op set's weights and the KV pool (the MTP
// block is layer num_layers); `mtp` says the weights are the MTP layer's.
struct LayerRef {
  int64_t layer = 0;
  bool mtp = false;
};

// x[t] = embed(tokens[t]).  tokens I32 [T]; x [T, hidden].
struct EmbedArgs {
  TensorView tokens, x;
  Table table = Table::Target;
};

// y = RMSNorm(x) · w (eps: rms_norm_eps), row by row; x / y [T, hidden] (rows may be strided).
struct RmsNormArgs {
  TensorView x, y;
  NormRole role = NormRole::Input;
  LayerRef ref;  // the block of an Input / PostAttention norm
};

// out = o_proj(MLA(h)) of one layer over the step's batch, with everything attention needs in
// one op: q / kv projections, norms, RoPE, the step's keys written to the cache, the DSA
// indexer (its keys, scores and top-k; "shared" layers reuse the last full layer's top-k of
// this step) and the attention over the cache. h, out [T, hidden].
struct AttentionArgs {
  LayerRef ref;
  IndexerKind indexer = IndexerKind::None;
  TensorView h, out;
};

// x += o (the residual add after attention); x, o [T, hidden].
struct AddArgs {
  TensorView x, o;
};

// x += FFN(h): the dense MLP (SiLU(gate)·up → down), or the MoE layer — route + experts +
// combine + shared expert — added into the residual x. o [T, hidden] is scratch the op may use.
struct FfnArgs {
  LayerRef ref;
  bool moe = false;
  TensorView h, o, x;
};

// y = linear(x) for the linears the layer stack calls by name (the MTP layer's eh_proj).
enum class LinearRole : uint8_t { MtpEhProj };
struct LinearArgs {
  LinearRole role = LinearRole::MtpEhProj;
  TensorView x, y;
};

// logits[i] = head(h[rows[i]]): rows I32 [n] (flat token indices), logits F32 [n, vocab].
// An op set may add its step epilogue here (the CUDA op set: grammar masks and the greedy argmax).
struct HeadArgs {
  TensorView h, rows, logits;
  Table table = Table::Target;
};

class Ops {
 public:
  virtual ~Ops() = default;

  virtual std::string can_implement(const EmbedArgs& a) const = 0;
  virtual std::string can_implement(const RmsNormArgs& a) const = 0;
  virtual std::string can_implement(const AttentionArgs& a) const = 0;
  virtual std::string can_implement(const AddArgs& a) const = 0;
  virtual std::string can_implement(const FfnArgs& a) const = 0;
  virtual std::string can_implement(const LinearArgs& a) const = 0;
  virtual std::string can_implement(const HeadArgs& a) const = 0;

  virtual void run(const EmbedArgs& a) = 0;
  virtual void run(const RmsNormArgs& a) = 0;
  virtual void run(const AttentionArgs& a) = 0;
  virtual void run(const AddArgs& a) = 0;
  virtual void run(const FfnArgs& a) = 0;
  virtual void run(const LinearArgs& a) = 0;
  virtual void run(const HeadArgs& a) = 0;

  // src's values as FP32 on the host (dst: src.numel() floats): hidden-state dumps, the MTP input.
  virtual void read(const TensorView& src, float* dst) = 0;
  // A stage boundary (timing; `layer` -1 outside the blocks). Default: nothing.
  virtual void mark(Stage stage, int64_t layer) {}
};

// Runs op `a` after can_implement: throws its reason (one line) when the op set cannot.
template <typename Args>
void run_op(Ops& ops, const Args& a) {
  const std::string why = ops.can_implement(a);
  FP4MOE_CHECK(why.empty(), "{}", why);
  ops.run(a);
}

}  // namespace fp4moe::model
