// Hand-written scanners for the pre-tokenizer regexes most byte-level BPE models ship, used
// by Regex instead of PCRE2 when the pattern is one of them (5-10x faster). Each gives the
// same matches as the regex (tests/text/regex_scanner_test.cpp compares them with PCRE2 on
// random text):
//   kGpt4    (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//            (GLM-4.5/5, Llama 3, cl100k)
//   kQwen    the same with \p{N} instead of \p{N}{1,3} (Qwen2 / Qwen3)
//   kGpt2    's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// Every position of a text starts a match of these patterns, so matches tile the text.
#pragma once

#include <cstddef>
#include <string_view>

namespace fp4moe::text {

enum class ScannerKind { None, Gpt4, Qwen, Gpt2 };
inline constexpr ScannerKind kScanners[] = {ScannerKind::Gpt4, ScannerKind::Qwen, ScannerKind::Gpt2};

// The scanner for an Oniguruma pattern, or None.
ScannerKind scanner_for(std::string_view pattern);
// The pattern a scanner stands for (empty for None).
std::string_view scanner_pattern(ScannerKind kind);

// End of the match that starts at s[i] (i < s.size(), s valid UTF-8).
size_t scan_match(ScannerKind kind, std::string_view s, size_t i);

}  // namespace fp4moe::text
