// One choice's output as the client sees it: engine tokens -> text through the streaming
// detokenizer, stop strings matched across token boundaries (text that could still become
// a stop string is held back), the stop string and stop / EOS tokens left out of the text,
// logprob entries, and the finish reason.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/request.hpp"
#include "serve/text_codec.hpp"

namespace fp4moe::serve {

struct ChoiceDelta {
  std::string text;                            // newly released text
  std::vector<engine::GeneratedToken> tokens;  // newly consumed tokens (logprobs / output ids)
  bool finished = false;                       // the choice ended with this delta
};

class ChoiceOutput {
 public:
  ChoiceOutput(const TextCodec& codec, std::vector<std::string> stops, bool skip_special);

  // Consumes one engine event. When a stop string matches, the choice's text ends before it,
  // later tokens are dropped, and stop_matched() turns true: the caller cancels the engine
  // request; the choice finishes when the engine's (abort) event for it arrives.
  ChoiceDelta consume(engine::OutputEvent& event);

  bool finished() const { return finished_; }
  bool stop_matched() const { return stop_matched_; }
  // "stop", "length" or "abort".
  std::string finish_reason() const;
  // SGLang's matched stop: the stop string, the stop / EOS token id, or null.
  nlohmann::json matched() const;
  const std::string& text() const { return text_; }
  const std::vector<engine::GeneratedToken>& tokens() const { return tokens_; }
  const engine::Usage& usage() const { return usage_; }
  const std::string& abort_message() const { return abort_message_; }

 private:
  std::string release(bool all);  // moves held text out, keeping back what could start a stop string

  const TextCodec& codec_;
  std::vector<std::string> stops_;
  size_t holdback_ = 0;  // longest stop string - 1
  std::unique_ptr<StreamDecoder> decoder_;
  std::string held_;     // decoded, not yet released
  std::string text_;     // released so far
  std::vector<engine::GeneratedToken> tokens_;
  bool finished_ = false;
  bool stop_matched_ = false;
  std::string matched_stop_;
  int32_t matched_id_ = -1;
  engine::FinishReason reason_ = engine::FinishReason::kLength;
  engine::Usage usage_;
  std::string abort_message_;
};

}  // namespace fp4moe::serve
