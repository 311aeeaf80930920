#include "text/pre_tokenizer.hpp"

#include <algorithm>
#include <deque>

#include "core/error.hpp"

namespace fp4moe::text {

std::string_view Normalizer::apply(std::string_view s, std::string* buffer) const {
  std::string_view cur = s;
  std::string tmp;
  for (NormalForm f : forms_) {
    if (!normalize_unicode(cur, f, tmp)) continue;
    buffer->swap(tmp);
    cur = *buffer;
  }
  return cur;
}

std::shared_ptr<const Regex> gpt2_regex() {
  static const auto re = std::make_shared<const Regex>(
      scanner_pattern(ScannerKind::Gpt2), "ByteLevel pre_tokenizer");  // GPT-2's regex
  return re;
}

void PreTokenizer::add(PreTokenizerStep step) {
  FP4MOE_CHECK(!byte_level_,
               "pre_tokenizer: a {} step after ByteLevel is not supported (ByteLevel must come last)",
               step.kind == PreTokenizerStep::Kind::Split ? "Split"
               : step.kind == PreTokenizerStep::Kind::Digits ? "Digits"
                                                             : "ByteLevel");
  if (step.kind == PreTokenizerStep::Kind::ByteLevel) {
    byte_level_ = true;
    // The byte mapping itself happens in the BPE model (it starts from bytes): a ByteLevel
    // step that neither adds a space nor splits does nothing here.
    if (!step.add_prefix_space && !step.regex) return;
  }
  steps_.push_back(std::move(step));
}

namespace {
void release_large_scratch();
}

void PreTokenizer::run(std::string_view text, FunctionRef<void(std::string_view)> emit) const {
  if (text.empty()) return;
  run_step(0, text, emit);
  release_large_scratch();
}

namespace {

struct Span {
  size_t begin, end;
  bool flag;  // pattern: is a match; after the behavior: remove
};

// The pieces of `piece` under `behavior`, from the (offsets, is_match) list that covers it
// (tokenizers' NormalizedString::split).
void apply_behavior(std::vector<Span>& m, SplitBehavior behavior, std::vector<Span>& out) {
  out.clear();
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::Isolated:
      for (const Span& s : m) out.push_back({s.begin, s.end, false});
      break;
    case SplitBehavior::Removed:
      out = m;
      break;
    case SplitBehavior::Contiguous:
      for (const Span& s : m) {
        if (s.flag == previous_match && !out.empty())
          out.back().end = s.end;
        else
          out.push_back({s.begin, s.end, false});
        previous_match = s.flag;
      }
      break;
    case SplitBehavior::MergedWithPrevious:
      for (const Span& s : m) {
        if (s.flag && !previous_match && !out.empty())
          out.back().end = s.end;
        else
          out.push_back({s.begin, s.end, false});
        previous_match = s.flag;
      }
      break;
    case SplitBehavior::MergedWithNext:
      for (size_t k = m.size(); k-- > 0;) {
        const Span& s = m[k];
        if (s.flag && !previous_match && !out.empty())
          out.back().begin = s.begin;
        else
          out.push_back({s.begin, s.end, false});
        previous_match = s.flag;
      }
      std::reverse(out.begin(), out.end());
      break;
  }
}

// Scratch vectors per step depth, reused across calls on this thread (a deque: growing it
// for a deeper step keeps the shallower vectors in place).
std::deque<std::vector<Span>>& scratch_buffers() {
  thread_local std::deque<std::vector<Span>> bufs;
  return bufs;
}

std::vector<Span>& scratch(size_t k, int which) {
  auto& bufs = scratch_buffers();
  if (bufs.size() <= 2 * k + 1) bufs.resize(2 * k + 2);
  return bufs[2 * k + size_t(which)];
}

// After a large text the vectors would keep its size on this thread for good (a 30 MB prompt
// of short words: ~150 MB each): those past 64k spans are given back.
void release_large_scratch() {
  for (auto& b : scratch_buffers())
    if (b.capacity() > (size_t(1) << 16)) std::vector<Span>().swap(b);
}

}  // namespace

void PreTokenizer::run_step(size_t k, std::string_view piece, FunctionRef<void(std::string_view)> emit) const {
  if (k == steps_.size()) {
    emit(piece);
    return;
  }
  const PreTokenizerStep& st = steps_[k];
  const auto next = [&](std::string_view sub) {
    if (!sub.empty()) run_step(k + 1, sub, emit);
  };
  std::string prefixed;
  if (st.kind == PreTokenizerStep::Kind::ByteLevel) {
    if (st.add_prefix_space && piece.front() != ' ') {
      prefixed.reserve(piece.size() + 1);
      prefixed.append(" ").append(piece);
      piece = prefixed;
    }
    if (!st.regex) return next(piece);
  }
  const bool isolated = st.behavior == SplitBehavior::Isolated || st.kind == PreTokenizerStep::Kind::ByteLevel;
  if (st.kind != PreTokenizerStep::Kind::Digits && isolated) {
    // Matches and the gaps between them, in order: stream them (inversion does not matter).
    size_t prev = 0;
    st.regex->for_each_match(piece, [&](size_t b, size_t e) {
      if (prev != b) next(piece.substr(prev, b - prev));
      next(piece.substr(b, e - b));
      prev = e;
    });
    if (prev != piece.size()) next(piece.substr(prev));
    return;
  }
  std::vector<Span>& matches = scratch(k, 0);
  matches.clear();
  if (st.kind == PreTokenizerStep::Kind::Digits) {
    size_t gap = 0;
    for (size_t i = 0; i < piece.size();) {
      const size_t b = i;
      const char32_t cp = next_code_point(piece, i);
      if (!is_numeric(cp)) continue;
      if (gap < b) matches.push_back({gap, b, false});
      matches.push_back({b, i, true});
      gap = i;
    }
    if (gap < piece.size()) matches.push_back({gap, piece.size(), false});
  } else {
    size_t prev = 0;
    st.regex->for_each_match(piece, [&](size_t b, size_t e) {
      if (prev != b) matches.push_back({prev, b, false});
      matches.push_back({b, e, true});
      prev = e;
    });
    if (prev != piece.size()) matches.push_back({prev, piece.size(), false});
    if (st.invert)
      for (Span& s : matches) s.flag = !s.flag;
  }
  const SplitBehavior behavior =
      st.kind == PreTokenizerStep::Kind::Digits
          ? (st.individual_digits ? SplitBehavior::Isolated : SplitBehavior::Contiguous)
          : st.behavior;
  std::vector<Span>& pieces = scratch(k, 1);
  apply_behavior(matches, behavior, pieces);
  for (const Span& s : pieces)
    if (!s.flag) next(piece.substr(s.begin, s.end - s.begin));
}

}  // namespace fp4moe::text
