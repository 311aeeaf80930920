#include "serve/choice_output.hpp"

#include <algorithm>

namespace fp4moe::serve {

ChoiceOutput::ChoiceOutput(const TextCodec& codec, std::vector<std::string> stops, bool skip_special)
    : codec_(codec), stops_(std::move(stops)), decoder_(codec.stream_decoder(skip_special)) {
  for (const auto& s : stops_) holdback_ = std::max(holdback_, s.size() - 1);
}

std::string ChoiceOutput::release(bool all) {
  size_t n = held_.size();
  if (!all) {
    n = held_.size() > holdback_ ? held_.size() - holdback_ : 0;
    n = utf8_complete_prefix(std::string_view(held_).substr(0, n));  // never split a character
  }
  std::string out = held_.substr(0, n);
  held_.erase(0, n);
  text_ += out;
  return out;
}

ChoiceDelta ChoiceOutput::consume(engine::OutputEvent& ev) {
  ChoiceDelta d;
  if (finished_) return d;
  for (size_t i = 0; i < ev.tokens.size() && !stop_matched_; ++i) {
    engine::GeneratedToken& tok = ev.tokens[i];
    const bool ends_on_it = ev.finished && i + 1 == ev.tokens.size() && ev.reason == engine::FinishReason::kStop &&
                            ev.matched_stop_id == tok.id;
    if (!ends_on_it) held_ += decoder_->push(tok.id);  // a stop / EOS token adds no text
    tokens_.push_back(tok);
    d.tokens.push_back(std::move(tok));
    // The earliest stop string in the held text ends the choice there.
    size_t at = std::string::npos;
    for (const auto& s : stops_) {
      const size_t p = held_.find(s);
      if (p < at) {
        at = p;
        matched_stop_ = s;
      }
    }
    if (at != std::string::npos) {
      held_.resize(at);
      stop_matched_ = true;
    }
  }
  if (ev.finished) {
    if (!stop_matched_) held_ += decoder_->flush();
    d.text = release(true);
    finished_ = true;
    d.finished = true;
    usage_ = ev.usage;
    usage_.completion_tokens = int32_t(tokens_.size());
    if (stop_matched_) {
      reason_ = engine::FinishReason::kStop;
    } else {
      reason_ = ev.reason;
      matched_id_ = ev.matched_stop_id;
      abort_message_ = ev.abort_message;
    }
  } else {
    d.text = release(stop_matched_);
  }
  return d;
}

std::string ChoiceOutput::finish_reason() const { return engine::finish_reason_name(reason_); }

nlohmann::json ChoiceOutput::matched() const {
  if (stop_matched_) return matched_stop_;
  if (matched_id_ >= 0) return matched_id_;
  return nullptr;
}

}  // namespace fp4moe::serve
