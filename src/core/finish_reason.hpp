// Why a request stopped producing tokens: one enum for the engine (OutputEvent::reason, the
// OpenAI finish_reason), the device's multi-step bookkeeping (cuda/sampling's DecodeState::finish
// holds int32_t(FinishReason), 0 while the row runs) and its host twin. The values are fixed.
#pragma once

#include <cstdint>

namespace fp4moe {

enum class FinishReason : int32_t {
  kRunning = 0,    // not finished (a device row still decoding); never delivered to a client
  kStop = 1,       // sampled a stop / EOS id, or a stop string matched
  kLength = 2,     // max_new_tokens, or the context reached its limit
  kAbort = 3,      // cancelled, refused after admission, or a backend failure
  kNoPage = 4,     // device bookkeeping: the next position needs a page beyond those reserved (the runner's bug)
  kNoHistory = 5,  // device bookkeeping: the penalty history stride is too small (the runner's bug)
};
inline constexpr int kFinishReasons = 6;

// "running", "stop", "length", "abort", "no_page", "no_history" (the OpenAI names for the
// three a client sees).
constexpr const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kRunning: return "running";
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAbort: return "abort";
    case FinishReason::kNoPage: return "no_page";
    case FinishReason::kNoHistory: return "no_history";
  }
  return "abort";
}

}  // namespace fp4moe
