// fp4moe tokenize DIR: text on stdin → {"ids": [...]} with the model folder's tokenizer.
//
// The whole input is one text (bytes; ill-formed UTF-8 is repaired to U+FFFD first). With
// --no-special-tokens the post-processor's BOS/EOS are not added (what a chat prompt uses).
#include <memory>
#include <string>

#include "cli/command.hpp"
#include "cli/text_io.hpp"

namespace fp4moe {
namespace {

struct TokenizeArgs {
  std::string dir, input = "-";
  bool no_special = false, tokens = false;
};

int run_tokenize(const TokenizeArgs& a) {
  const text::Tokenizer tok = cli::load_tokenizer(a.dir);
  const std::string input = cli::read_input(a.input);
  const std::vector<int32_t> ids = tok.encode(input, !a.no_special);
  nlohmann::ordered_json out;
  out["ids"] = ids;
  if (a.tokens) {
    auto& list = out["tokens"] = nlohmann::ordered_json::array();
    for (int32_t id : ids) list.push_back(tok.id_to_token(id).value_or(""));
  }
  cli::print_json(out);
  return 0;
}

void setup(CLI::App& app, std::function<int()>& run) {
  auto a = std::make_shared<TokenizeArgs>();
  app.add_option("dir", a->dir, "model folder with tokenizer.json (and tokenizer_config.json)")->required();
  app.add_option("--input", a->input, "read the text from this file instead of stdin");
  app.add_flag("--no-special-tokens", a->no_special, "do not add the post-processor's special tokens (BOS/EOS)");
  app.add_flag("--tokens", a->tokens, "also print each id's token string");
  run = [a] { return run_tokenize(*a); };
}

const cli::Registrar kRegistrar{"tokenize", "Text on stdin -> token ids (JSON) with a model folder's tokenizer", setup};

}  // namespace
}  // namespace fp4moe
