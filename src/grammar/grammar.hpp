// Constrained decoding: a grammar (JSON schema, generic JSON object, regex, EBNF) compiled
// against the tokenizer's vocabulary, and a per-request matcher that gives the allowed-token
// bitmask of each step and advances over the sampled token. Built on xgrammar's C++ core
// (its headers stay inside grammar/*.cpp); the callers see native types only.
//
// Compilation is bounded before it starts (text size, JSON nesting depth; deeply nested
// arrays make xgrammar's compile time grow about cubically) and after (the compiled grammar's
// memory), cached (LRU keyed by kind + options + text) and reports one line on failure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.hpp"

namespace fp4moe::grammar {

enum class Kind {
  kJsonSchema,  // text: a JSON schema
  kJsonObject,  // any JSON object (text unused): compiled as the schema {"type":"object"}
  kRegex,       // text: a regex (the PCRE subset xgrammar reads)
  kEbnf,        // text: a GBNF-style EBNF grammar whose start rule is `root`
  // text: an xgrammar structural tag ({"type": "structural_tag", "format": {...}}), built by the
  // server (tool-call formats with the tools' argument schemas), never taken from a client as is.
  kStructuralTag,
};
const char* kind_name(Kind k);  // "json_schema", "json_object", "regex", "ebnf", "structural_tag"

struct GrammarSpec {
  Kind kind = Kind::kJsonSchema;
  std::string text;
  // JSON schema only: true (OpenAI's strict, the default here) allows no property or item the
  // schema does not name; false lets additionalProperties / items default to "anything".
  bool strict = true;
};

// The bounds a grammar must stay within (checked before and after compiling).
struct Limits {
  size_t max_text_bytes = 32 * 1024;             // schema / regex / EBNF text
  int32_t max_json_depth = 24;                   // nesting of [ and { in a schema's text
  size_t max_compiled_bytes = size_t(64) << 20;  // the compiled grammar's memory
  size_t cache_entries = 256;                    // compiled grammars kept (LRU)
  // xgrammar's own caches, per vocabulary (a third: the token masks of rule automata shared
  // across grammars, keyed by the automaton's hash: the string / number / integer / whitespace
  // rules every JSON schema has; two thirds: its compiled grammars by text).
  size_t xgrammar_cache_bytes = size_t(384) << 20;
};

// A grammar that cannot be compiled: the reason in one line (a 400 to the client).
class GrammarError : public Error {
 public:
  using Error::Error;
};

// The vocabulary as the grammar sees it: each token id's bytes in generated text ("" for a
// special token, which a grammar never allows), the model's logit width (>= token_bytes.size();
// ids past the tokenizer are never allowed) and the ids that end a generation (EOS): a
// grammar allows them exactly where its text may end. A vocabulary without stop ids ends a
// grammar (terminated()) with the first token after which its text may end.
struct Vocab {
  std::vector<std::string> token_bytes;
  int32_t vocab_size = 0;
  std::vector<int32_t> stop_ids;
};

class CompiledGrammar;
using GrammarPtr = std::shared_ptr<const CompiledGrammar>;

struct CacheStats {
  int64_t hits = 0;
  int64_t misses = 0;
  size_t entries = 0;
};

class Compiler {
 public:
  // threads: xgrammar's worker threads for one compile (its token-mask cache).
  explicit Compiler(const Vocab& vocab, Limits limits = {}, int threads = 2);
  ~Compiler();
  Compiler(const Compiler&) = delete;
  Compiler& operator=(const Compiler&) = delete;

  // Compiles (or finds in the cache) spec; thread-safe. Throws GrammarError with one line when
  // the text is over a limit, does not parse, uses what xgrammar does not support, or admits
  // no output at all.
  GrammarPtr compile(const GrammarSpec& spec);
  CacheStats cache_stats() const;
  // Compiles a few common JSON schemas (every JSON value type, a length-bounded string, an
  // enum, an array of objects, the string formats email / date / date-time / uuid / uri) and
  // json_object, so that their rules' token masks are cached
  // before the first request: a later schema made of such pieces compiles in a few ms instead
  // of tens. Returns the milliseconds it took (the server calls it at start; not thread-bound).
  double warm_up();
  const Limits& limits() const;
  int32_t vocab_size() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Words of a vocabulary bitmask: bit (v % 32) of word v / 32 set = token v allowed.
inline int32_t mask_words(int32_t vocab_size) { return (vocab_size + 31) / 32; }

// One request's position in its grammar. Not thread-safe (one owner: the engine's request).
class Matcher {
 public:
  explicit Matcher(GrammarPtr grammar);
  ~Matcher();
  Matcher(Matcher&&) noexcept;
  Matcher& operator=(Matcher&&) noexcept;

  int32_t vocab_size() const;
  // The tokens allowed next; mask has mask_words(vocab_size()) words.
  void fill_mask(std::span<uint32_t> mask);
  // Advances over token; false (state unchanged) when the grammar does not allow it.
  bool accept(int32_t token);
  // The grammar accepted one of its stop ids after complete text: nothing more may follow.
  bool terminated() const;
  // Undoes the last n accepted tokens.
  void rollback(int32_t n);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Refuses (GrammarError) a JSON schema that is not JSON or uses a keyword the compiled grammar
// would not honour (schema_check.cpp lists what is accepted).
void check_schema_keywords(std::string_view text);

// The deepest nesting of [ and { outside JSON strings in text (a pre-compile bound).
int32_t json_nesting_depth(std::string_view text);

}  // namespace fp4moe::grammar
