// `fp4moe generate` end to end: broken models and bad requests (one line on stderr, exit code 1 or 2,
// never a crash, a hang or output), the printed ids / rates, the dumps, seeded sampling.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli/cli_run_helpers.hpp"
#include "format/safetensors.hpp"
#include "model_test_util.hpp"
#include "text/tokenizer.hpp"

using namespace fp4moe;
using namespace fp4moe::testing_cli;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

const std::string kCase = "glm5-tiny-sparse";

// Copies the golden model to dir, rewriting model.safetensors through `edit` (which gets each
// tensor and may change its name / shape / bytes or drop it) and config.json through `cfg`.
struct Edit {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
  bool keep = true;
};
void copy_model(const fs::path& dir, const std::function<void(Edit&)>& edit, const std::function<void(json&)>& cfg,
                std::vector<Edit> extra = {}) {
  const fs::path src = testing_model::golden_dir(kCase) + "/model";
  fs::create_directories(dir);
  const auto in = SafetensorsFile::open((src / "model.safetensors").string());
  SafetensorsWriter w((dir / "model.safetensors").string());
  for (const TensorInfo& t : in->tensors()) {
    const auto b = in->bytes(t);
    Edit e{t.name, t.dtype, t.shape, {b.begin(), b.end()}};
    if (edit) edit(e);
    if (e.keep) w.add(e.name, e.dtype, e.shape, e.bytes);
  }
  for (Edit& e : extra) w.add(e.name, e.dtype, e.shape, e.bytes);
  w.finish();
  std::ifstream cf(src / "config.json");
  json c = json::parse(cf);
  if (cfg) cfg(c);
  std::ofstream(dir / "config.json") << c.dump(2);
}

Result generate(const TempDir& t, const fs::path& model, const std::string& args) {
  return run_binary(t.path, "generate --model " + model.string() + " " + args);
}

void expect_one_line_error(const Result& r, const std::string& needle) {
  EXPECT_TRUE(r.rc == 1 || r.rc == 2) << "rc " << r.rc << "\n" << r.err;
  EXPECT_EQ(r.err_lines(), 1) << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");
}

}  // namespace

TEST(GenerateBadInput, MissingTensorIsNamed) {
  TempDir t("gen_missing");
  copy_model(t.path / "m", [](Edit& e) { e.keep = e.name != "model.layers.2.self_attn.kv_b_proj.weight"; }, nullptr);
  expect_one_line_error(generate(t, t.path / "m", "--prompt-ids 1,2,3"), "model.layers.2.self_attn.kv_b_proj.weight");
}

TEST(GenerateBadInput, WrongShapeIsNamed) {
  TempDir t("gen_shape");
  copy_model(t.path / "m", [](Edit& e) {
    if (e.name == "model.layers.1.self_attn.o_proj.weight") std::swap(e.shape[0], e.shape[1]);
  }, nullptr);
  const Result r = generate(t, t.path / "m", "--prompt-ids 1,2,3");
  expect_one_line_error(r, "model.layers.1.self_attn.o_proj.weight");
  EXPECT_NE(r.err.find("shape"), std::string::npos);
}

TEST(GenerateBadInput, ExtraTensorIsNamed) {
  TempDir t("gen_extra");
  copy_model(t.path / "m", nullptr, nullptr,
             {Edit{"model.layers.0.self_attn.q_norm.weight", DType::BF16, {64}, std::vector<uint8_t>(128, 0)}});
  expect_one_line_error(generate(t, t.path / "m", "--prompt-ids 1,2,3"), "unexpected tensor 'model.layers.0.self_attn.q_norm.weight'");
}

TEST(GenerateBadInput, MtpLayerBeyondTheConfigIsAnExtraTensor) {
  TempDir t("gen_mtp");
  copy_model(t.path / "m", nullptr, [](json& c) { c["num_nextn_predict_layers"] = 0; },
             {Edit{"model.layers.4.enorm.weight", DType::BF16, {64}, std::vector<uint8_t>(128, 0)}});
  expect_one_line_error(generate(t, t.path / "m", "--prompt-ids 1,2,3"), "model.layers.4.enorm.weight");
}

TEST(GenerateBadInput, UnsupportedConfigValuesAreNamed) {
  const std::vector<std::pair<std::function<void(json&)>, std::string>> cases = {
      {[](json& c) { c["rope_parameters"]["rope_type"] = "linear"; }, "rope_type 'linear'"},
      {[](json& c) { c["attention_bias"] = true; }, "attention_bias"},
      {[](json& c) { c["hidden_act"] = "gelu"; }, "hidden_act"},
      {[](json& c) { c["num_key_value_heads"] = 2; }, "num_key_value_heads"},
      {[](json& c) { c["indexer_types"][0] = "shared"; }, "layer 0"},
      {[](json& c) { c["indexer_types"][1] = "partial"; }, "indexer_types[1]"},
      {[](json& c) { c["architectures"] = {"LlamaForCausalLM"}; }, "LlamaForCausalLM"},
  };
  int i = 0;
  for (const auto& [edit, needle] : cases) {
    TempDir t("gen_cfg" + std::to_string(i++));
    copy_model(t.path / "m", nullptr, edit);
    expect_one_line_error(generate(t, t.path / "m", "--prompt-ids 1,2,3"), needle);
  }
}

TEST(GenerateBadInput, SharedIndexerLayerWithIndexerWeightsIsRejected) {
  TempDir t("gen_sharedw");
  copy_model(t.path / "m", nullptr, [](json& c) { c["indexer_types"][2] = "shared"; });
  expect_one_line_error(generate(t, t.path / "m", "--prompt-ids 1,2,3"), "layer 2 is a \"shared\" indexer layer");
}

TEST(GenerateBadInput, PromptBeyondTheMaximumLength) {
  TempDir t("gen_long");
  std::string ids = "1";
  for (int i = 0; i < 1020; ++i) ids += ",7";
  expect_one_line_error(generate(t, testing_model::golden_dir(kCase) + "/model", "--prompt-ids " + ids + " --max-new-tokens 8"),
                        "max_position_embeddings");
}

TEST(GenerateBadInput, TokenIdsOutOfTheVocabularyOrMalformed) {
  TempDir t("gen_ids");
  const fs::path m = testing_model::golden_dir(kCase) + "/model";
  expect_one_line_error(generate(t, m, "--prompt-ids 1,512,3"), "512");
  expect_one_line_error(generate(t, m, "--prompt-ids 1,x,3"), "'x'");
  expect_one_line_error(generate(t, m, "--prompt-ids 1,-4"), "'-4'");
  expect_one_line_error(generate(t, m, "--prompt-ids 1,,2"), "token id");
}

TEST(GenerateBadInput, BadSamplingParameters) {
  TempDir t("gen_sampling");
  const fs::path m = testing_model::golden_dir(kCase) + "/model";
  expect_one_line_error(generate(t, m, "--prompt-ids 1,2 --top-p 0"), "top_p");
  expect_one_line_error(generate(t, m, "--prompt-ids 1,2 --temperature -1"), "temperature");
}

TEST(Generate, PrintsIdsAndTokensPerSecondAndDumpsLogits) {
  TempDir t("gen_ok");
  const fs::path m = testing_model::golden_dir(kCase) + "/model";
  const Result r = generate(t, m, "--prompt-ids 5,6,7,8 --max-new-tokens 3 --dump-logits " + (t.path / "d.safetensors").string() +
                                      " --dump-hidden " + (t.path / "h.safetensors").string());
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), ','), 2) << r.out;
  EXPECT_NE(r.err.find("prefill: 4 tokens"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("decode: 2 tokens"), std::string::npos) << r.err;
  const auto d = SafetensorsFile::open((t.path / "d.safetensors").string());
  EXPECT_EQ(d->get("tokens").shape, (std::vector<int64_t>{7}));
  EXPECT_EQ(d->get("logits").shape, (std::vector<int64_t>{6, 512}));
  const auto h = SafetensorsFile::open((t.path / "h.safetensors").string());
  EXPECT_EQ(h->get("hidden_states.4").shape, (std::vector<int64_t>{4, 64}));
}

TEST(Generate, SampledTokensAreReproducibleForASeed) {
  TempDir t("gen_seed");
  const fs::path m = testing_model::golden_dir(kCase) + "/model";
  const std::string args = "--prompt-ids 5,6,7,8 --max-new-tokens 12 --temperature 1.5 --top-p 0.95 --top-k 50 --seed ";
  const Result a = generate(t, m, args + "7"), b = generate(t, m, args + "7"), c = generate(t, m, args + "8");
  ASSERT_EQ(a.rc, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_NE(a.out, c.out);
  const Result lp = generate(t, m, "--prompt-ids 5,6,7,8 --max-new-tokens 2 --logprobs 3");
  ASSERT_EQ(lp.rc, 0) << lp.err;
  EXPECT_EQ(std::count(lp.out.begin(), lp.out.end(), '\n'), 3) << lp.out;  // ids + 2 logprob lines
  EXPECT_NE(lp.out.find("logprob "), std::string::npos);
}

// --prompt TEXT: the text is encoded with the tokenizer folder's tokenizer.json and the output is
// the generated ids' text, so it must equal --prompt-ids over encode(text), decoded.
TEST(Generate, TextPromptEqualsItsTokenIdsDecoded) {
  TempDir t("gen_text");
  const fs::path m = testing_model::golden_dir(kCase) + "/model";
  const std::string tok_dir = std::string(FP4MOE_SOURCE_DIR) + "/tests/text/data/glm_style";
  const text::Tokenizer tok = text::Tokenizer::from_dir(tok_dir);
  // A prompt whose ids fit the tiny model's 512-entry vocabulary.
  std::string prompt;
  std::vector<int32_t> ids;
  for (const char* cand : {"the cat sat", "a b c", "ab", "a"}) {
    ids = tok.encode(cand);
    if (!ids.empty() && *std::max_element(ids.begin(), ids.end()) < 512) { prompt = cand; break; }
  }
  ASSERT_FALSE(prompt.empty()) << "no candidate prompt fits the vocabulary";
  std::string csv;
  for (int32_t id : ids) {
    if (!csv.empty()) csv += ',';
    csv += std::to_string(id);
  }
  const Result by_ids = generate(t, m, "--prompt-ids " + csv + " --max-new-tokens 4");
  const Result by_text = generate(t, m, "--prompt '" + prompt + "' --tokenizer-path " + tok_dir + " --max-new-tokens 4");
  ASSERT_EQ(by_ids.rc, 0) << by_ids.err;
  ASSERT_EQ(by_text.rc, 0) << by_text.err;
  std::vector<int32_t> out;
  for (size_t i = 0; i < by_ids.out.size();) {
    size_t j = by_ids.out.find_first_of(",\n", i);
    out.push_back(std::stoi(by_ids.out.substr(i, j - i)));
    i = j + 1;
  }
  EXPECT_EQ(by_text.out, tok.decode(out, /*skip_special_tokens=*/true) + "\n");
  // Both ways of giving a prompt at once, or neither, is a usage error.
  for (const std::string& bad : {"--prompt x --prompt-ids 1", "--max-new-tokens 1"}) {
    const Result r = generate(t, m, bad);
    EXPECT_EQ(r.rc, 2) << bad << "\n" << r.err;  // CLI11's usage error (and its "Run with --help" line)
    EXPECT_EQ(r.out, "") << bad;
  }
}

// What generate cannot do through the engine is refused in one line: the target's dumps with
// speculative decoding (its verify steps' rows are not one per token), the MTP logits of a
// checkpoint without an MTP layer or of a one-token prompt.
TEST(GenerateBadInput, DumpsTheEngineCannotGiveAreRefused) {
  TempDir t("gen_dump_refused");
  const fs::path m = testing_model::golden_dir(kCase) + "/model";
  const std::string out = " " + (t.path / "x.safetensors").string();
  expect_one_line_error(generate(t, m, "--prompt-ids 5,6,7 --speculative-algorithm NEXTN --dump-logits" + out),
                        "--dump-logits / --dump-hidden with speculative decoding");
  expect_one_line_error(generate(t, m, "--prompt-ids 5,6,7 --speculative-algorithm NEXTN --dump-hidden" + out),
                        "--dump-logits / --dump-hidden with speculative decoding");
  expect_one_line_error(generate(t, m, "--prompt-ids 5,6,7 --dump-mtp-logits" + out), "no MTP layer");
  expect_one_line_error(generate(t, m, "--prompt-ids 5 --dump-mtp-logits" + out), "at least 2");
  EXPECT_FALSE(fs::exists(t.path / "x.safetensors"));
}

// --dump-mtp-logits on a checkpoint with an MTP layer (make-synthetic glm5-tiny): tokens [P] and
// mtp_logits [P-1, vocab], beside the generated ids, with and without speculative decoding.
TEST(Generate, DumpsTheMtpLogitsOfThePrompt) {
  TempDir t("gen_dump_mtp");
  const Result mk = run_binary(t.path, "make-synthetic " + (t.path / "m").string() + " --preset glm5-tiny");
  ASSERT_EQ(mk.rc, 0) << mk.err;
  for (const std::string spec : {"", " --speculative-algorithm NEXTN --speculative-num-steps 2"}) {
    const fs::path f = t.path / "mtp.safetensors";
    const Result r = generate(t, t.path / "m", "--prompt-ids 5,6,7,8,9 --max-new-tokens 4 --dump-mtp-logits " + f.string() + spec);
    ASSERT_EQ(r.rc, 0) << r.err;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), ','), 3) << r.out;
    const auto d = SafetensorsFile::open(f.string());
    EXPECT_EQ(d->get("tokens").shape, (std::vector<int64_t>{5}));
    EXPECT_EQ(d->get("mtp_logits").shape, (std::vector<int64_t>{4, 1024}));
    fs::remove(f);
  }
}
