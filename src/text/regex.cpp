#include "text/regex.hpp"

#include <pcre2.h>

#include "core/error.hpp"

namespace fp4moe::text {

namespace {

bool is_hex(char c) { return (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'f'); }

// Per-thread match state: match data and a JIT stack big enough for long inputs.
struct MatchState {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;
  MatchState() {
    data = pcre2_match_data_create(8, nullptr);
    context = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, nullptr);
    if (!data || !context || !stack) FP4MOE_FAIL("out of memory creating PCRE2 match state");
    pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~MatchState() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

MatchState& match_state() {
  thread_local MatchState state;
  return state;
}

}  // namespace

std::string oniguruma_to_pcre2(std::string_view p, std::string_view what) {
  // Unicode White_Space, spelled out: PCRE2's \s also takes U+180E and leaves out U+0085.
  constexpr std::string_view kSpaceClass =
      "\\t\\n\\x0B\\f\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";
  constexpr std::string_view kWordClass = "\\p{L}\\p{M}\\p{Nd}\\p{Pc}";
  const auto cls = [](std::string_view body, bool negate) { return std::string(negate ? "[^" : "[") + std::string(body) + "]"; };
  std::string out;
  out.reserve(p.size() + 16);
  int class_depth = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\') {
      FP4MOE_CHECK(i + 1 < p.size(), "{}: regex ends with a lone backslash: {:?}", what, p);
      const char e = p[++i];
      const bool in_class = class_depth > 0;
      switch (e) {
        case 's': out += in_class ? std::string(kSpaceClass) : cls(kSpaceClass, false); break;
        case 'w': out += in_class ? std::string(kWordClass) : cls(kWordClass, false); break;
        case 'h': out += in_class ? "0-9a-fA-F" : "[0-9a-fA-F]"; break;
        case 'S': case 'W': case 'H':
          FP4MOE_CHECK(!in_class, "{}: regex uses \\{} inside a bracket class, which has no PCRE2 equivalent: {:?}",
                       what, e, p);
          out += e == 'S' ? cls(kSpaceClass, true) : e == 'W' ? cls(kWordClass, true) : "[^0-9a-fA-F]";
          break;
        case 'u':
          if (i + 4 < p.size() && is_hex(p[i + 1]) && is_hex(p[i + 2]) && is_hex(p[i + 3]) && is_hex(p[i + 4])) {
            out += "\\x{" + std::string(p.substr(i + 1, 4)) + "}";
            i += 4;
          } else {
            FP4MOE_FAIL("{}: regex has a \\u escape without four hex digits: {:?}", what, p);
          }
          break;
        default:
          out += '\\';
          out += e;
          // Keep \p{..}, \x{..} and the like verbatim (braces are not class brackets).
          break;
      }
      continue;
    }
    if (c == '[') {
      // A '[' opens a class (or a nested set inside one); a "]" right after "[" or "[^"
      // is a literal. POSIX classes [:alpha:] are copied whole.
      if (class_depth > 0 && i + 1 < p.size() && p[i + 1] == ':') {
        const size_t close = p.find(":]", i + 2);
        if (close != std::string_view::npos) {
          out += p.substr(i, close + 2 - i);
          i = close + 1;
          continue;
        }
      }
      ++class_depth;
      out += c;
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (c == ']' && class_depth > 0) --class_depth;
    FP4MOE_CHECK(!(class_depth > 0 && c == '&' && i + 1 < p.size() && p[i + 1] == '&'),
                 "{}: regex uses a class intersection (&&), which PCRE2 does not support: {:?}", what, p);
    out += c;
  }
  return out;
}

Regex::Regex(std::string_view pattern, std::string_view what) : pattern_(pattern), scanner_(scanner_for(pattern)) {
  const std::string translated = oniguruma_to_pcre2(pattern, what);
  int err = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &err, &offset, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    FP4MOE_FAIL("{}: bad regex at offset {}: {} (pattern {:?})", what, size_t(offset), reinterpret_cast<char*>(msg),
                std::string(pattern));
  }
  // JIT is an optimization: where it is unavailable PCRE2's interpreter runs instead.
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  code_ = code;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

bool Regex::search(std::string_view s, size_t from, size_t* begin, size_t* end) const {
  MatchState& st = match_state();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
  const auto* code = static_cast<pcre2_code*>(code_);
  const int rc = jit_ ? pcre2_jit_match(code, subject, s.size(), from, 0, st.data, st.context)
                      : pcre2_match(code, subject, s.size(), from, PCRE2_NO_UTF_CHECK, st.data, st.context);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(rc, msg, sizeof(msg));
    FP4MOE_FAIL("regex match failed: {} (pattern {:?})", reinterpret_cast<char*>(msg), pattern_);
  }
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.data);
  *begin = ov[0];
  *end = ov[1];
  // \K or lookbehind tricks can report a match that ends before it starts; never split so.
  if (*end < *begin) *end = *begin;
  return true;
}

size_t Regex::char_len(std::string_view s, size_t i) {
  const unsigned char b = static_cast<unsigned char>(s[i]);
  return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
}

}  // namespace fp4moe::text
