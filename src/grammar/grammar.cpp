#include "grammar/grammar.hpp"

#include "grammar/dead_ends.hpp"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <list>
#include <mutex>
#include <unordered_map>

#include <dlpack/dlpack.h>
#include <fmt/format.h>
#include <xgrammar/xgrammar.h>

namespace fp4moe::grammar {

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kJsonSchema: return "json_schema";
    case Kind::kJsonObject: return "json_object";
    case Kind::kRegex: return "regex";
    case Kind::kEbnf: return "ebnf";
    case Kind::kStructuralTag: return "structural_tag";
  }
  return "?";
}

class CompiledGrammar {
 public:
  CompiledGrammar(xgrammar::CompiledGrammar g, int32_t vocab_size, bool end_without_stop)
      : g(std::move(g)), vocab_size(vocab_size), end_without_stop(end_without_stop) {}
  xgrammar::CompiledGrammar g;
  int32_t vocab_size;
  bool end_without_stop;  // the vocabulary has no stop id: the grammar ends where its text may end
};

namespace {

// xgrammar's messages start "[hh:mm:ss] /path/file.cc:123: " and may span lines; keep the
// reason, on one line, at most 300 bytes.
std::string one_line(std::string_view what) {
  std::string s(what);
  if (!s.empty() && s[0] == '[') {
    const size_t close = s.find("] ");
    if (close != std::string::npos) s.erase(0, close + 2);
  }
  // "file.cc:123: " (a path with a line number before ": ").
  const size_t colon = s.find(": ");
  if (colon != std::string::npos) {
    const std::string_view head(s.data(), colon);
    const size_t last = head.rfind(':');
    if (last != std::string_view::npos && (head.find(".cc") != std::string_view::npos || head.find(".h") != std::string_view::npos) &&
        last + 1 < head.size() && std::all_of(head.begin() + long(last) + 1, head.end(), [](char c) { return c >= '0' && c <= '9'; }))
      s.erase(0, colon + 2);
  }
  if (s.rfind("Check failed: ", 0) == 0) {
    // "Check failed: (cond) is false: reason" -> "reason" where a reason follows.
    const size_t is_false = s.find(" is false: ");
    if (is_false != std::string::npos) s.erase(0, is_false + 11);
  }
  for (char& c : s)
    if (c == '\n' || c == '\r' || c == '\t') c = ' ';
  while (!s.empty() && s.back() == ' ') s.pop_back();
  if (s.size() > 300) s = s.substr(0, 297) + "...";
  return s.empty() ? std::string("unknown error") : s;
}

// xgrammar's escape parser (support/encoding.h) reads "\\x" with any number of hex digits and
// "\\U" with 8 into an int32 without a bound: signed overflow (UBSan, a grammar_compile fuzz
// finding). Refused here instead: a \\x escape of more than 6 hex digits, or a \\x / \\U escape
// past U+10FFFF. Escapes are looked for behind any number of backslashes, so a JSON schema's
// pattern ("\\\\x...", decoded before xgrammar reads it) is covered; a literal backslash followed
// by such digits is refused too, with the reason.
void check_hex_escapes(const std::string& text, const char* what) {
  for (size_t i = 0; i + 1 < text.size(); ++i) {
    if (text[i] == '\\' && (static_cast<unsigned char>(text[i + 1]) < 0x20 || text[i + 1] == 0x7f))
      // xgrammar's regex converter re-writes "\\<control byte>" as a \\x escape that runs into
      // the digits after it (the same overflow).
      throw GrammarError(fmt::format("the {} has a backslash before a control byte (at byte {})", what, i));
    if (text[i] != '\\' || (text[i + 1] != 'x' && text[i + 1] != 'U')) continue;
    size_t n = 0;
    while (i + 2 + n < text.size() && std::isxdigit(static_cast<unsigned char>(text[i + 2 + n])) && n < 16) ++n;
    const bool too_long = text[i + 1] == 'x' ? n > 6 : false;
    const size_t used = text[i + 1] == 'U' ? std::min<size_t>(n, 8) : n;
    uint64_t value = 0;
    for (size_t k = 0; k < used; ++k) {
      const char c = text[i + 2 + k];
      value = value * 16 + uint64_t(c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
    }
    if (too_long || value > 0x10FFFF)
      throw GrammarError(fmt::format("the {} has a \\{} escape past U+10FFFF (at byte {})", what, text[i + 1], i));
  }
}

std::string cache_key(const GrammarSpec& spec) {
  return fmt::format("{}:{}:{}", int(spec.kind), spec.strict ? 1 : 0, spec.text);
}

}  // namespace

int32_t json_nesting_depth(std::string_view text) {
  int32_t depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if (c == ']' || c == '}') {
      depth = std::max(0, depth - 1);
    }
  }
  return deepest;
}

struct Compiler::Impl {
  Impl(const Vocab& vocab, Limits limits, int threads)
      : limits(limits),
        vocab_size(vocab.vocab_size),
        end_without_stop(vocab.stop_ids.empty()),
        info(vocab.token_bytes, xgrammar::VocabType::RAW, vocab.vocab_size,
             std::vector<int32_t>(vocab.stop_ids.begin(), vocab.stop_ids.end())),
        compiler(info, threads, /*cache_enabled=*/true, int64_t(std::min<size_t>(limits.xgrammar_cache_bytes, size_t(1) << 40))) {}

  xgrammar::CompiledGrammar compile_uncached(const GrammarSpec& spec) {
    switch (spec.kind) {
      case Kind::kJsonSchema:
        // Compact: no whitespace between tokens, separators "," and ":" (output always ends).
        return compiler.CompileJSONSchema(spec.text, /*any_whitespace=*/false, std::nullopt,
                                          std::make_pair(std::string(","), std::string(":")), spec.strict);
      case Kind::kJsonObject:
        // Not xgrammar's builtin JSON grammar: its masks cost ~2.5 ms at p99 on a 150K vocab,
        // the schema form ~45 µs.
        return compiler.CompileJSONSchema(R"({"type":"object"})", false, std::nullopt,
                                          std::make_pair(std::string(","), std::string(":")), false);
      case Kind::kRegex: return compiler.CompileRegex(spec.text);
      case Kind::kEbnf: return compiler.CompileGrammar(spec.text, "root");
      case Kind::kStructuralTag: return compiler.CompileStructuralTag(spec.text);
    }
    throw GrammarError("unknown grammar kind");
  }

  Limits limits;
  int32_t vocab_size;
  bool end_without_stop;
  xgrammar::TokenizerInfo info;
  xgrammar::GrammarCompiler compiler;
  mutable std::mutex mu;
  std::list<std::pair<std::string, GrammarPtr>> lru;  // most recent first
  std::unordered_map<std::string, std::list<std::pair<std::string, GrammarPtr>>::iterator> index;
  CacheStats stats;
};

Compiler::Compiler(const Vocab& vocab, Limits limits, int threads) {
  FP4MOE_CHECK(vocab.vocab_size >= int32_t(vocab.token_bytes.size()) && vocab.vocab_size > 0,
               "grammar vocabulary: {} logits for {} tokens", vocab.vocab_size, vocab.token_bytes.size());
  try {
    impl_ = std::make_unique<Impl>(vocab, limits, std::max(1, threads));
  } catch (const std::exception& e) {
    throw Error("grammar vocabulary: " + one_line(e.what()));
  }
}

Compiler::~Compiler() = default;
const Limits& Compiler::limits() const { return impl_->limits; }
int32_t Compiler::vocab_size() const { return impl_->vocab_size; }

CacheStats Compiler::cache_stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  CacheStats s = impl_->stats;
  s.entries = impl_->lru.size();
  return s;
}

double Compiler::warm_up() {
  const auto t0 = std::chrono::steady_clock::now();
  static constexpr const char* kSchemas[] = {
      R"({"type":"object","properties":{"s":{"type":"string"},"i":{"type":"integer"},"n":{"type":"number"},)"
      R"("b":{"type":"boolean"},"z":{"type":"null"},"e":{"enum":["a","b"]},"t":{"type":"string","maxLength":64},)"
      R"("a":{"type":"array","items":{"type":"object","properties":{"k":{"type":"string"},"v":{"type":"number"}},)"
      R"("required":["k"],"additionalProperties":false}},"o":{"type":"object","additionalProperties":{"type":"string"}}},)"
      R"("required":["s","i"],"additionalProperties":false})",
      R"({"type":"array","items":{"type":"string"}})",
      // The string formats most used in tool schemas (each is a large regex of its own).
      R"({"type":"object","properties":{"e":{"type":"string","format":"email"},"d":{"type":"string","format":"date"},)"
      R"("t":{"type":"string","format":"date-time"},"u":{"type":"string","format":"uuid"},)"
      R"("r":{"type":"string","format":"uri"}},"required":["e","d","t","u","r"],"additionalProperties":false})",
  };
  for (const char* s : kSchemas) compile({Kind::kJsonSchema, s, true});
  compile({Kind::kJsonObject, "", false});
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

GrammarPtr Compiler::compile(const GrammarSpec& spec) {
  const Limits& lim = impl_->limits;
  const char* what = kind_name(spec.kind);
  if (spec.kind != Kind::kJsonObject) {
    if (spec.text.empty() && spec.kind != Kind::kRegex) throw GrammarError(fmt::format("the {} is empty", what));
    if (spec.text.size() > lim.max_text_bytes)
      throw GrammarError(fmt::format("the {} is {} bytes, over the limit of {} bytes", what, spec.text.size(),
                                     lim.max_text_bytes));
    if (spec.text.find('\0') != std::string::npos) throw GrammarError(fmt::format("the {} holds a NUL byte", what));
    check_hex_escapes(spec.text, what);
  }
  if (spec.kind == Kind::kJsonSchema) {
    const int32_t depth = json_nesting_depth(spec.text);
    if (depth > lim.max_json_depth)
      throw GrammarError(fmt::format("the json_schema nests {} levels deep, over the limit of {}", depth,
                                     lim.max_json_depth));
    check_schema_keywords(spec.text);
  }
  if (spec.kind == Kind::kStructuralTag) {
    // The schemas inside were checked one by one by its builder; the tag's own wrapping (format,
    // sequence, tags, content) adds a few levels.
    constexpr int32_t kWrapping = 8;
    const int32_t depth = json_nesting_depth(spec.text);
    if (depth > lim.max_json_depth + kWrapping)
      throw GrammarError(fmt::format("the tool schemas nest {} levels deep, over the limit of {}", depth - kWrapping,
                                     lim.max_json_depth));
  }
  const std::string key = cache_key(spec);
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    auto it = impl_->index.find(key);
    if (it != impl_->index.end()) {
      impl_->lru.splice(impl_->lru.begin(), impl_->lru, it->second);
      ++impl_->stats.hits;
      return it->second->second;
    }
    ++impl_->stats.misses;
  }
  GrammarPtr compiled;
  try {
    xgrammar::CompiledGrammar g = impl_->compile_uncached(spec);
    const size_t bytes = g.MemorySizeBytes();
    if (bytes > lim.max_compiled_bytes)
      throw GrammarError(fmt::format("the {} compiles to {} MiB, over the limit of {} MiB", what, bytes >> 20,
                                     lim.max_compiled_bytes >> 20));
    // Dead ends: a part of the grammar that text can enter but never complete (the regex
    // "a[^\s\S]", a pattern whose class is empty, an EBNF rule without a finite derivation).
    if (const auto dead = find_dead_end(g)) {
      if (dead->admits_nothing) throw GrammarError(fmt::format("the {} admits no output", what));
      throw GrammarError(fmt::format("the {} has a part that text can enter but nothing can complete (e.g. a "
                                     "character class that matches nothing): generation would be stranded there",
                                     what));
    }
    compiled = std::make_shared<const CompiledGrammar>(std::move(g), impl_->vocab_size, impl_->end_without_stop);
  } catch (const GrammarError&) {
    throw;
  } catch (const std::exception& e) {
    throw GrammarError(fmt::format("invalid {}: {}", what, one_line(e.what())));
  }
  // A grammar that admits nothing (e.g. the regex "[^\s\S]"): no token, not even a stop id, is
  // allowed at the start.
  {
    Matcher m(compiled);
    std::vector<uint32_t> mask(size_t(mask_words(impl_->vocab_size)));
    m.fill_mask(mask);
    if (std::all_of(mask.begin(), mask.end(), [](uint32_t w) { return w == 0; }))
      throw GrammarError(fmt::format("the {} admits no output with this vocabulary", what));
  }
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->index.find(key) == impl_->index.end()) {
    impl_->lru.emplace_front(key, compiled);
    impl_->index[key] = impl_->lru.begin();
    while (impl_->lru.size() > std::max<size_t>(1, lim.cache_entries)) {
      impl_->index.erase(impl_->lru.back().first);
      impl_->lru.pop_back();
    }
  }
  return compiled;
}

struct Matcher::Impl {
  explicit Impl(GrammarPtr g)
      : grammar(std::move(g)), m(grammar->g, std::nullopt, /*terminate_without_stop_token=*/grammar->end_without_stop) {}
  GrammarPtr grammar;
  xgrammar::GrammarMatcher m;
};

Matcher::Matcher(GrammarPtr grammar) {
  FP4MOE_CHECK(grammar, "a matcher without a grammar");
  impl_ = std::make_unique<Impl>(std::move(grammar));
}
Matcher::~Matcher() = default;
Matcher::Matcher(Matcher&&) noexcept = default;
Matcher& Matcher::operator=(Matcher&&) noexcept = default;

int32_t Matcher::vocab_size() const { return impl_->grammar->vocab_size; }

void Matcher::fill_mask(std::span<uint32_t> mask) {
  const int32_t words = mask_words(vocab_size());
  FP4MOE_CHECK(int64_t(mask.size()) == words, "grammar mask of {} words for {} tokens", mask.size(), vocab_size());
  if (impl_->m.IsTerminated()) {
    std::fill(mask.begin(), mask.end(), 0u);
    return;
  }
  int64_t shape[1] = {words};
  DLTensor t{};
  t.data = mask.data();
  t.device = DLDevice{kDLCPU, 0};
  t.ndim = 1;
  t.dtype = DLDataType{kDLInt, 32, 1};
  t.shape = shape;
  t.strides = nullptr;
  t.byte_offset = 0;
  if (!impl_->m.FillNextTokenBitmask(&t)) std::fill(mask.begin(), mask.end(), ~0u);
  // Ids past the vocabulary's last full word stay clear.
  if (vocab_size() % 32) mask[size_t(words - 1)] &= (1u << (vocab_size() % 32)) - 1u;
}

bool Matcher::accept(int32_t token) {
  if (token < 0 || token >= vocab_size() || impl_->m.IsTerminated()) return false;
  return impl_->m.AcceptToken(token);
}

bool Matcher::terminated() const { return impl_->m.IsTerminated(); }

void Matcher::rollback(int32_t n) {
  if (n > 0) impl_->m.Rollback(n);
}

}  // namespace fp4moe::grammar
