#include "text/jinja/pystr.hpp"

#include <algorithm>

#include "text/jinja/value.hpp"
#include "text/unicode.hpp"

namespace fp4moe::text::jinja::pystr {

namespace {

// A list of pieces grows: each piece costs its bytes plus a string and a Json node (~96 bytes)
// once it is a value. Checked against the render's budget as it grows.
void piece_added(const std::vector<std::string>& out, size_t* bytes) {
  *bytes += 96 + out.back().size();
  if ((out.size() & 255) == 0) need_bytes(*bytes);
}

bool in_set(char32_t cp, const std::vector<char32_t>& set) { return std::find(set.begin(), set.end(), cp) != set.end(); }

bool is_line_break(char32_t cp) {
  return cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C || cp == 0x1C || cp == 0x1D || cp == 0x1E ||
         cp == 0x85 || cp == 0x2028 || cp == 0x2029;
}

}  // namespace

std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right) {
  const std::vector<char32_t> set = chars ? code_points(*chars) : std::vector<char32_t>{};
  const auto strippable = [&](char32_t cp) { return chars ? in_set(cp, set) : is_python_space(cp); };
  size_t b = 0, e = s.size();
  if (left) {
    while (b < e) {
      size_t j = b;
      if (!strippable(next_code_point(s, j))) break;
      b = j;
    }
  }
  if (right) {
    while (e > b) {
      size_t k;
      if (!strippable(prev_code_point(s, e, &k))) break;
      e = k;
    }
  }
  return std::string(s.substr(b, e - b));
}

std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit) {
  std::vector<std::string> out;
  size_t bytes = 0;
  if (sep) {
    if (sep->empty()) fail("ValueError: empty separator");
    size_t start = 0;
    while (maxsplit < 0 || int64_t(out.size()) < maxsplit) {
      const size_t at = s.find(*sep, start);
      if (at == std::string_view::npos) break;
      out.emplace_back(s.substr(start, at - start));
      piece_added(out, &bytes);
      start = at + sep->size();
    }
    out.emplace_back(s.substr(start));
    piece_added(out, &bytes);
    return out;
  }
  size_t i = 0;
  const auto skip_space = [&] {
    while (i < s.size()) {
      size_t j = i;
      if (!is_python_space(next_code_point(s, j))) break;
      i = j;
    }
  };
  while (true) {
    skip_space();
    if (i >= s.size()) break;
    if (maxsplit >= 0 && int64_t(out.size()) == maxsplit) {
      out.emplace_back(s.substr(i));  // the rest, trailing whitespace kept
      piece_added(out, &bytes);
      break;
    }
    const size_t start = i;
    while (i < s.size()) {
      size_t j = i;
      if (is_python_space(next_code_point(s, j))) break;
      i = j;
    }
    out.emplace_back(s.substr(start, i - start));
    piece_added(out, &bytes);
  }
  return out;
}

std::vector<std::string> rsplit(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit) {
  std::vector<std::string> out;
  size_t bytes = 0;
  if (sep) {
    if (sep->empty()) fail("ValueError: empty separator");
    size_t end = s.size();
    while (maxsplit < 0 || int64_t(out.size()) < maxsplit) {
      if (end < sep->size()) break;
      const size_t at = s.rfind(*sep, end - sep->size());
      if (at == std::string_view::npos) break;
      out.emplace_back(s.substr(at + sep->size(), end - at - sep->size()));
      piece_added(out, &bytes);
      end = at;
    }
    out.emplace_back(s.substr(0, end));
    piece_added(out, &bytes);
    std::reverse(out.begin(), out.end());
    return out;
  }
  size_t e = s.size();
  const auto skip_space = [&] {
    while (e > 0) {
      size_t k;
      if (!is_python_space(prev_code_point(s, e, &k))) break;
      e = k;
    }
  };
  while (true) {
    skip_space();
    if (e == 0) break;
    if (maxsplit >= 0 && int64_t(out.size()) == maxsplit) {
      out.emplace_back(s.substr(0, e));
      piece_added(out, &bytes);
      break;
    }
    const size_t end = e;
    while (e > 0) {
      size_t k;
      if (is_python_space(prev_code_point(s, e, &k))) break;
      e = k;
    }
    out.emplace_back(s.substr(e, end - e));
    piece_added(out, &bytes);
  }
  std::reverse(out.begin(), out.end());
  return out;
}

std::vector<std::string> splitlines(std::string_view s, bool keepends) {
  std::vector<std::string> out;
  size_t bytes = 0;
  size_t start = 0, i = 0;
  while (i < s.size()) {
    size_t j = i;
    const char32_t cp = next_code_point(s, j);
    if (!is_line_break(cp)) {
      i = j;
      continue;
    }
    size_t eol = j;
    if (cp == '\r' && eol < s.size() && s[eol] == '\n') ++eol;
    out.emplace_back(s.substr(start, (keepends ? eol : i) - start));
    piece_added(out, &bytes);
    start = i = eol;
  }
  if (start < s.size()) {
    out.emplace_back(s.substr(start));
    piece_added(out, &bytes);
  }
  return out;
}

std::string replace(std::string_view s, std::string_view old, std::string_view repl, int64_t count) {
  std::string out;
  if (old.empty()) {  // insert repl before every character and at the end
    int64_t n = 0;
    size_t i = 0;
    while (i <= s.size()) {
      if (count >= 0 && n >= count) {
        out.append(s.substr(i));
        return out;
      }
      out.append(repl);
      need_bytes(out.size());
      ++n;
      if (i == s.size()) break;
      size_t j = i;
      next_code_point(s, j);
      out.append(s.substr(i, j - i));
      i = j;
    }
    return out;
  }
  size_t start = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    const size_t at = s.find(old, start);
    if (at == std::string_view::npos) break;
    out.append(s.substr(start, at - start)).append(repl);
    need_bytes(out.size());
    start = at + old.size();
    ++n;
  }
  out.append(s.substr(start));
  return out;
}

std::string lower(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size();) append_utf8(out, simple_lower(next_code_point(s, i)));
  return out;
}

std::string upper(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size();) append_utf8(out, simple_upper(next_code_point(s, i)));
  return out;
}

std::string title(std::string_view s) {
  std::string out;
  bool prev_cased = false;
  for (size_t i = 0; i < s.size();) {
    const char32_t cp = next_code_point(s, i);
    append_utf8(out, prev_cased ? simple_lower(cp) : simple_title(cp));
    prev_cased = is_cased_letter(cp);
  }
  return out;
}

std::string capitalize(std::string_view s) {
  std::string out;
  bool first = true;
  for (size_t i = 0; i < s.size();) {
    const char32_t cp = next_code_point(s, i);
    append_utf8(out, first ? simple_title(cp) : simple_lower(cp));
    first = false;
  }
  return out;
}

std::string jinja_title(std::string_view s) {
  // Words start after runs of [-\s({[<]; each word: first character upper, the rest lower.
  const auto is_delim = [](char32_t cp) {
    return cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || is_python_space(cp);
  };
  std::string out;
  bool word_start = true;
  for (size_t i = 0; i < s.size();) {
    const char32_t cp = next_code_point(s, i);
    if (is_delim(cp)) {
      append_utf8(out, cp);
      word_start = true;
      continue;
    }
    append_utf8(out, word_start ? simple_upper(cp) : simple_lower(cp));
    word_start = false;
  }
  return out;
}

int64_t find(std::string_view s, std::string_view sub, bool reverse) {
  const size_t at = reverse ? s.rfind(sub) : s.find(sub);
  if (at == std::string_view::npos) return -1;
  return int64_t(code_point_count(s.substr(0, at)));
}

int64_t count(std::string_view s, std::string_view sub) {
  if (sub.empty()) return int64_t(code_point_count(s)) + 1;
  int64_t n = 0;
  for (size_t at = s.find(sub); at != std::string_view::npos; at = s.find(sub, at + sub.size())) ++n;
  return n;
}

namespace {

template <typename Pred>
bool all_of_cps(std::string_view s, Pred p) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size();)
    if (!p(next_code_point(s, i))) return false;
  return true;
}

// Python's isupper/islower: at least one cased character, and no cased character of the
// other case.
bool cased_all(std::string_view s, bool want_upper) {
  bool any = false;
  for (size_t i = 0; i < s.size();) {
    const char32_t cp = next_code_point(s, i);
    if (!is_cased_letter(cp)) continue;
    const bool up = simple_lower(cp) != cp;
    const bool low = simple_upper(cp) != cp;
    if (want_upper ? low : up) return false;
    any = any || (want_upper ? up : low);
  }
  return any;
}

}  // namespace

bool is_digit(std::string_view s) {
  return all_of_cps(s, [](char32_t cp) { return is_numeric(cp) && simple_lower(cp) == cp; });
}
bool is_alpha(std::string_view s) { return all_of_cps(s, [](char32_t cp) { return is_letter(cp); }); }
bool is_alnum(std::string_view s) {
  return all_of_cps(s, [](char32_t cp) { return is_letter(cp) || is_numeric(cp); });
}
bool is_space(std::string_view s) { return all_of_cps(s, [](char32_t cp) { return is_python_space(cp); }); }
bool is_upper(std::string_view s) { return cased_all(s, true); }
bool is_lower(std::string_view s) { return cased_all(s, false); }

}  // namespace fp4moe::text::jinja::pystr
