// fp4moe detokenize DIR: token ids on stdin (a JSON list, or {"ids": [...]}) → {"text": ...}.
#include <memory>
#include <string>

#include "cli/command.hpp"
#include "cli/text_io.hpp"

namespace fp4moe {
namespace {

struct DetokenizeArgs {
  std::string dir, input = "-";
  bool skip_special = false;
};

int run_detokenize(const DetokenizeArgs& a) {
  const text::Tokenizer tok = cli::load_tokenizer(a.dir);
  const auto in = cli::parse_input_json(cli::read_input(a.input), a.input);
  const auto& list = in.is_object() && in.contains("ids") ? in.at("ids") : in;
  FP4MOE_CHECK(list.is_array(), "input must be a JSON list of token ids or {{\"ids\": [...]}}");
  std::vector<int32_t> ids;
  for (const auto& v : list) {
    FP4MOE_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < (int64_t(1) << 31),
                 "token ids must be non-negative integers, got {}", v.dump());
    const int32_t id = int32_t(v.get<int64_t>());
    FP4MOE_CHECK(id < tok.vocab_size(), "token id {} is outside the vocabulary ({} ids)", id, tok.vocab_size());
    ids.push_back(id);
  }
  nlohmann::ordered_json out;
  out["text"] = tok.decode(ids, a.skip_special);
  cli::print_json(out);
  return 0;
}

void setup(CLI::App& app, std::function<int()>& run) {
  auto a = std::make_shared<DetokenizeArgs>();
  app.add_option("dir", a->dir, "model folder with tokenizer.json")->required();
  app.add_option("--input", a->input, "read the ids from this file instead of stdin");
  app.add_flag("--skip-special-tokens", a->skip_special, "leave special tokens out of the text");
  run = [a] { return run_detokenize(*a); };
}

const cli::Registrar kRegistrar{"detokenize", "Token ids (JSON) on stdin -> text with a model folder's tokenizer",
                                setup};

}  // namespace
}  // namespace fp4moe
