#include "text/jinja/lexer.hpp"

#include <cctype>

#include <fmt/format.h>

#include "text/jinja/value.hpp"
#include "text/unicode.hpp"

namespace fp4moe::text::jinja {

namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || static_cast<unsigned char>(c) >= 0x80;
}
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

// Python's str.isspace on the code point at s[i]; *len gets its byte length.
bool py_space_at(std::string_view s, size_t i, size_t* len) {
  size_t j = i;
  const char32_t cp = next_code_point(s, j);
  *len = j - i;
  return is_python_space(cp);
}

std::string_view rstrip_py(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t b;
    if (!is_python_space(prev_code_point(s, end, &b))) break;
    end = b;
  }
  return s.substr(0, end);
}

bool all_py_space(std::string_view s) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size();) {
    size_t len;
    if (!py_space_at(s, i, &len)) return false;
    i += len;
  }
  return true;
}

size_t skip_py_space(std::string_view s, size_t i) {
  size_t len;
  while (i < s.size() && py_space_at(s, i, &len)) i += len;
  return i;
}

class Lexer {
 public:
  explicit Lexer(std::string_view src) {
    if (!is_valid_utf8(src)) fail("line 1: the template is not valid UTF-8");
    // Newlines to "\n"; one trailing newline dropped (keep_trailing_newline=False).
    src_.reserve(src.size());
    for (size_t i = 0; i < src.size(); ++i) {
      if (src[i] == '\r') {
        src_ += '\n';
        if (i + 1 < src.size() && src[i + 1] == '\n') ++i;
      } else {
        src_ += src[i];
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  std::vector<Token> run() {
    const std::string_view s = src_;
    while (pos_ < s.size()) {
      const size_t tag = find_tag(pos_);
      if (tag == std::string::npos) {
        emit(Tok::Data, std::string(s.substr(pos_)));
        advance_to(s.size());
        break;
      }
      const char kind = s[tag + 1];  // '{', '%', '#'
      size_t after = tag + 2;
      char sign = 0;
      if (after < s.size() && (s[after] == '-' || s[after] == '+')) sign = s[after++];
      std::string_view text = s.substr(pos_, tag - pos_);
      size_t raw_end = 0;
      const bool raw = kind == '%' && match_raw_begin(after, &raw_end);
      text = strip_text(text, sign, kind != '{');
      if (!text.empty()) emit(Tok::Data, std::string(text));
      advance_to(after);
      line_starting_ = false;
      if (raw) {
        lex_raw(raw_end);
      } else if (kind == '#') {
        lex_comment();
      } else {
        lex_tag(kind == '%');
      }
    }
    tokens_.push_back({Tok::End, "", line_});
    return std::move(tokens_);
  }

 private:
  [[noreturn]] void error(const std::string& msg) const { fail(fmt::format("line {}: {}", line_, msg)); }

  void emit(Tok t, std::string v) { tokens_.push_back({t, std::move(v), line_}); }

  void advance_to(size_t p) {
    for (size_t i = pos_; i < p; ++i) line_ += src_[i] == '\n';
    pos_ = p;
  }

  size_t find_tag(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1))
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    return std::string::npos;
  }

  // The text before a tag after whitespace control; lstrip applies to block/comment tags.
  std::string_view strip_text(std::string_view text, char sign, bool lstrip_kind) const {
    if (sign == '-') return rstrip_py(text);
    if (sign == '+' || !lstrip_kind) return text;
    const size_t nl = text.rfind('\n');
    const size_t l_pos = nl == std::string_view::npos ? 0 : nl + 1;
    if ((l_pos > 0 || line_starting_) && all_py_space(text.substr(l_pos))) return text.substr(0, l_pos);
    return text;
  }

  // "{%" sign? \s* "raw" \s* ("-%}" \s* | "%}")
  bool match_raw_begin(size_t p, size_t* end) const {
    const std::string_view s = src_;
    p = skip_py_space(s, p);
    if (s.substr(p, 3) != "raw") return false;
    p = skip_py_space(s, p + 3);
    if (s.substr(p, 3) == "-%}") {
      *end = skip_py_space(s, p + 3);
      return true;
    }
    if (s.substr(p, 2) == "%}") {
      *end = p + 2;
      return true;
    }
    return false;
  }

  void lex_raw(size_t body) {
    const std::string_view s = src_;
    advance_to(body);
    line_starting_ = body > 0 && s[body - 1] == '\n';
    for (size_t i = s.find("{%", body); i != std::string::npos; i = s.find("{%", i + 1)) {
      size_t p = i + 2;
      char sign = 0;
      if (p < s.size() && (s[p] == '-' || s[p] == '+')) sign = s[p++];
      p = skip_py_space(s, p);
      if (s.substr(p, 6) != "endraw") continue;
      p = skip_py_space(s, p + 6);
      size_t end;
      if (!match_block_end(p, &end)) continue;
      const std::string_view text = strip_text(s.substr(body, i - body), sign, true);
      if (!text.empty()) emit(Tok::Data, std::string(text));
      advance_to(end);
      line_starting_ = s[end - 1] == '\n';
      return;
    }
    error("missing end of raw directive");
  }

  // "+%}" | "-%}" \s* | "%}" "\n"?
  bool match_block_end(size_t p, size_t* end) const {
    const std::string_view s = src_;
    if (s.substr(p, 3) == "+%}") {
      *end = p + 3;
      return true;
    }
    if (s.substr(p, 3) == "-%}") {
      *end = skip_py_space(s, p + 3);
      return true;
    }
    if (s.substr(p, 2) == "%}") {
      *end = p + 2 + (p + 2 < s.size() && s[p + 2] == '\n');
      return true;
    }
    return false;
  }

  void lex_comment() {
    const std::string_view s = src_;
    for (size_t k = pos_; k + 1 < s.size(); ++k) {
      size_t end = 0;
      if (s.substr(k, 3) == "+#}") {
        end = k + 3;
      } else if (s.substr(k, 3) == "-#}") {
        end = skip_py_space(s, k + 3);
      } else if (s.substr(k, 2) == "#}") {
        end = k + 2 + (k + 2 < s.size() && s[k + 2] == '\n');
      } else {
        continue;
      }
      advance_to(end);
      line_starting_ = s[end - 1] == '\n';
      return;
    }
    error("missing end of comment tag");
  }

  void lex_tag(bool block) {
    const std::string_view s = src_;
    emit(block ? Tok::BlockBegin : Tok::VarBegin, "");
    std::string balance;
    while (true) {
      if (pos_ >= s.size()) error(block ? "unexpected end of template inside a block tag" : "unexpected end of template inside {{ }}");
      size_t end;
      if (balance.empty()) {
        if (block && match_block_end(pos_, &end)) {
          emit(Tok::BlockEnd, "");
          advance_to(end);
          line_starting_ = s[end - 1] == '\n';
          return;
        }
        if (!block && (s.substr(pos_, 3) == "-}}" || s.substr(pos_, 2) == "}}")) {
          end = s[pos_] == '-' ? skip_py_space(s, pos_ + 3) : pos_ + 2;
          emit(Tok::VarEnd, "");
          advance_to(end);
          line_starting_ = s[end - 1] == '\n';
          return;
        }
      }
      size_t len;
      if (py_space_at(s, pos_, &len)) {
        advance_to(skip_py_space(s, pos_));
        continue;
      }
      const char c = s[pos_];
      if (is_digit(c)) {
        lex_number();
      } else if (is_name_start(c)) {
        size_t e = pos_;
        while (e < s.size() && is_name_char(s[e])) ++e;
        emit(Tok::Name, std::string(s.substr(pos_, e - pos_)));
        advance_to(e);
      } else if (c == '\'' || c == '"') {
        lex_string(c);
      } else {
        lex_operator(balance);
      }
    }
  }

  void lex_number() {
    const std::string_view s = src_;
    const auto digits = [&](size_t p) {  // (\d+_)*\d+ from p; returns the end or p
      size_t e = p;
      while (true) {
        size_t q = e;
        while (q < s.size() && is_digit(s[q])) ++q;
        if (q == e) return e == p ? p : e;
        e = q;
        if (e + 1 < s.size() && s[e] == '_' && is_digit(s[e + 1])) {
          ++e;
          continue;
        }
        return e;
      }
    };
    const size_t p = pos_;
    const bool after_dot = p > 0 && s[p - 1] == '.';
    const size_t int_end = digits(p);
    // float: int ((. frac)? e[+-]? exp | . frac), not right after a '.'
    if (!after_dot) {
      size_t e = int_end;
      size_t frac_end = e;
      if (e < s.size() && s[e] == '.') {
        const size_t f = digits(e + 1);
        if (f > e + 1) frac_end = f;
      }
      size_t exp_end = 0;
      if (frac_end < s.size() && (s[frac_end] | 0x20) == 'e') {
        size_t q = frac_end + 1;
        if (q < s.size() && (s[q] == '+' || s[q] == '-')) ++q;
        const size_t x = digits(q);
        if (x > q) exp_end = x;
      }
      const size_t float_end = exp_end ? exp_end : (frac_end > int_end ? frac_end : 0);
      if (float_end) {
        std::string text;
        for (char ch : s.substr(p, float_end - p))
          if (ch != '_') text += ch;
        emit(Tok::Float, text);
        advance_to(float_end);
        return;
      }
    }
    // integer: 0b / 0o / 0x prefixes, decimal, or zeros
    if (s[p] == '0' && p + 1 < s.size() && std::string_view("bBoOxX").find(s[p + 1]) != std::string_view::npos) {
      const char base = char(s[p + 1] | 0x20);
      size_t e = p + 2;
      std::string text;
      const auto ok = [&](char ch) {
        return base == 'b' ? (ch == '0' || ch == '1') : base == 'o' ? (ch >= '0' && ch <= '7') : std::isxdigit(static_cast<unsigned char>(ch)) != 0;
      };
      while (e < s.size() && (ok(s[e]) || (s[e] == '_' && e + 1 < s.size() && ok(s[e + 1])))) {
        if (s[e] != '_') text += s[e];
        ++e;
      }
      if (!text.empty()) {
        const int radix = base == 'b' ? 2 : base == 'o' ? 8 : 16;
        uint64_t v = 0;
        for (char ch : text) {
          const uint64_t d = uint64_t(ch <= '9' ? ch - '0' : (ch | 0x20) - 'a' + 10);
          if (v > (uint64_t(INT64_MAX) - d) / uint64_t(radix)) error("integer literal too large");
          v = v * uint64_t(radix) + d;
        }
        emit(Tok::Int, std::to_string(v));
        advance_to(e);
        return;
      }
    }
    size_t e = p;
    if (s[p] == '0') {
      ++e;
      while (e + 1 < s.size() && (s[e] == '0' || (s[e] == '_' && s[e + 1] == '0'))) ++e;
      if (e < s.size() && s[e] == '0') ++e;
    } else {
      e = digits(p);
    }
    std::string text;
    for (char ch : s.substr(p, e - p))
      if (ch != '_') text += ch;
    emit(Tok::Int, text);
    advance_to(e);
  }

  void lex_string(char quote) {
    const std::string_view s = src_;
    std::string out;
    size_t i = pos_ + 1;
    while (true) {
      if (i >= s.size()) error(fmt::format("unexpected char '{}' (unterminated string)", quote));
      const char c = s[i];
      if (c == quote) break;
      if (c != '\\') {
        out += c;
        ++i;
        continue;
      }
      if (i + 1 >= s.size()) error("unterminated string");
      const char e = s[i + 1];
      i += 2;
      const auto hex = [&](int n) {
        if (i + size_t(n) > s.size()) error("truncated \\x, \\u or \\U escape");
        uint32_t v = 0;
        for (int k = 0; k < n; ++k) {
          const char h = s[i + size_t(k)];
          if (!std::isxdigit(static_cast<unsigned char>(h))) error("truncated \\x, \\u or \\U escape");
          v = v * 16 + uint32_t(h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
        }
        i += size_t(n);
        if (v > 0x10FFFF) error("illegal Unicode character");
        if (v >= 0xD800 && v <= 0xDFFF) error("surrogate code points are not supported in string literals");
        append_utf8(out, char32_t(v));
      };
      switch (e) {
        case '\n': break;  // line continuation
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'v': out += '\v'; break;
        case 'x': hex(2); break;
        case 'u': hex(4); break;
        case 'U': hex(8); break;
        case 'N': error("\\N{...} escapes are not supported");
        default:
          if (e >= '0' && e <= '7') {
            uint32_t v = uint32_t(e - '0');
            for (int k = 0; k < 2 && i < s.size() && s[i] >= '0' && s[i] <= '7'; ++k) v = v * 8 + uint32_t(s[i++] - '0');
            append_utf8(out, char32_t(v));
          } else {
            out += '\\';
            out += e;
          }
      }
    }
    emit(Tok::String, std::move(out));
    advance_to(i + 1);
  }

  void lex_operator(std::string& balance) {
    const std::string_view s = src_;
    for (std::string_view op : {"//", "**", "==", "!=", ">=", "<="}) {
      if (s.substr(pos_, 2) == op) {
        emit(Tok::Op, std::string(op));
        advance_to(pos_ + 2);
        return;
      }
    }
    const char c = s[pos_];
    if (std::string_view("+-/*%~[](){}=<>.:|,;").find(c) == std::string_view::npos)
      error(fmt::format("unexpected char {:?}", std::string(s.substr(pos_, 1))));
    if (c == '(' || c == '[' || c == '{') balance += c == '(' ? ')' : c == '[' ? ']' : '}';
    if (c == ')' || c == ']' || c == '}') {
      if (balance.empty()) error(fmt::format("unexpected '{}'", c));
      if (balance.back() != c) error(fmt::format("unexpected '{}', expected '{}'", c, balance.back()));
      balance.pop_back();
    }
    emit(Tok::Op, std::string(1, c));
    advance_to(pos_ + 1);
  }

  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> tokenize(std::string_view source) { return Lexer(source).run(); }

}  // namespace fp4moe::text::jinja
