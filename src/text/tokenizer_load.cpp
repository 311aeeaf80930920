// tokenizer.json → TokenizerImpl. Every component outside the supported set is an error
// that names it ("tokenizer.json: pre_tokenizer.pretokenizers[2]: type 'Metaspace' is not
// supported ...").
#include <cctype>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "text/tokenizer_impl.hpp"
#include "text/unicode.hpp"

namespace fp4moe::text {

using nlohmann::json;

namespace {

struct Ctx {
  std::string_view origin;
  [[noreturn]] void fail(const std::string& where, const std::string& msg) const {
    FP4MOE_FAIL("{}: {}: {}", one_line(origin), one_line(where), one_line(msg));
  }
  const json& field(const json& obj, const std::string& where, const char* key) const {
    if (!obj.is_object() || !obj.contains(key)) fail(where, fmt::format("missing '{}'", key));
    return obj.at(key);
  }
  bool get_bool(const json& obj, const std::string& where, const char* key, bool dflt) const {
    if (!obj.contains(key) || obj.at(key).is_null()) return dflt;
    if (!obj.at(key).is_boolean()) fail(where, fmt::format("'{}' must be true or false", key));
    return obj.at(key).get<bool>();
  }
  std::string get_string(const json& v, const std::string& where) const {
    if (!v.is_string()) fail(where, "must be a string");
    return v.get<std::string>();
  }
  std::string type_of(const json& obj, const std::string& where) const {
    if (!obj.is_object()) fail(where, "must be an object");
    if (!obj.contains("type")) fail(where, "missing 'type'");
    return get_string(obj.at("type"), where + ".type");
  }
};

std::string escape_literal(std::string_view s) {
  std::string out;
  for (char c : s) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (u < 0x80 && !std::isalnum(u)) out += '\\';
    out += c;
  }
  return out;
}

void load_normalizer(const Ctx& cx, const json& n, const std::string& where, Normalizer& out) {
  if (n.is_null()) return;
  const std::string type = cx.type_of(n, where);
  if (type == "NFC") return out.add(NormalForm::NFC);
  if (type == "NFD") return out.add(NormalForm::NFD);
  if (type == "NFKC") return out.add(NormalForm::NFKC);
  if (type == "NFKD") return out.add(NormalForm::NFKD);
  if (type == "Sequence") {
    const json& list = cx.field(n, where, "normalizers");
    if (!list.is_array()) cx.fail(where + ".normalizers", "must be a list");
    for (size_t i = 0; i < list.size(); ++i)
      load_normalizer(cx, list[i], fmt::format("{}.normalizers[{}]", where, i), out);
    return;
  }
  cx.fail(where, fmt::format("type '{}' is not supported (supported: NFC, NFD, NFKC, NFKD, Sequence)", type));
}

SplitBehavior parse_behavior(const Ctx& cx, const json& v, const std::string& where) {
  const std::string b = cx.get_string(v, where);
  if (b == "Removed") return SplitBehavior::Removed;
  if (b == "Isolated") return SplitBehavior::Isolated;
  if (b == "MergedWithPrevious") return SplitBehavior::MergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::MergedWithNext;
  if (b == "Contiguous") return SplitBehavior::Contiguous;
  cx.fail(where, fmt::format("unknown split behavior '{}'", b));
}

void load_pre_tokenizer(const Ctx& cx, const json& p, const std::string& where, PreTokenizer& out) {
  if (p.is_null()) return;
  const std::string type = cx.type_of(p, where);
  PreTokenizerStep step;
  if (type == "Sequence") {
    const json& list = cx.field(p, where, "pretokenizers");
    if (!list.is_array()) cx.fail(where + ".pretokenizers", "must be a list");
    for (size_t i = 0; i < list.size(); ++i)
      load_pre_tokenizer(cx, list[i], fmt::format("{}.pretokenizers[{}]", where, i), out);
    return;
  }
  try {
    if (type == "Split") {
      step.kind = PreTokenizerStep::Kind::Split;
      const json& pat = cx.field(p, where, "pattern");
      std::string regex;
      if (pat.is_object() && pat.contains("Regex"))
        regex = cx.get_string(pat.at("Regex"), where + ".pattern.Regex");
      else if (pat.is_object() && pat.contains("String"))
        regex = escape_literal(cx.get_string(pat.at("String"), where + ".pattern.String"));
      else
        cx.fail(where + ".pattern", "must be {\"Regex\": ...} or {\"String\": ...}");
      step.regex = std::make_shared<const Regex>(regex, where + " (Split)");
      step.behavior = parse_behavior(cx, cx.field(p, where, "behavior"), where + ".behavior");
      step.invert = cx.get_bool(p, where, "invert", false);
    } else if (type == "Digits") {
      step.kind = PreTokenizerStep::Kind::Digits;
      step.individual_digits = cx.get_bool(p, where, "individual_digits", false);
    } else if (type == "ByteLevel") {
      step.kind = PreTokenizerStep::Kind::ByteLevel;
      step.add_prefix_space = cx.get_bool(p, where, "add_prefix_space", true);
      if (cx.get_bool(p, where, "use_regex", true)) step.regex = gpt2_regex();
    } else {
      cx.fail(where, fmt::format("type '{}' is not supported (supported: Sequence, Split, ByteLevel, Digits)", type));
    }
    out.add(std::move(step));
  } catch (const Error& e) {
    if (std::string_view(e.what()).starts_with(cx.origin)) throw;
    FP4MOE_FAIL("{}: {}", cx.origin, one_line(e.what()));  // the message names the step already
  }
}

BpeModel load_model(const Ctx& cx, const json& m) {
  const std::string where = "model";
  if (!m.is_object()) cx.fail(where, "must be an object");
  if (m.contains("type") && cx.get_string(m.at("type"), "model.type") != "BPE")
    cx.fail(where, fmt::format("type '{}' is not supported (supported: BPE)", m.at("type").get<std::string>()));
  if (m.contains("dropout") && !m.at("dropout").is_null()) {
    if (!m.at("dropout").is_number()) cx.fail("model.dropout", "must be a number or null");
    if (m.at("dropout").get<double>() != 0.0) cx.fail("model.dropout", "BPE dropout is not supported (must be null or 0)");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (m.contains(key) && !m.at(key).is_null() && !cx.get_string(m.at(key), std::string("model.") + key).empty())
      cx.fail(std::string("model.") + key, "is not supported by byte-level BPE (must be null)");
  }
  if (cx.get_bool(m, where, "byte_fallback", false)) cx.fail("model.byte_fallback", "is not supported (must be false)");
  BpeOptions opt;
  if (m.contains("unk_token") && !m.at("unk_token").is_null()) opt.unk_token = cx.get_string(m.at("unk_token"), "model.unk_token");
  opt.fuse_unk = cx.get_bool(m, where, "fuse_unk", false);
  opt.ignore_merges = cx.get_bool(m, where, "ignore_merges", false);

  const json& v = cx.field(m, where, "vocab");
  if (!v.is_object()) cx.fail("model.vocab", "must be an object of token -> id");
  Vocab vocab;
  vocab.reserve(v.size());
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (!it.value().is_number_integer()) cx.fail("model.vocab", fmt::format("id of {:?} is not an integer", it.key()));
    const int64_t id = it.value().get<int64_t>();
    if (id < 0 || id >= (int64_t(1) << 24)) cx.fail("model.vocab", fmt::format("id {} of {:?} is out of range", id, it.key()));
    vocab[it.key()] = int32_t(id);
  }
  const json& ms = cx.field(m, where, "merges");
  if (!ms.is_array()) cx.fail("model.merges", "must be a list");
  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve(ms.size());
  for (size_t i = 0; i < ms.size(); ++i) {
    const json& e = ms[i];
    if (e.is_string()) {  // "a b"
      const std::string& line = e.get_ref<const std::string&>();
      if (line.starts_with("#version")) continue;
      const size_t sp = line.find(' ');
      if (sp == std::string::npos || line.find(' ', sp + 1) != std::string::npos)
        cx.fail(fmt::format("model.merges[{}]", i), fmt::format("{:?} is not two tokens separated by one space", line));
      merges.emplace_back(line.substr(0, sp), line.substr(sp + 1));
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {  // ["a", "b"]
      merges.emplace_back(e[0].get<std::string>(), e[1].get<std::string>());
    } else {
      cx.fail(fmt::format("model.merges[{}]", i), "must be \"a b\" or [\"a\", \"b\"]");
    }
  }
  try {
    return BpeModel(std::move(vocab), merges, opt);
  } catch (const Error& e) {
    FP4MOE_FAIL("{}: {}", cx.origin, one_line(e.what()));  // "model.merges[3]: ..."
  }
}

std::vector<AddedToken> parse_added_tokens(const Ctx& cx, const json& list) {
  std::vector<AddedToken> out;
  if (list.is_null()) return out;
  if (!list.is_array()) cx.fail("added_tokens", "must be a list");
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string where = fmt::format("added_tokens[{}]", i);
    const json& t = list[i];
    AddedToken a;
    a.content = cx.get_string(cx.field(t, where, "content"), where + ".content");
    if (t.contains("id")) {
      if (!t.at("id").is_number_integer()) cx.fail(where + ".id", "must be an integer");
      const int64_t id = t.at("id").get<int64_t>();
      if (id < 0 || id >= (int64_t(1) << 24)) cx.fail(where + ".id", fmt::format("{} is out of range", id));
      a.id = int32_t(id);
    }
    a.special = cx.get_bool(t, where, "special", false);
    a.single_word = cx.get_bool(t, where, "single_word", false);
    a.lstrip = cx.get_bool(t, where, "lstrip", false);
    a.rstrip = cx.get_bool(t, where, "rstrip", false);
    a.normalized = cx.get_bool(t, where, "normalized", !a.special);
    out.push_back(std::move(a));
  }
  return out;
}

// Template pieces in the array form [{"SpecialToken": {"id": "<s>", ...}}, {"Sequence": {"id": "A"}}]
// or the string form "<s> $A".
std::vector<TemplatePiece> parse_template(const Ctx& cx, const json& single, const json& specials,
                                          const std::string& where) {
  std::vector<std::string> names;  // "" for the sequence
  if (single.is_string()) {
    const std::string s = single.get<std::string>();
    size_t i = 0;
    while (i < s.size()) {
      while (i < s.size() && s[i] == ' ') ++i;
      size_t j = i;
      while (j < s.size() && s[j] != ' ') ++j;
      if (j > i) {
        std::string piece = s.substr(i, j - i);
        if (const size_t colon = piece.rfind(':'); colon != std::string::npos && colon > 0) piece.resize(colon);
        if (piece.starts_with('$')) {
          if (piece == "$B" || piece == "$b") cx.fail(where, "only single-sequence templates are supported");
          piece.clear();
        }
        names.push_back(piece);
      }
      i = j;
    }
  } else if (single.is_array()) {
    for (const json& p : single) {
      if (p.is_object() && p.contains("Sequence")) {
        const json& seq = p.at("Sequence");
        if (seq.is_object() && seq.contains("id") && seq.at("id") == "B")
          cx.fail(where, "only single-sequence templates are supported");
        names.emplace_back();
      } else if (p.is_object() && p.contains("SpecialToken") && p.at("SpecialToken").is_object()) {
        names.push_back(cx.get_string(cx.field(p.at("SpecialToken"), where, "id"), where + ".SpecialToken.id"));
      } else {
        cx.fail(where, "a piece must be {\"Sequence\": ...} or {\"SpecialToken\": ...}");
      }
    }
  } else {
    cx.fail(where, "must be a list or a string");
  }
  std::vector<TemplatePiece> out;
  for (const std::string& name : names) {
    TemplatePiece piece;
    if (name.empty()) {
      piece.is_sequence = true;
    } else {
      if (!specials.is_object() || !specials.contains(name))
        cx.fail(where, fmt::format("special token {:?} is missing from special_tokens", name));
      const json& ids = cx.field(specials.at(name), "post_processor.special_tokens", "ids");
      if (!ids.is_array()) cx.fail("post_processor.special_tokens", "'ids' must be a list");
      for (const json& id : ids) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= (int64_t(1) << 24))
          cx.fail("post_processor.special_tokens", fmt::format("bad id in {:?}", name));
        piece.ids.push_back(int32_t(id.get<int64_t>()));
      }
    }
    out.push_back(std::move(piece));
  }
  return out;
}

void load_post_processor(const Ctx& cx, const json& p, const std::string& where, TokenizerImpl& impl) {
  if (p.is_null()) return;
  impl.has_post_processor = true;
  const std::string type = cx.type_of(p, where);
  if (type == "ByteLevel") return;  // offsets only
  if (type == "TemplateProcessing") {
    const json specials = p.contains("special_tokens") ? p.at("special_tokens") : json::object();
    impl.post_templates.push_back(parse_template(cx, cx.field(p, where, "single"), specials, where + ".single"));
    return;
  }
  if (type == "Sequence") {
    const json& list = cx.field(p, where, "processors");
    if (!list.is_array()) cx.fail(where + ".processors", "must be a list");
    for (size_t i = 0; i < list.size(); ++i)
      load_post_processor(cx, list[i], fmt::format("{}.processors[{}]", where, i), impl);
    return;
  }
  cx.fail(where, fmt::format("type '{}' is not supported (supported: TemplateProcessing, ByteLevel, Sequence)", type));
}

DecoderKind load_decoder(const Ctx& cx, const json& d) {
  if (d.is_null()) return DecoderKind::None;
  const std::string type = cx.type_of(d, "decoder");
  if (type == "ByteLevel") return DecoderKind::ByteLevel;
  if (type == "Sequence") {
    const json& list = cx.field(d, "decoder", "decoders");
    if (list.is_array() && list.size() == 1 && list[0].is_object() && list[0].value("type", "") == "ByteLevel")
      return DecoderKind::ByteLevel;
    cx.fail("decoder", "a Sequence decoder is supported only as [ByteLevel]");
  }
  cx.fail("decoder", fmt::format("type '{}' is not supported (supported: ByteLevel)", type));
}

}  // namespace

std::unique_ptr<TokenizerImpl> load_tokenizer_json(std::string_view text, std::string_view origin) {
  const Ctx cx{origin};
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    FP4MOE_FAIL("{}: not valid JSON: {}", origin, one_line(e.what()));
  }
  if (!j.is_object()) FP4MOE_FAIL("{}: not a JSON object", origin);
  if (j.contains("truncation") && !j.at("truncation").is_null())
    cx.fail("truncation", "is not supported (must be null)");
  if (j.contains("padding") && !j.at("padding").is_null()) {
    const json& pad = j.at("padding");
    if (!(pad.is_object() && pad.contains("strategy") && pad.at("strategy") == "BatchLongest"))
      cx.fail("padding", "only null or the BatchLongest strategy is supported");
  }
  auto impl = std::make_unique<TokenizerImpl>();
  impl->origin = std::string(origin);
  try {
    load_normalizer(cx, j.value("normalizer", json()), "normalizer", impl->normalizer);
    load_pre_tokenizer(cx, j.value("pre_tokenizer", json()), "pre_tokenizer", impl->pre_tokenizer);
    impl->model = std::make_unique<BpeModel>(load_model(cx, cx.field(j, "tokenizer", "model")));
    load_post_processor(cx, j.value("post_processor", json()), "post_processor", *impl);
    impl->decoder = load_decoder(cx, j.value("decoder", json()));
    const std::vector<AddedToken> declared = parse_added_tokens(cx, j.value("added_tokens", json()));
    const std::vector<int32_t> given = impl->added.add(declared, *impl->model, impl->normalizer);
    // tokenizers gives an added token its vocabulary id, else the next id after the
    // vocabulary, whatever "id" says (it only logs a warning). An id that differs would
    // silently change which embedding row the token reaches, so it is a load error here.
    for (size_t i = 0; i < declared.size(); ++i)
      if (declared[i].id >= 0 && given[i] >= 0 && given[i] != declared[i].id)
        cx.fail(fmt::format("added_tokens[{}].id", i),
                fmt::format("{} for {:?}, but the token gets id {} (an added token's id is its vocabulary id, else the "
                            "next id after the vocabulary and the added tokens before it)",
                            declared[i].id, declared[i].content, given[i]));
    // tokenizers adds the post-processor's ids unchecked; an id the vocabulary does not
    // have would reach the model, so it is a load error here.
    for (const auto& tmpl : impl->post_templates)
      for (const TemplatePiece& piece : tmpl)
        for (int32_t id : piece.ids)
          if (!impl->model->id_to_token(id) && !impl->added.by_id(id))
            cx.fail("post_processor", fmt::format("special token id {} is not in the vocabulary", id));
  } catch (const json::exception& e) {
    FP4MOE_FAIL("{}: unexpected JSON structure: {}", origin, one_line(e.what()));
  }
  return impl;
}

}  // namespace fp4moe::text
