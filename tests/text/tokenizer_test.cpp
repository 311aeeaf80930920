// Unit tests of the tokenizer's parts: merge strategies agree, the NFC fast path equals
// utf8proc, the Oniguruma→PCRE2 rewrite keeps Oniguruma's classes, load errors name the
// component, the streaming detokenizer holds split characters, folder configs, threads.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <thread>
#include <vector>

#include <utf8proc.h>

#include "core/error.hpp"
#include "text/bpe.hpp"
#include "text/detokenizer.hpp"
#include "text/regex.hpp"
#include "text/text_test_util.hpp"
#include "text/tokenizer.hpp"
#include "text/unicode.hpp"

namespace fp4moe::text {
namespace {

using testing::data_dir;
using testing::read_file;

std::string qwen_json() { return read_file(data_dir() + "/qwen_style/tokenizer.json"); }

TEST(Bpe, SmallAndHeapMergeLoopsAgree) {
  // The two strategies pick merges in the same order, so they must give the same symbols.
  const auto j = nlohmann::json::parse(qwen_json());
  Vocab vocab;
  for (auto it = j["model"]["vocab"].begin(); it != j["model"]["vocab"].end(); ++it) vocab[it.key()] = it.value();
  std::vector<std::pair<std::string, std::string>> merges;
  for (const auto& m : j["model"]["merges"]) merges.emplace_back(m[0], m[1]);
  const BpeModel model(vocab, merges, {});
  const ByteLevelAlphabet& alpha = ByteLevelAlphabet::get();
  std::mt19937 rng(5);
  const std::string pool = "the quick brown fox  éàü 日本語 1234567890 ...!!  thththeee";
  for (int iter = 0; iter < 2000; ++iter) {
    std::vector<int32_t> a;
    const int n = 1 + int(rng() % 80);
    for (int k = 0; k < n; ++k) a.push_back(model.token_to_id(alpha.byte_to_utf8[uint8_t(pool[rng() % pool.size()])]));
    std::vector<int32_t> b = a;
    model.merge_small(a);
    model.merge_heap(b);
    ASSERT_EQ(a, b) << "iteration " << iter;
  }
}

TEST(Unicode, NormalizeFastPathEqualsUtf8proc) {
  const char32_t pool[] = {'a', 'e', 'A', ' ', 0xE9, 0x301, 0x308, 0x323, 0x30A, 0x212B, 0xF900, 0x958, 0x93C,
                           0x915, 0x1100, 0x1161, 0x11A8, 0xAC00, 0xAC01, 0xFB01, 0x2460, 0xFF48, 0x1E9B, 0x3000,
                           0x65E5, 0x1F44D, 0x1F3FD, 0x200D, 0x0627, 0x064E, 0x0651, 0xC5, 0x2126, 0x1EBF};
  std::mt19937 rng(11);
  for (NormalForm form : {NormalForm::NFC, NormalForm::NFD, NormalForm::NFKC, NormalForm::NFKD}) {
    const int opts = UTF8PROC_STABLE | (form == NormalForm::NFC    ? UTF8PROC_COMPOSE
                                        : form == NormalForm::NFD  ? UTF8PROC_DECOMPOSE
                                        : form == NormalForm::NFKC ? UTF8PROC_COMPOSE | UTF8PROC_COMPAT
                                                                   : UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT);
    for (int iter = 0; iter < 3000; ++iter) {
      std::string s;
      const int n = int(rng() % 12);
      for (int k = 0; k < n; ++k) append_utf8(s, pool[rng() % std::size(pool)]);
      utf8proc_uint8_t* dst = nullptr;
      const auto len = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), utf8proc_ssize_t(s.size()),
                                    &dst, utf8proc_option_t(opts));
      ASSERT_GE(len, 0);
      const std::string want(reinterpret_cast<char*>(dst), size_t(len));
      std::free(dst);
      std::string out;
      const bool changed = normalize_unicode(s, form, out);
      ASSERT_EQ(changed ? out : s, want) << "form " << int(form) << " input " << s;
    }
  }
}

TEST(Unicode, LossyRepairFollowsMaximalSubparts) {
  EXPECT_EQ(to_valid_utf8("a\xff" "b"), "a\xEF\xBF\xBD" "b");
  EXPECT_EQ(to_valid_utf8("\xe2\x82"), "\xEF\xBF\xBD");                 // one truncated sequence
  EXPECT_EQ(to_valid_utf8("\xe2\x82x"), "\xEF\xBF\xBDx");
  EXPECT_EQ(to_valid_utf8("\xc0\xaf"), "\xEF\xBF\xBD\xEF\xBF\xBD");    // C0 is never valid
  EXPECT_EQ(to_valid_utf8("\xed\xa0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
  EXPECT_EQ(to_valid_utf8("\xf0\x9f\x91\x8d"), "\xf0\x9f\x91\x8d");
  EXPECT_TRUE(is_valid_utf8("plain ascii and é 日本 👍"));
  EXPECT_FALSE(is_valid_utf8("\xf4\x90\x80\x80"));
}

TEST(Regex, BackslashSMatchesUnicodeWhiteSpaceExactly) {
  const Regex re(R"(\s)", "test");
  for (char32_t cp = 1; cp < 0x3100; ++cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    std::string s;
    append_utf8(s, cp);
    bool hit = false;
    re.for_each_match(s, [&](size_t, size_t) { hit = true; });
    ASSERT_EQ(hit, is_white_space(cp)) << "U+" << std::hex << uint32_t(cp);
  }
}

TEST(Regex, OnigurumaEscapesAreRewritten) {
  EXPECT_EQ(oniguruma_to_pcre2(R"(\u3040)", "t"), R"(\x{3040})");
  EXPECT_EQ(oniguruma_to_pcre2(R"([\h])", "t"), "[0-9a-fA-F]");
  EXPECT_EQ(oniguruma_to_pcre2(R"(\p{L}+)", "t"), R"(\p{L}+)");
  EXPECT_THROW(oniguruma_to_pcre2(R"([^\S])", "t"), Error);
  EXPECT_THROW(oniguruma_to_pcre2(R"([a-z&&[^b]])", "t"), Error);
  EXPECT_THROW(Regex("(unclosed", "t"), Error);
}

TEST(Regex, EmptyMatchesFollowOnigurumaFindIter) {
  const Regex re("x*", "t");
  std::vector<std::pair<size_t, size_t>> m;
  re.for_each_match("abxxc", [&](size_t b, size_t e) { m.emplace_back(b, e); });
  const std::vector<std::pair<size_t, size_t>> want = {{0, 0}, {1, 1}, {2, 4}, {5, 5}};
  EXPECT_EQ(m, want);
}

// One clear, single-line error naming the component for each unsupported construct.
TEST(TokenizerLoad, UnsupportedComponentsAreNamedErrors) {
  struct Case {
    const char* what;
    std::function<void(nlohmann::json&)> edit;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"metaspace", [](auto& j) { j["pre_tokenizer"]["pretokenizers"][1] = {{"type", "Metaspace"}}; },
       "pre_tokenizer.pretokenizers[1]: type 'Metaspace' is not supported"},
      {"lowercase", [](auto& j) { j["normalizer"] = {{"type", "Lowercase"}}; }, "normalizer: type 'Lowercase'"},
      {"wordpiece", [](auto& j) { j["model"]["type"] = "WordPiece"; }, "model: type 'WordPiece' is not supported"},
      {"byte_fallback", [](auto& j) { j["model"]["byte_fallback"] = true; }, "model.byte_fallback"},
      {"dropout", [](auto& j) { j["model"]["dropout"] = 0.1; }, "model.dropout"},
      {"prefix", [](auto& j) { j["model"]["continuing_subword_prefix"] = "##"; }, "model.continuing_subword_prefix"},
      {"bert_post", [](auto& j) { j["post_processor"] = {{"type", "BertProcessing"}}; },
       "post_processor: type 'BertProcessing'"},
      {"wordpiece_decoder", [](auto& j) { j["decoder"] = {{"type", "WordPiece"}}; }, "decoder: type 'WordPiece'"},
      {"truncation", [](auto& j) { j["truncation"] = {{"max_length", 5}}; }, "truncation"},
      {"bad_merge", [](auto& j) { j["model"]["merges"][3] = {"zzzz", "qqqq"}; }, "model.merges[3]"},
      {"bad_regex", [](auto& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(oops"; },
       "pre_tokenizer.pretokenizers[0] (Split): bad regex"},
      {"bytelevel_first",
       [](auto& j) {
         auto& p = j["pre_tokenizer"]["pretokenizers"];
         std::swap(p[0], p[1]);
       },
       "after ByteLevel"},
      // Issue 37: an added token's declared id that tokenizers would not give it is refused,
      // not silently remapped (16777215 = 2^24 - 1 passes the range check).
      {"added_id_remapped", [](auto& j) { j["added_tokens"][6]["id"] = 16777215; },
       "added_tokens[6].id: 16777215 for \"</tool_call>\", but the token gets id 1505"},
      {"added_id_gap", [](auto& j) { j["added_tokens"][1]["id"] = 1600; }, "added_tokens[1].id: 1600"},
      {"added_id_in_vocab", [](auto& j) { j["added_tokens"][0]["id"] = 7; }, "but the token gets id 0"},
      {"added_id_too_large", [](auto& j) { j["added_tokens"][1]["id"] = 16777216; }, "16777216 is out of range"},
      {"not_json", nullptr, "not valid JSON"},
  };
  for (const Case& c : cases) {
    std::string text;
    if (c.edit) {
      auto j = nlohmann::json::parse(qwen_json());
      c.edit(j);
      text = j.dump();
    } else {
      text = "{\"model\": ";
    }
    try {
      Tokenizer::from_json(text, "tok.json");
      ADD_FAILURE() << c.what << ": loaded";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(c.expect), std::string::npos) << c.what << ": " << msg;
      EXPECT_EQ(msg.rfind("tok.json: ", 0), 0u) << c.what << ": " << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << c.what << ": " << msg;
    }
  }
}

TEST(StreamingDetokenizer, HoldsBytesOfASplitCharacterUntilItCompletes) {
  const Tokenizer tok = Tokenizer::from_json(qwen_json());
  const ByteLevelAlphabet& alpha = ByteLevelAlphabet::get();
  const auto byte_token = [&](unsigned char b) { return tok.token_to_id(alpha.byte_to_utf8[b]); };
  // "a👍é" one byte per token: the emoji's first three bytes produce nothing.
  const std::string text = "a\xf0\x9f\x91\x8d\xc3\xa9";
  StreamingDetokenizer d(tok);
  std::vector<std::string> outs;
  for (unsigned char b : text) outs.push_back(d.push(byte_token(b)));
  const std::vector<std::string> want = {"a", "", "", "", "\xf0\x9f\x91\x8d", "", "\xc3\xa9"};
  EXPECT_EQ(outs, want);
  EXPECT_EQ(d.finish(), "");
  // An ill-formed sequence becomes U+FFFD as soon as it is known to be ill-formed.
  EXPECT_EQ(d.push(byte_token(0xf0)), "");
  EXPECT_EQ(d.push(byte_token(0x9f)), "");
  EXPECT_EQ(d.push(byte_token('x')), "\xEF\xBF\xBDx");
  EXPECT_EQ(d.push(byte_token(0xe2)), "");
  EXPECT_EQ(d.finish(), "\xEF\xBF\xBD");
}

TEST(StreamingDetokenizer, EveryIdSequenceStreamsToItsDecode) {
  const Tokenizer tok = Tokenizer::from_json(qwen_json());
  std::mt19937 rng(3);
  for (int iter = 0; iter < 300; ++iter) {
    std::vector<int32_t> ids;
    const int n = int(rng() % 30);
    for (int k = 0; k < n; ++k) ids.push_back(int32_t(rng() % uint32_t(tok.vocab_size() + 5)));  // some unknown
    for (bool skip : {false, true}) {
      StreamingDetokenizer d(tok, skip);
      std::string s;
      for (int32_t id : ids) {
        const std::string piece = d.push(id);
        ASSERT_TRUE(is_valid_utf8(piece));
        s += piece;
      }
      s += d.finish();
      ASSERT_EQ(s, tok.decode(ids, skip));
    }
  }
}

TEST(TokenizerFolder, ReadsStopIdsSpecialTokensAndTemplateSource) {
  const Tokenizer glm = Tokenizer::from_dir(data_dir() + "/glm_style");
  const std::vector<int32_t> stops = {glm.token_to_id("<|endoftext|>"), glm.token_to_id("<|user|>"),
                                      glm.token_to_id("<|observation|>")};
  EXPECT_EQ(glm.stop_ids(), stops);
  ASSERT_NE(glm.named_token("eos_token"), nullptr);
  EXPECT_EQ(glm.named_token("eos_token")->content, "<|endoftext|>");
  EXPECT_TRUE(glm.chat_template().has_value());  // chat_template.jinja
  EXPECT_TRUE(glm.is_special(glm.token_to_id("<|user|>")));
  EXPECT_FALSE(glm.is_special(glm.token_to_id("<think>")));

  const Tokenizer ds = Tokenizer::from_dir(data_dir() + "/deepseek_style");
  EXPECT_EQ(ds.stop_ids(), std::vector<int32_t>{ds.token_to_id("<｜end▁of▁sentence｜>")});
  EXPECT_EQ(ds.add_bos_token(), std::optional<bool>(true));
  EXPECT_TRUE(ds.chat_template().has_value());  // tokenizer_config.json's chat_template

  const Tokenizer gpt2 = Tokenizer::from_dir(data_dir() + "/gpt2_digits");
  EXPECT_FALSE(gpt2.chat_template().has_value());  // no template is not a load error
  EXPECT_THROW(Tokenizer::from_dir(data_dir() + "/nope"), Error);
}

TEST(Tokenizer, ConcurrentEncodesEqualSerialOnes) {
  const Tokenizer tok = Tokenizer::from_json(qwen_json());
  std::vector<std::string> texts;
  for (int i = 0; i < 200; ++i) texts.push_back("text " + std::to_string(i * 7919) + " 日本語 ok? 👍🏽 " + std::string(i % 7, ' '));
  std::vector<std::vector<int32_t>> serial;
  for (const auto& t : texts) serial.push_back(tok.encode(t));
  std::vector<std::vector<int32_t>> a(texts.size()), b(texts.size());
  std::thread t1([&] { for (size_t i = 0; i < texts.size(); ++i) a[i] = tok.encode(texts[i]); });
  std::thread t2([&] { for (size_t i = texts.size(); i-- > 0;) b[i] = tok.encode(texts[i]); });
  t1.join();
  t2.join();
  EXPECT_EQ(a, serial);
  EXPECT_EQ(b, serial);
}

TEST(Tokenizer, LongRunsEncodeAndRoundTrip) {
  const Tokenizer tok = Tokenizer::from_json(read_file(data_dir() + "/glm_style/tokenizer.json"));
  for (const std::string& s : {std::string(1 << 20, ' '), std::string(1 << 18, '7'), std::string(1 << 18, 'a'),
                               std::string(100000, '\n') + "x"}) {
    const auto ids = tok.encode(s, false);
    EXPECT_FALSE(ids.empty());
    EXPECT_EQ(tok.decode(ids), s);
  }
}

}  // namespace
}  // namespace fp4moe::text
