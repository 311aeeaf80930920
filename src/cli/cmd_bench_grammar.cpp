// fp4moe bench grammar: the host cost of constrained decoding (grammar/) on this CPU, over a
// JSON-schema tool-call workload: per request and step, the mask fill plus the accept of the
// next token (mean, p50, p99, max), and the compile time of a tool schema, cold and cached.
//
// The vocabulary: a model folder's tokenizer (--tokenizer DIR), or a file of GPT-2 byte-level
// encoded tokens, one per line (--vocab-file; --vocab-size pads the logit width, three stop
// tokens are appended). Each tool call's arguments are a fixed valid JSON text, tokenized by
// greedy longest match over the vocabulary (valid, not BPE-canonical: the grammar sees a real
// token sequence). Times are wall clock on this thread; the machine is shared: p99 includes
// the neighbours. Then tool_choice (serve/tool_choice_grammar.hpp, the glm47 format): each tool
// as a named function, and "required" over the tools it accepts, cold and cached.
#include <algorithm>
#include <chrono>
#include <fstream>
#include <string>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "cli/command.hpp"
#include "cli/text_io.hpp"
#include "grammar/grammar.hpp"
#include "serve/tool_choice_grammar.hpp"

namespace fp4moe {
namespace {

using Clock = std::chrono::steady_clock;

struct BenchGrammarArgs {
  std::string tokenizer, vocab_file;
  int32_t vocab_size = 154880;
  int instances = 60;
  int slowest = 0;
  bool mask_digest = false;
};

// GPT-2's byte-level alphabet, decoded: the byte each code point stands for.
std::unordered_map<uint32_t, uint8_t> byte_level_decoder() {
  std::vector<int> bs;
  for (int b = '!'; b <= '~'; ++b) bs.push_back(b);
  for (int b = 0xA1; b <= 0xAC; ++b) bs.push_back(b);
  for (int b = 0xAE; b <= 0xFF; ++b) bs.push_back(b);
  std::vector<int> cs = bs;
  int n = 0;
  for (int b = 0; b < 256; ++b)
    if (std::find(bs.begin(), bs.end(), b) == bs.end()) {
      bs.push_back(b);
      cs.push_back(256 + n++);
    }
  std::unordered_map<uint32_t, uint8_t> m;
  for (size_t i = 0; i < bs.size(); ++i) m[uint32_t(cs[i])] = uint8_t(bs[i]);
  return m;
}

grammar::Vocab vocab_from_file(const std::string& path, int32_t vocab_size) {
  std::ifstream f(path);
  FP4MOE_CHECK(f, "{}: cannot open", path);
  const auto dec = byte_level_decoder();
  grammar::Vocab v;
  std::string line;
  while (std::getline(f, line)) {
    std::string raw;
    for (size_t i = 0; i < line.size();) {  // UTF-8 code points -> bytes
      const uint8_t c = uint8_t(line[i]);
      const size_t len = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
      uint32_t cp = len == 1 ? c : c & (0xFF >> (len + 1));
      for (size_t k = 1; k < len && i + k < line.size(); ++k) cp = (cp << 6) | (uint8_t(line[i + k]) & 0x3F);
      i += len;
      auto it = dec.find(cp);
      FP4MOE_CHECK(it != dec.end(), "{}: code point U+{:04X} is not GPT-2 byte-level", path, cp);
      raw += char(it->second);
    }
    v.token_bytes.push_back(raw);
  }
  for (int k = 0; k < 3; ++k) {
    v.stop_ids.push_back(int32_t(v.token_bytes.size()));
    v.token_bytes.push_back("");
  }
  v.vocab_size = std::max<int32_t>(vocab_size, int32_t(v.token_bytes.size()));
  return v;
}

grammar::Vocab vocab_from_tokenizer(const std::string& dir) {
  const text::Tokenizer tok = cli::load_tokenizer(dir);
  grammar::Vocab v;
  v.vocab_size = tok.vocab_size();
  for (int32_t id = 0; id < tok.vocab_size(); ++id)
    v.token_bytes.push_back(tok.is_special(id) ? std::string() : std::string(tok.token_bytes(id)));
  v.stop_ids = tok.stop_ids();
  return v;
}

// Tool-call argument schemas and one valid arguments text each (several per schema).
struct Tool {
  std::string schema;
  std::vector<std::string> args;
};
std::vector<Tool> tools() {
  return {
      {R"J({"type":"object","properties":{"city":{"type":"string"},"unit":{"enum":["celsius","fahrenheit"]},"days":{"type":"integer","minimum":1,"maximum":14}},"required":["city","unit"],"additionalProperties":false})J",
       {R"J({"city":"San Francisco","unit":"celsius","days":3})J", R"J({"city":"Zürich","unit":"fahrenheit"})J",
        R"J({"city":"New York City, NY","unit":"celsius","days":14})J"}},
      {R"J({"type":"object","properties":{"query":{"type":"string"},"filters":{"type":"array","items":{"type":"object","properties":{"field":{"enum":["date","author","title"]},"value":{"type":"string"}},"required":["field","value"],"additionalProperties":false}},"limit":{"type":"integer"}},"required":["query"],"additionalProperties":false})J",
       {R"J({"query":"mixture of experts inference","filters":[{"field":"date","value":"2025"},{"field":"author","value":"Smith"}],"limit":10})J",
        R"J({"query":"fp4 quantization"})J"}},
      {R"J({"type":"object","properties":{"to":{"type":"array","items":{"type":"string","format":"email"},"minItems":1},"subject":{"type":"string","maxLength":120},"body":{"type":"string"},"urgent":{"type":"boolean"}},"required":["to","subject","body"],"additionalProperties":false})J",
       {R"J({"to":["alice@example.com","bob@example.org"],"subject":"Quarterly report","body":"Hi both,\nthe numbers are attached.\nThanks!","urgent":false})J"}},
      {R"J({"type":"object","properties":{"title":{"type":"string"},"start":{"type":"string","format":"date-time"},"duration_minutes":{"type":"integer","minimum":5},"attendees":{"type":"array","items":{"type":"string"},"maxItems":10},"location":{"anyOf":[{"type":"string"},{"type":"null"}]}},"required":["title","start","duration_minutes"],"additionalProperties":false})J",
       {R"J({"title":"Design review","start":"2026-03-14T15:00:00Z","duration_minutes":45,"attendees":["Ana","Bo"],"location":null})J"}},
      {R"J({"type":"object","properties":{"expression":{"type":"string"},"precision":{"type":"integer","minimum":0,"maximum":20},"variables":{"type":"object","additionalProperties":{"type":"number"}}},"required":["expression"],"additionalProperties":false})J",
       {R"J({"expression":"sqrt(x^2 + y^2)","precision":6,"variables":{"x":3.5,"y":-4.25}})J"}},
  };
}

// Greedy longest match over the non-special tokens.
struct Greedy {
  std::unordered_map<std::string, int32_t> ids;
  size_t longest = 0;
  explicit Greedy(const grammar::Vocab& v) {
    for (int32_t i = 0; i < int32_t(v.token_bytes.size()); ++i)
      if (!v.token_bytes[size_t(i)].empty() && !ids.count(v.token_bytes[size_t(i)])) {
        ids[v.token_bytes[size_t(i)]] = i;
        longest = std::max(longest, v.token_bytes[size_t(i)].size());
      }
  }
  std::vector<int32_t> operator()(const std::string& s) const {
    std::vector<int32_t> out;
    for (size_t p = 0; p < s.size();) {
      size_t len = std::min(longest, s.size() - p);
      for (; len > 0; --len) {
        auto it = ids.find(s.substr(p, len));
        if (it != ids.end()) {
          out.push_back(it->second);
          p += len;
          break;
        }
      }
      FP4MOE_CHECK(len > 0, "the vocabulary cannot spell byte {:#04x}", uint8_t(s[p]));
    }
    return out;
  }
};

std::string stats(std::vector<double> v) {
  if (v.empty()) return "n=0";
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  return fmt::format("n={} mean={:.2f} p50={:.2f} p99={:.2f} max={:.2f} µs", v.size(), sum / double(v.size()),
                     v[v.size() / 2], v[std::min(v.size() - 1, size_t(double(v.size()) * 0.99))], v.back());
}

double us_since(Clock::time_point t0) { return std::chrono::duration<double, std::micro>(Clock::now() - t0).count(); }

int run_bench_grammar(const BenchGrammarArgs& a) {
  FP4MOE_CHECK(a.tokenizer.empty() != a.vocab_file.empty(), "give one of --tokenizer DIR and --vocab-file FILE");
  auto t0 = Clock::now();
  const grammar::Vocab vocab = a.tokenizer.empty() ? vocab_from_file(a.vocab_file, a.vocab_size)
                                                   : vocab_from_tokenizer(a.tokenizer);
  grammar::Compiler compiler(vocab);
  fmt::print("vocabulary: {} tokens, {} logits, {} stop ids; compiler set-up {:.1f} ms\n", vocab.token_bytes.size(),
             vocab.vocab_size, vocab.stop_ids.size(), us_since(t0) / 1e3);
  const Greedy greedy(vocab);
  const std::vector<Tool> tl = tools();

  // Compile: each schema cold — first on a fresh compiler (the first schema then pays for the
  // rule masks every schema shares), then on one warmed up as the server does at start — then
  // cached.
  std::vector<double> cold, cached;
  std::vector<grammar::GrammarPtr> compiled;
  for (const Tool& t : tl) {
    t0 = Clock::now();
    compiled.push_back(compiler.compile({grammar::Kind::kJsonSchema, t.schema, true}));
    cold.push_back(us_since(t0) / 1e3);
  }
  for (const Tool& t : tl) {
    t0 = Clock::now();
    compiler.compile({grammar::Kind::kJsonSchema, t.schema, true});
    cached.push_back(us_since(t0));
  }
  std::string each;
  for (double ms : cold) each += fmt::format(" {:.1f}", ms);
  fmt::print("compile, tool schema, cold on a fresh compiler, ms:{}; cached: {}\n", each, stats(cached));
  {
    grammar::Compiler warm(vocab);
    const double warm_ms = warm.warm_up();
    std::string warm_each;
    for (const Tool& t : tl) {
      t0 = Clock::now();
      warm.compile({grammar::Kind::kJsonSchema, t.schema, true});
      warm_each += fmt::format(" {:.1f}", us_since(t0) / 1e3);
    }
    fmt::print("compile, tool schema, cold after the server's warm-up ({:.1f} ms), ms:{}\n", warm_ms, warm_each);
  }
  t0 = Clock::now();
  grammar::GrammarPtr object = compiler.compile({grammar::Kind::kJsonObject, "", false});
  fmt::print("compile, json_object: {:.2f} ms\n", us_since(t0) / 1e3);

  // tool_choice (glm47): each tool named (cold), then "required" over the accepted ones.
  {
    nlohmann::ordered_json all = nlohmann::ordered_json::array();
    for (size_t i = 0; i < tl.size(); ++i)
      all.push_back({{"type", "function"},
                     {"function", {{"name", fmt::format("tool_{}", i)}, {"parameters", nlohmann::ordered_json::parse(tl[i].schema)}}}});
    nlohmann::ordered_json accepted = nlohmann::ordered_json::array();
    std::string named;
    for (size_t i = 0; i < tl.size(); ++i) {
      serve::ToolChoiceGrammarRequest q;
      q.tools = &all;
      q.named = fmt::format("tool_{}", i);
      auto spec = serve::tool_choice_grammar(q);
      if (auto* e = std::get_if<serve::FieldError>(&spec)) {
        named += fmt::format(" [refused: {}]", e->param);
        continue;
      }
      accepted.push_back(all[i]);
      t0 = Clock::now();
      compiler.compile(std::get<grammar::GrammarSpec>(spec));
      named += fmt::format(" {:.1f}", us_since(t0) / 1e3);
    }
    fmt::print("compile, tool_choice named (glm47), cold (this compiler has compiled the schemas above), ms:{}\n", named);
    serve::ToolChoiceGrammarRequest q;
    q.tools = &accepted;
    const auto spec = std::get<grammar::GrammarSpec>(serve::tool_choice_grammar(q));
    t0 = Clock::now();
    compiler.compile(spec);
    const double cold_ms = us_since(t0) / 1e3;
    t0 = Clock::now();
    compiler.compile(spec);
    fmt::print("compile, tool_choice required over those {} tools (glm47): cold {:.1f} ms, cached {:.1f} µs\n",
               accepted.size(), cold_ms, us_since(t0));
  }

  // Masks: per request and step, fill + accept (the stop token at the end included).
  std::vector<double> step, fill, accept;
  struct Where {  // a step's place: tool, text, the text before it
    size_t tool;
    std::string before;
  };
  std::vector<Where> where;
  std::vector<uint32_t> mask(size_t(grammar::mask_words(vocab.vocab_size)));
  int64_t tokens = 0;
  uint64_t digest = 1469598103934665603ull;  // FNV-1a over every mask word of every step
  for (int i = 0; i < a.instances; ++i) {
    const size_t k = size_t(i) % tl.size();
    const Tool& t = tl[k];
    std::vector<int32_t> ids = greedy(t.args[size_t(i / int(tl.size())) % t.args.size()]);
    ids.push_back(vocab.stop_ids[0]);
    grammar::Matcher m(compiled[k]);
    std::string before;
    for (int32_t id : ids) {
      auto s0 = Clock::now();
      m.fill_mask(mask);
      const double f = us_since(s0);
      if (a.mask_digest)
        for (uint32_t w : mask) digest = (digest ^ w) * 1099511628211ull;
      FP4MOE_CHECK((mask[size_t(id) / 32] >> (id % 32)) & 1u, "the grammar refuses token {} of a valid instance", id);
      s0 = Clock::now();
      FP4MOE_CHECK(m.accept(id), "the matcher refuses token {}", id);
      const double ac = us_since(s0);
      fill.push_back(f);
      accept.push_back(ac);
      step.push_back(f + ac);
      if (a.slowest > 0) where.push_back({k, before});
      before += vocab.token_bytes[size_t(id)];
      ++tokens;
    }
    FP4MOE_CHECK(m.terminated(), "instance {} did not end its grammar", i);
  }
  fmt::print("masks, tool-call workload ({} requests, {} steps):\n  per request-step (fill + accept): {}\n  fill: {}\n  "
             "accept: {}\n",
             a.instances, tokens, stats(step), stats(fill), stats(accept));
  if (a.mask_digest) fmt::print("mask digest (FNV-1a over every mask word of every step): {:016x}\n", digest);
  if (a.slowest > 0) {
    std::vector<size_t> order(step.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    const size_t n = std::min(order.size(), size_t(a.slowest));
    std::partial_sort(order.begin(), order.begin() + long(n), order.end(),
                      [&](size_t x, size_t y) { return step[x] > step[y]; });
    fmt::print("the {} slowest request-steps (µs fill + accept, tool, the text before the step):\n", n);
    for (size_t r = 0; r < n; ++r) {
      const size_t i = order[r];
      fmt::print("  {:8.1f} {:6.1f}  tool {}  {}\n", fill[i], accept[i], where[i].tool, where[i].before);
    }
  }
  return 0;
}

void setup(CLI::App& app, std::function<int()>& run) {
  auto a = std::make_shared<BenchGrammarArgs>();
  app.add_option("--tokenizer", a->tokenizer, "A model folder whose tokenizer gives the vocabulary");
  app.add_option("--vocab-file", a->vocab_file, "GPT-2 byte-level encoded tokens, one per line (instead of --tokenizer)");
  app.add_option("--vocab-size", a->vocab_size, "With --vocab-file: the logit width (ids past the file are never allowed)")
      ->check(CLI::Range(1, 1 << 24))
      ->capture_default_str();
  app.add_option("--instances", a->instances, "Tool-call requests to run through their grammars")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  app.add_option("--slowest", a->slowest, "Print the N slowest request-steps with the text before each (0: none)")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  app.add_flag("--mask-digest", a->mask_digest,
               "Print a hash of every mask of the workload (two builds' masks compared without timing them)");
  run = [a] { return run_bench_grammar(*a); };
}

const cli::Registrar reg{"bench grammar", "Structured output: mask cost per request-step and compile time (host)", setup};

}  // namespace
}  // namespace fp4moe
