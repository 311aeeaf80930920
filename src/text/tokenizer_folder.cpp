// Tokenizer::from_dir: tokenizer.json plus what transformers reads around it.
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "text/tokenizer_impl.hpp"

namespace fp4moe::text {

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

constexpr const char* kNamedTokens[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                        "pad_token", "cls_token", "mask_token"};

std::optional<std::string> read_optional(const fs::path& p) {
  std::error_code ec;
  FP4MOE_CHECK(!fs::exists(p, ec) || fs::is_regular_file(p, ec), "{}: not a regular file", p.string());  // a FIFO would block
  if (!fs::is_regular_file(p, ec)) return std::nullopt;
  std::ifstream f(p, std::ios::binary);
  FP4MOE_CHECK(f, "{}: cannot open", p.string());
  std::ostringstream ss;
  ss << f.rdbuf();
  FP4MOE_CHECK(!f.bad(), "{}: read error", p.string());
  return ss.str();
}

json parse_json_file(const fs::path& p, const std::string& text) {
  try {
    json j = json::parse(text);
    FP4MOE_CHECK(j.is_object(), "{}: not a JSON object", p.string());
    return j;
  } catch (const json::exception& e) {
    FP4MOE_FAIL("{}: not valid JSON: {}", p.string(), e.what());
  }
}

// A special token written as "text" or as an AddedToken object {"content": "text", ...}.
std::optional<AddedToken> special_token(const json& v, const std::string& where) {
  if (v.is_null()) return std::nullopt;
  AddedToken t;
  t.special = true;
  t.normalized = false;
  if (v.is_string()) {
    t.content = v.get<std::string>();
    return t;
  }
  FP4MOE_CHECK(v.is_object() && v.contains("content") && v.at("content").is_string(),
               "{}: must be a string or an object with a string 'content'", where);
  t.content = v.at("content").get<std::string>();
  const auto flag = [&](const char* key, bool dflt) {
    if (!v.contains(key) || v.at(key).is_null()) return dflt;
    FP4MOE_CHECK(v.at(key).is_boolean(), "{}.{}: must be true or false", where, key);
    return v.at(key).get<bool>();
  };
  t.single_word = flag("single_word", false);
  t.lstrip = flag("lstrip", false);
  t.rstrip = flag("rstrip", false);
  t.normalized = flag("normalized", false);
  return t;
}

void read_tokenizer_config(TokenizerImpl& impl, const fs::path& p, const json& cfg) {
  const std::string origin = p.string();
  std::vector<AddedToken> to_add;
  for (const char* name : kNamedTokens) {
    if (!cfg.contains(name)) continue;
    if (auto t = special_token(cfg.at(name), origin + ": " + name)) {
      impl.named.push_back(NamedToken{name, t->content, -1});
      to_add.push_back(*t);
    }
  }
  for (const char* key : {"additional_special_tokens", "extra_special_tokens"}) {
    if (!cfg.contains(key) || cfg.at(key).is_null()) continue;
    const json& list = cfg.at(key);
    FP4MOE_CHECK(list.is_array() || list.is_object(), "{}: {} must be a list", origin, key);
    for (const json& v : list)
      if (auto t = special_token(v, origin + ": " + key)) to_add.push_back(*t);
  }
  impl.added.add(to_add, *impl.model, impl.normalizer);
  for (NamedToken& t : impl.named) t.id = impl.token_to_id(t.content);

  for (const char* key : {"add_bos_token", "add_eos_token"}) {
    if (!cfg.contains(key) || cfg.at(key).is_null()) continue;
    FP4MOE_CHECK(cfg.at(key).is_boolean(), "{}: {} must be true or false", origin, key);
    (std::string_view(key) == "add_bos_token" ? impl.add_bos : impl.add_eos) = cfg.at(key).get<bool>();
  }
  if (cfg.contains("chat_template") && !cfg.at("chat_template").is_null()) {
    const json& ct = cfg.at("chat_template");
    if (ct.is_string()) {
      impl.chat_template = ct.get<std::string>();
    } else {
      FP4MOE_CHECK(ct.is_array(), "{}: chat_template must be a string or a list of {{name, template}}", origin);
      for (const json& e : ct) {
        FP4MOE_CHECK(e.is_object() && e.value("name", json()).is_string() && e.value("template", json()).is_string(),
                     "{}: chat_template entries must be {{\"name\": ..., \"template\": ...}}", origin);
        if (e.at("name") == "default") impl.chat_template = e.at("template").get<std::string>();
      }
    }
  }
}

// transformers rebuilds the post-processor as "[bos] $A [eos]" when tokenizer_config.json
// says add_bos_token / add_eos_token, or when tokenizer.json has no post-processor.
void apply_bos_eos_rule(TokenizerImpl& impl, const std::string& origin) {
  if (!(impl.add_bos || impl.add_eos || !impl.has_post_processor)) return;
  std::vector<TemplatePiece> tmpl;
  const auto add_named = [&](const char* name) {
    for (const NamedToken& t : impl.named) {
      if (t.name != name) continue;
      FP4MOE_CHECK(t.id >= 0, "{}: {} {:?} is not a token of this tokenizer", origin, name, t.content);
      tmpl.push_back(TemplatePiece{false, {t.id}});
    }
  };
  if (impl.add_bos.value_or(false)) add_named("bos_token");
  tmpl.push_back(TemplatePiece{true, {}});
  if (impl.add_eos.value_or(false)) add_named("eos_token");
  impl.post_templates.assign(1, std::move(tmpl));
  impl.has_post_processor = true;
}

void read_generation_config(TokenizerImpl& impl, const fs::path& p, const json& cfg) {
  if (!cfg.contains("eos_token_id") || cfg.at("eos_token_id").is_null()) return;
  const json& e = cfg.at("eos_token_id");
  const auto take = [&](const json& v) {
    FP4MOE_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < (int64_t(1) << 31),
                 "{}: eos_token_id must be a token id or a list of token ids", p.string());
    impl.stop_ids.push_back(int32_t(v.get<int64_t>()));
  };
  if (e.is_array())
    for (const json& v : e) take(v);
  else
    take(e);
}

}  // namespace

void load_model_folder_configs(TokenizerImpl& impl, const std::string& dir) {
  const fs::path root(dir);
  const fs::path tc = root / "tokenizer_config.json";
  if (auto text = read_optional(tc)) read_tokenizer_config(impl, tc, parse_json_file(tc, *text));
  apply_bos_eos_rule(impl, tc.string());
  const fs::path gc = root / "generation_config.json";
  if (auto text = read_optional(gc)) read_generation_config(impl, gc, parse_json_file(gc, *text));
  if (const NamedToken* eos = [&]() -> const NamedToken* {
        for (const NamedToken& t : impl.named)
          if (t.name == "eos_token") return &t;
        return nullptr;
      }();
      eos && eos->id >= 0 && std::find(impl.stop_ids.begin(), impl.stop_ids.end(), eos->id) == impl.stop_ids.end())
    impl.stop_ids.push_back(eos->id);
  if (auto text = read_optional(root / "chat_template.jinja")) impl.chat_template = std::move(*text);
}

Tokenizer Tokenizer::from_dir(const std::string& dir) {
  const fs::path root(dir);
  std::error_code ec;
  FP4MOE_CHECK(fs::is_directory(root, ec), "{}: not a directory", dir);
  const fs::path tj = root / "tokenizer.json";
  const auto text = read_optional(tj);
  FP4MOE_CHECK(text.has_value(), "{}: no tokenizer.json (fp4moe reads the tokenizers JSON format only)", dir);
  auto impl = load_tokenizer_json(*text, tj.string());
  load_model_folder_configs(*impl, dir);
  impl->finalize();
  return Tokenizer(std::move(impl));
}

}  // namespace fp4moe::text
