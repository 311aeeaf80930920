#include <algorithm>
#include <random>

#include <gtest/gtest.h>

#include "serve/choice_output.hpp"

using namespace fp4moe;
using namespace fp4moe::serve;

namespace {

engine::OutputEvent tokens(const std::string& bytes) {
  engine::OutputEvent ev;
  for (char c : bytes) ev.tokens.push_back({int32_t(uint8_t(c)), -0.5f, {}});
  return ev;
}

engine::OutputEvent finish(engine::FinishReason reason, const std::string& bytes = "", int32_t matched = -1) {
  auto ev = tokens(bytes);
  ev.finished = true;
  ev.reason = reason;
  ev.matched_stop_id = matched;
  ev.usage = {7, 3, 0};
  return ev;
}

}  // namespace

TEST(ChoiceOutput, StopStringSpanningTokensIsHeldBackAndCut) {
  auto codec = make_byte_codec();
  ChoiceOutput c(*codec, {"STOP"}, true);
  std::string seen;
  for (const char* piece : {"ab", "cS", "T", "OPxyz"}) {
    auto ev = tokens(piece);
    auto d = c.consume(ev);
    seen += d.text;
    EXPECT_FALSE(d.finished);
  }
  EXPECT_TRUE(c.stop_matched());
  EXPECT_EQ(seen, "abc");  // "S", "T" were held back until they turned into the stop string
  EXPECT_EQ(c.tokens().size(), 7u);  // a b c S T O P: the rest of that event was dropped
  auto more = tokens("more");
  EXPECT_TRUE(c.consume(more).tokens.empty());
  auto end = finish(engine::FinishReason::kAbort);
  auto d = c.consume(end);
  EXPECT_TRUE(d.finished);
  EXPECT_EQ(d.text, "");
  EXPECT_EQ(c.text(), "abc");
  EXPECT_EQ(c.finish_reason(), "stop");
  EXPECT_EQ(c.matched(), "STOP");
  EXPECT_EQ(c.usage().completion_tokens, 7);
  EXPECT_EQ(c.usage().prompt_tokens, 7);
}

TEST(ChoiceOutput, HeldTextThatDoesNotBecomeAStopIsReleased) {
  auto codec = make_byte_codec();
  ChoiceOutput c(*codec, {"xyz", "q"}, true);
  auto a = tokens("abxy");
  EXPECT_EQ(c.consume(a).text, "ab");
  auto b = tokens("w");
  EXPECT_EQ(c.consume(b).text, "x");  // "yw" could still start "xyz"? no, but two bytes are always held
  auto e = finish(engine::FinishReason::kLength, "vv");
  EXPECT_EQ(c.consume(e).text, "ywvv");
  EXPECT_EQ(c.text(), "abxywvv");
  EXPECT_EQ(c.finish_reason(), "length");
  EXPECT_TRUE(c.matched().is_null());
}

TEST(ChoiceOutput, TheEarliestStopWins) {
  auto codec = make_byte_codec();
  ChoiceOutput c(*codec, {"cd", "b"}, true);
  auto ev = tokens("abcd");
  c.consume(ev);
  EXPECT_EQ(c.text(), "a");
  EXPECT_EQ(c.matched(), "b");
}

TEST(ChoiceOutput, EosEndsWithoutText) {
  auto codec = make_byte_codec();
  ChoiceOutput c(*codec, {}, true);
  auto ev = finish(engine::FinishReason::kStop, "hi", -1);
  ev.tokens.push_back({256, -0.1f, {}});
  ev.matched_stop_id = 256;
  auto d = c.consume(ev);
  EXPECT_EQ(d.text, "hi");
  EXPECT_EQ(c.finish_reason(), "stop");
  EXPECT_EQ(c.matched(), 256);
  EXPECT_EQ(c.usage().completion_tokens, 3);
}

TEST(ChoiceOutput, MultiByteCharactersAreNeverSplit) {
  auto codec = make_byte_codec();
  const std::string e_acute = "\xc3\xa9", euro = "\xe2\x82\xac";
  ChoiceOutput c(*codec, {"zz"}, true);  // a 1-byte holdback must not cut a character either
  std::string seen;
  for (char ch : "a" + e_acute + euro + "b") {
    std::string one(1, ch);
    auto ev = tokens(one);
    const std::string t = c.consume(ev).text;
    EXPECT_EQ(utf8_complete_prefix(t), t.size()) << "a delta ends inside a character";
    seen += t;
  }
  auto end = finish(engine::FinishReason::kLength);
  seen += c.consume(end).text;
  EXPECT_EQ(seen, "a" + e_acute + euro + "b");
}

TEST(ByteCodec, EncodesSpecialsDecodesAndRendersChat) {
  auto codec = make_byte_codec();
  EXPECT_EQ(codec->encode("a<|user|>b", true), (std::vector<int32_t>{'a', 258, 'b'}));
  EXPECT_EQ(codec->decode(std::vector<int32_t>{'a', 256, 'b'}, true), "ab");
  EXPECT_EQ(codec->decode(std::vector<int32_t>{'a', 256}, false), "a<|endoftext|>");
  ChatInput chat;
  chat.messages = nlohmann::ordered_json::array({{{"role", "user"}, {"content", "hi"}}});
  EXPECT_EQ(codec->render_chat(chat), "<|user|>\nhi\n<|assistant|>\n");
  // Tools and template variables reach the stand-in's rendering (JSON lines first).
  chat.tools = nlohmann::ordered_json::parse(R"([{"type": "function", "function": {"name": "f"}}])");
  chat.kwargs = {{"enable_thinking", false}};
  chat.add_generation_prompt = false;
  EXPECT_EQ(codec->render_chat(chat),
            "<|tools|>\n[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]\n<|kwargs|>\n{\"enable_thinking\":false}\n"
            "<|user|>\nhi\n");
  // A token stands for one byte or one special string: "<|assistant|>" is the longest.
  EXPECT_EQ(codec->max_bytes_per_token(), 13u);
  EXPECT_EQ(codec->eos_ids(), std::vector<int32_t>{256});
  EXPECT_EQ(utf8_complete_prefix("ab\xe2\x82"), 2u);
  EXPECT_EQ(utf8_complete_prefix("ab\xe2\x82\xac"), 5u);
  EXPECT_EQ(utf8_complete_prefix("\xff"), 1u);
}

// The byte bound the server refuses long prompts with (text_codec.hpp): where a model folder's
// tokenizer allows one, no text encodes to fewer than ceil(bytes / bound) ids.
TEST(HfTextCodec, MaxBytesPerTokenIsALowerBoundOnTheIdsOrZero) {
  const std::string data = std::string(FP4MOE_SOURCE_DIR) + "/tests/text/data/";
  // behaviors: an NFD + NFC normalizer and a pre-tokenizer that removes punctuation: no bound.
  EXPECT_EQ(make_hf_text_codec(data + "behaviors")->max_bytes_per_token(), 0u);
  // qwen_style (NFC), gpt2_digits (NFKC, lstrip), chars_unk (NFKC, fuse_unk, Removed): none.
  for (const char* dir : {"qwen_style", "gpt2_digits", "chars_unk"})
    EXPECT_EQ(make_hf_text_codec(data + dir)->max_bytes_per_token(), 0u) << dir;
  // Byte-level BPE without a normalizer: a bound, checked on random texts.
  for (const char* dir : {"glm_style", "deepseek_style"}) {
    auto codec = make_hf_text_codec(data + dir);
    const size_t per = codec->max_bytes_per_token();
    ASSERT_GT(per, 0u) << dir;
    size_t longest = 0;
    for (int32_t id = 0; id < codec->vocab_size(); ++id) longest = std::max(longest, codec->token_text(id).size());
    EXPECT_GE(per, longest) << dir;
    std::mt19937_64 rng(7);
    const char* pieces[] = {"the ", "Hello", ", ", "\n\n", "1234567", "\xc3\xa9", "\xe4\xb8\xad\xe6\x96\x87", "\xf0\x9f\x98\x80",
                            "<|endoftext|>", "    ", "\xff", "\xe2\x82", "aaaaaaaaaaaaaaaa", "!!!", "\t"};
    for (int i = 0; i < 300; ++i) {
      std::string text;
      for (int k = int(rng() % 200); k > 0; --k) text += pieces[rng() % std::size(pieces)];
      for (bool special : {false, true}) {
        const size_t ids = codec->encode(text, special).size();
        EXPECT_GE(ids * per, text.size()) << dir << ": " << text;
      }
    }
  }
}
