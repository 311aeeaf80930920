// Encodings and decodings of the test tokenizers against Hugging Face tokenizers' own output
// (tests/text/data/*/goldens.json, written by tools/text/make_tokenizer_goldens.py), id for
// id and byte for byte; transformers' AutoTokenizer ids for the folders that have a
// tokenizer_config.json; decode round trips and streaming detokenization at every token.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "text/text_test_util.hpp"
#include "text/detokenizer.hpp"
#include "text/tokenizer.hpp"
#include "text/unicode.hpp"

namespace fp4moe::text {
namespace {

using testing::case_input;
using testing::data_dir;
using testing::read_file;
using testing::read_json;

const char* const kConfigs[] = {"glm_style", "qwen_style", "deepseek_style", "gpt2_digits", "behaviors", "chars_unk"};

class TokenizerGolden : public ::testing::TestWithParam<const char*> {
 protected:
  std::string dir() const { return data_dir() + "/" + GetParam(); }
};

std::vector<int32_t> ids_of(const nlohmann::ordered_json& v) { return v.get<std::vector<int32_t>>(); }

TEST_P(TokenizerGolden, EncodeMatchesTokenizersIdForId) {
  const Tokenizer tok = Tokenizer::from_json(read_file(dir() + "/tokenizer.json"));
  const auto golden = read_json(dir() + "/goldens.json");
  ASSERT_GE(golden.at("cases").size(), 40u);
  for (const auto& c : golden.at("cases")) {
    const std::string input = case_input(c);
    EXPECT_EQ(tok.encode(input, true), ids_of(c.at("ids"))) << GetParam() << " / " << c.at("name");
    EXPECT_EQ(tok.encode(input, false), ids_of(c.at("ids_plain"))) << GetParam() << " / " << c.at("name");
  }
}

TEST_P(TokenizerGolden, DecodeMatchesTokenizersByteForByte) {
  const Tokenizer tok = Tokenizer::from_json(read_file(dir() + "/tokenizer.json"));
  const auto golden = read_json(dir() + "/goldens.json");
  for (const auto& c : golden.at("cases")) {
    const auto ids = ids_of(c.at("ids"));
    EXPECT_EQ(tok.decode(ids, false), c.at("decoded").get<std::string>()) << GetParam() << " / " << c.at("name");
    EXPECT_EQ(tok.decode(ids, true), c.at("decoded_skip").get<std::string>()) << GetParam() << " / " << c.at("name");
  }
}

TEST_P(TokenizerGolden, StreamingDetokenizerEqualsDecodeAtEveryToken) {
  const Tokenizer tok = Tokenizer::from_json(read_file(dir() + "/tokenizer.json"));
  const auto golden = read_json(dir() + "/goldens.json");
  for (const auto& c : golden.at("cases")) {
    const auto ids = ids_of(c.at("ids"));
    for (bool skip : {false, true}) {
      StreamingDetokenizer detok(tok, skip);
      std::string streamed;
      for (size_t k = 0; k < ids.size(); ++k) {
        const std::string piece = detok.push(ids[k]);
        ASSERT_TRUE(is_valid_utf8(piece)) << c.at("name") << " token " << k;
        streamed += piece;
        // What has been emitted is always a prefix of the full decode.
        const std::string full = tok.decode(ids, skip);
        ASSERT_EQ(full.compare(0, streamed.size(), streamed), 0) << c.at("name") << " token " << k;
        ASSERT_LE(detok.pending_bytes(), 3u);
      }
      streamed += detok.finish();
      EXPECT_EQ(streamed, tok.decode(ids, skip)) << GetParam() << " / " << c.at("name");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, TokenizerGolden, ::testing::ValuesIn(kConfigs),
                         [](const ::testing::TestParamInfo<const char*>& p) { return std::string(p.param); });

// Byte-level tokenizers without a normalizer give back the (repaired) input exactly.
class TokenizerRoundTrip : public TokenizerGolden {};

TEST_P(TokenizerRoundTrip, DecodeOfEncodeIsTheRepairedInput) {
  const Tokenizer tok = Tokenizer::from_json(read_file(dir() + "/tokenizer.json"));
  for (const auto& c : read_json(dir() + "/goldens.json").at("cases")) {
    const std::string input = case_input(c);
    EXPECT_EQ(tok.decode(tok.encode(input, false), false), to_valid_utf8(input)) << c.at("name");
  }
}

INSTANTIATE_TEST_SUITE_P(ByteLevelWithoutNormalizer, TokenizerRoundTrip, ::testing::Values("glm_style", "deepseek_style"),
                         [](const ::testing::TestParamInfo<const char*>& p) { return std::string(p.param); });

// Folders with a tokenizer_config.json: ids as transformers' AutoTokenizer gives them.
class TokenizerFolderGolden : public TokenizerGolden {};

TEST_P(TokenizerFolderGolden, EncodeAndSpecialTokensMatchTransformers) {
  const Tokenizer tok = Tokenizer::from_dir(dir());
  const auto golden = read_json(dir() + "/goldens.json");
  for (const auto& c : golden.at("cases"))
    EXPECT_EQ(tok.encode(case_input(c), true), ids_of(c.at("hf_ids"))) << GetParam() << " / " << c.at("name");
  const NamedToken* eos = tok.named_token("eos_token");
  ASSERT_NE(eos, nullptr);
  EXPECT_EQ(eos->id, golden.at("hf_eos_token_id").get<int32_t>());
  const NamedToken* bos = tok.named_token("bos_token");
  if (golden.at("hf_bos_token_id").is_null()) {
    EXPECT_EQ(bos, nullptr);
  } else {
    ASSERT_NE(bos, nullptr);
    EXPECT_EQ(bos->id, golden.at("hf_bos_token_id").get<int32_t>());
  }
}

INSTANTIATE_TEST_SUITE_P(Folders, TokenizerFolderGolden, ::testing::Values("glm_style", "deepseek_style", "gpt2_digits"),
                         [](const ::testing::TestParamInfo<const char*>& p) { return std::string(p.param); });

}  // namespace
}  // namespace fp4moe::text
