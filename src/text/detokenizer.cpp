#include "text/detokenizer.hpp"

#include "text/unicode.hpp"

namespace fp4moe::text {

std::string StreamingDetokenizer::push(int32_t id) {
  if (id < 0 || id >= tok_->vocab_size()) return {};
  if (skip_special_ && tok_->is_special(id)) return {};
  const std::string_view bytes = tok_->token_bytes(id);
  if (bytes.empty() && !tok_->id_to_token(id)) return {};  // unknown id: dropped, as decode() does
  std::string out;
  if (tok_->has_space_separator()) {  // no decoder: tokens joined by spaces, always valid UTF-8
    if (!first_) out += ' ';
    first_ = false;
    out += bytes;
    return out;
  }
  first_ = false;
  pending_ += bytes;
  size_t i = 0, run = 0;
  while (i < pending_.size()) {
    bool incomplete = false;
    const int step = utf8_step(pending_, i, &incomplete);
    if (step > 0) {
      i += size_t(step);
      continue;
    }
    if (incomplete) break;  // hold [i, end) until more bytes come
    out.append(pending_, run, i - run);
    out += "\xEF\xBF\xBD";
    i += size_t(-step);
    run = i;
  }
  out.append(pending_, run, i - run);
  pending_.erase(0, i);
  return out;
}

std::string StreamingDetokenizer::finish() {
  std::string out;
  append_lossy_utf8(out, pending_);
  pending_.clear();
  first_ = true;
  return out;
}

}  // namespace fp4moe::text
