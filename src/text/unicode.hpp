// UTF-8 and Unicode character classes for text/: decoding, lossy repair, the character
// classes that tokenizers (Rust) and Jinja (Python) semantics need, and NFC.
//
// Character data comes from utf8proc (Debian libutf8proc-dev, Unicode 15.0).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace fp4moe::text {

// Length in bytes of the valid UTF-8 sequence at s[i], or, when the bytes there are not a
// valid sequence, minus the length of the maximal ill-formed subpart (Unicode §3.9 "U+FFFD
// substitution of maximal subparts", the policy of Rust's from_utf8_lossy and Python's
// errors="replace"). `incomplete` is set when the sequence is a valid prefix cut by the end.
int utf8_step(std::string_view s, size_t i, bool* incomplete = nullptr);

bool is_valid_utf8(std::string_view s);

// s with every maximal ill-formed subpart replaced by U+FFFD.
std::string to_valid_utf8(std::string_view s);

// Appends the lossy decoding of `bytes` to out (the same rule as to_valid_utf8).
void append_lossy_utf8(std::string& out, std::string_view bytes);

// Code point at s[i] of a valid UTF-8 string; advances i past it.
char32_t next_code_point(std::string_view s, size_t& i);
// Code point that ends at s[end) of a valid UTF-8 string; sets *begin to its first byte.
char32_t prev_code_point(std::string_view s, size_t end, size_t* begin);

void append_utf8(std::string& out, char32_t cp);

// s with line breaks escaped ("\\n", "\\r"), for one-line error messages quoting input.
std::string one_line(std::string_view s);

// ---- character classes -------------------------------------------------------------------
bool is_letter(char32_t cp);            // \p{L}
bool is_numeric(char32_t cp);           // \p{N}: Rust char::is_numeric (Nd, Nl, No)
bool is_white_space(char32_t cp);       // Unicode White_Space (Rust \s, char::is_whitespace)
bool is_rust_word_char(char32_t cp);    // Rust regex \w (Unicode)
bool is_python_space(char32_t cp);      // Python str.isspace()
bool is_python_printable(char32_t cp);  // Python str.isprintable() for one character
char32_t simple_lower(char32_t cp);
char32_t simple_upper(char32_t cp);
char32_t simple_title(char32_t cp);
bool is_cased_letter(char32_t cp);      // has a case (for Python's title/capitalize)

// Unicode normalization forms (what tokenizers' NFC / NFD / NFKC / NFKD normalizers do).
enum class NormalForm { NFC, NFD, NFKC, NFKD };
// Writes the normalized text to out and returns true, or returns false when s is already
// in the form (out is then unspecified). Runs of characters that no form changes are
// skipped without calling utf8proc, so ASCII and CJK text cost one scan.
bool normalize_unicode(std::string_view s, NormalForm form, std::string& out);

}  // namespace fp4moe::text
