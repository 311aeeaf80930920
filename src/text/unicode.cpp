#include "text/unicode.hpp"

#include <cstdlib>
#include <cstring>
#include <vector>

#include <utf8proc.h>

#include "core/error.hpp"

namespace fp4moe::text {

int utf8_step(std::string_view s, size_t i, bool* incomplete) {
  if (incomplete) *incomplete = false;
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char b0 = b(i);
  if (b0 < 0x80) return 1;
  int need;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return -1;
  }
  for (int k = 1; k <= need; ++k) {
    if (i + k >= s.size()) {
      if (incomplete) *incomplete = true;
      return -k;
    }
    const unsigned char c = b(i + k);
    const bool ok = k == 1 ? (c >= lo && c <= hi) : (c >= 0x80 && c <= 0xBF);
    if (!ok) return -k;
  }
  return need + 1;
}

bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    // ASCII runs 8 bytes at a time.
    while (i + 8 <= n) {
      uint64_t w;
      std::memcpy(&w, s.data() + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    const int step = utf8_step(s, i);
    if (step < 0) return false;
    i += size_t(step);
  }
  return true;
}

void append_lossy_utf8(std::string& out, std::string_view s) {
  size_t i = 0, run = 0;  // [run, i) is valid and not yet copied
  while (i < s.size()) {
    const int step = utf8_step(s, i);
    if (step > 0) {
      i += size_t(step);
      continue;
    }
    out.append(s.data() + run, i - run);
    out += "\xEF\xBF\xBD";
    i += size_t(-step);
    run = i;
  }
  out.append(s.data() + run, s.size() - run);
}

std::string to_valid_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 16);
  append_lossy_utf8(out, s);
  return out;
}

char32_t next_code_point(std::string_view s, size_t& i) {
  const auto b = [&](size_t k) { return char32_t(static_cast<unsigned char>(s[k])); };
  const char32_t b0 = b(i);
  if (b0 < 0x80) {
    i += 1;
    return b0;
  }
  if (b0 < 0xE0) {
    const char32_t cp = ((b0 & 0x1F) << 6) | (b(i + 1) & 0x3F);
    i += 2;
    return cp;
  }
  if (b0 < 0xF0) {
    const char32_t cp = ((b0 & 0x0F) << 12) | ((b(i + 1) & 0x3F) << 6) | (b(i + 2) & 0x3F);
    i += 3;
    return cp;
  }
  const char32_t cp = ((b0 & 0x07) << 18) | ((b(i + 1) & 0x3F) << 12) | ((b(i + 2) & 0x3F) << 6) | (b(i + 3) & 0x3F);
  i += 4;
  return cp;
}

char32_t prev_code_point(std::string_view s, size_t end, size_t* begin) {
  size_t k = end - 1;
  while (k > 0 && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
  *begin = k;
  return next_code_point(s, k);
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

std::string one_line(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == '\n')
      out += "\\n";
    else if (c == '\r')
      out += "\\r";
    else
      out += c;
  }
  return out;
}

// ---- character classes -------------------------------------------------------------------

namespace {
int category(char32_t cp) { return utf8proc_category(utf8proc_int32_t(cp)); }
}  // namespace

bool is_letter(char32_t cp) {
  if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
  const int c = category(cp);
  return c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO;
}

bool is_numeric(char32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  const int c = category(cp);
  return c >= UTF8PROC_CATEGORY_ND && c <= UTF8PROC_CATEGORY_NO;
}

bool is_white_space(char32_t cp) {
  switch (cp) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x20: case 0x85: case 0xA0:
    case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

bool is_rust_word_char(char32_t cp) {
  if (cp < 0x80) return is_letter(cp) || (cp >= '0' && cp <= '9') || cp == '_';
  if (cp == 0x200C || cp == 0x200D) return true;  // Join_Control
  // Other_Alphabetic symbols: circled, parenthesized and squared Latin letters.
  if ((cp >= 0x24B6 && cp <= 0x24E9) || (cp >= 0x1F130 && cp <= 0x1F149) || (cp >= 0x1F150 && cp <= 0x1F169) ||
      (cp >= 0x1F170 && cp <= 0x1F189))
    return true;
  const int c = category(cp);
  return (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_ND) || c == UTF8PROC_CATEGORY_NL ||
         c == UTF8PROC_CATEGORY_PC;
}

bool is_python_space(char32_t cp) {
  if (cp < 0x80) return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20);
  const utf8proc_property_t* p = utf8proc_get_property(utf8proc_int32_t(cp));
  return p->category == UTF8PROC_CATEGORY_ZS || p->bidi_class == UTF8PROC_BIDI_CLASS_B ||
         p->bidi_class == UTF8PROC_BIDI_CLASS_S || p->bidi_class == UTF8PROC_BIDI_CLASS_WS;
}

bool is_python_printable(char32_t cp) {
  if (cp == ' ') return true;
  const int c = category(cp);
  return !(c == UTF8PROC_CATEGORY_CN || c == UTF8PROC_CATEGORY_CC || c == UTF8PROC_CATEGORY_CF ||
           c == UTF8PROC_CATEGORY_CS || c == UTF8PROC_CATEGORY_CO || c == UTF8PROC_CATEGORY_ZS ||
           c == UTF8PROC_CATEGORY_ZL || c == UTF8PROC_CATEGORY_ZP);
}

char32_t simple_lower(char32_t cp) { return char32_t(utf8proc_tolower(utf8proc_int32_t(cp))); }
char32_t simple_upper(char32_t cp) { return char32_t(utf8proc_toupper(utf8proc_int32_t(cp))); }
char32_t simple_title(char32_t cp) { return char32_t(utf8proc_totitle(utf8proc_int32_t(cp))); }

bool is_cased_letter(char32_t cp) {
  const int c = category(cp);
  return c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT;
}

// ---- normalization -----------------------------------------------------------------------

namespace {

// A character that no normalization form changes and that no neighbour can combine with or
// reorder around: the string splits into independent runs at such characters.
bool is_stable(char32_t cp, NormalForm form) {
  if (cp < 0x80) return true;
  const bool compose = form == NormalForm::NFC || form == NormalForm::NFKC;
  const bool compat = form == NormalForm::NFKC || form == NormalForm::NFKD;
  if (compose && !compat && cp < 0x300) return true;  // Latin-1 and Latin Extended are NFC-stable starters
  if ((cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF)) return true;  // CJK ideographs
  if (cp >= 0x1100 && cp <= 0x11FF) return false;     // conjoining jamo (composed algorithmically)
  if (cp >= 0xAC00 && cp <= 0xD7A3) return compose;   // Hangul syllables: NFC-stable, NFD decomposes
  const utf8proc_property_t* p = utf8proc_get_property(utf8proc_int32_t(cp));
  if (p->combining_class != 0) return false;
  if (compose && p->comb_index != UINT16_MAX && p->comb_index >= 0x8000) return false;  // can combine with a previous starter
  if (p->decomp_seqindex != UINT16_MAX && (compat || p->decomp_type == 0)) return false;
  return true;
}

void normalize_run(std::string_view run, NormalForm form, std::string& out) {
  int options = UTF8PROC_STABLE;
  switch (form) {
    case NormalForm::NFC: options |= UTF8PROC_COMPOSE; break;
    case NormalForm::NFD: options |= UTF8PROC_DECOMPOSE; break;
    case NormalForm::NFKC: options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    case NormalForm::NFKD: options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
  }
  utf8proc_uint8_t* dst = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(run.data()),
                                          utf8proc_ssize_t(run.size()), &dst, utf8proc_option_t(options));
  if (n < 0) FP4MOE_FAIL("unicode normalization failed: {}", utf8proc_errmsg(n));
  out.append(reinterpret_cast<const char*>(dst), size_t(n));
  std::free(dst);
}

}  // namespace

namespace {

// is_stable for the Basic Multilingual Plane, one bit per code point and form, computed on
// first use (4 x 8 KiB).
bool is_stable_fast(char32_t cp, NormalForm form) {
  if (cp >= 0x10000) return is_stable(cp, form);
  static const auto tables = [] {
    std::vector<std::vector<uint64_t>> t(4, std::vector<uint64_t>(0x10000 / 64));
    for (int f = 0; f < 4; ++f)
      for (char32_t cp = 0; cp < 0x10000; ++cp)
        if (!(cp >= 0xD800 && cp <= 0xDFFF) && is_stable(cp, NormalForm(f))) t[size_t(f)][cp / 64] |= uint64_t(1) << (cp % 64);
    return t;
  }();
  return (tables[size_t(form)][cp / 64] >> (cp % 64)) & 1;
}

}  // namespace

bool normalize_unicode(std::string_view s, NormalForm form, std::string& out) {
  size_t i = 0, copied = 0;
  bool changed = false;
  size_t prev_start = 0;  // start of the character before i
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      prev_start = i++;
      continue;
    }
    size_t j = i;
    const char32_t cp = next_code_point(s, j);
    if (is_stable_fast(cp, form)) {
      prev_start = i;
      i = j;
      continue;
    }
    // An unstable run [begin, end): from the character before it to the next stable one.
    const size_t begin = i == 0 ? 0 : prev_start;
    size_t end = j;
    while (end < s.size()) {
      size_t k = end;
      if (is_stable_fast(next_code_point(s, k), form)) break;
      end = k;
    }
    if (!changed) {
      out.clear();
      changed = true;
    }
    out.append(s.data() + copied, begin - copied);
    normalize_run(s.substr(begin, end - begin), form, out);
    copied = end;
    i = end;
    prev_start = end;
  }
  if (!changed) return false;
  out.append(s.data() + copied, s.size() - copied);
  if (out == s) return false;
  return true;
}

}  // namespace fp4moe::text
