#!/usr/bin/env python3
"""Fixes applied to xgrammar 0.2.9's unpacked source distribution (setup.sh --deps runs it).

    patch_xgrammar.py XGRAMMAR_DIR

Each fix is an exact text replacement that must match as many times as it says (the script
fails otherwise, so a new xgrammar version is looked at again). All were found by this
repository's tests:
1. tokenizer_info.cc: the vocabulary's pseudo-trie took a token as inside another's subtree
   when it merely CONTAINED it (std::string::find) instead of starting with it: rejecting `":`
   also rejected the tokens sorted after it that contain `":` (e.g. `"k":`), an over-strict mask
   (tests/grammar/grammar_mask_test.cpp, against a brute force over the vocabulary).
2. json_schema_converter.cc: a string with minLength / maxLength allowed raw control characters
   U+0000-U+001F (other than CR, LF), which JSON forbids unescaped; the class now excludes them
   as the unbounded string's does (tests/serve/structured_output_e2e_test.py, json.loads).
3. grammar_functor.cc, fsm_builder.cc: a character class's code-point ranges were turned into
   UTF-8 byte ranges straight across the UTF-16 surrogates U+D800-U+DFFF, so [0, 0x10FFFF]
   (every JSON string character) and negated classes ([^<]) took the bytes ED A0..BF xx, which
   are not UTF-8: a JSON string argument then failed to parse
   (tests/serve/tool_choice_grammar_test.cpp, random walks; tests/grammar/grammar_mask_test.cpp
   checks the mask after every kind of lead byte). Both builders now take each range without
   the surrogates.
4. support/encoding.h: an escape's hex digits ("\\x" of any length, "\\U" of 8; the regex
   converter also re-writes an unknown escape such as "\\c" as a \\x escape that runs into the
   hex digits after it) were accumulated into an int32 without a bound: signed overflow (UBSan,
   fuzz/grammar_compile_fuzz.cpp). Past U+10FFFF the escape is now invalid (the parser's existing
   kInvalidEscape, a one-line refusal).
5. json_schema_converter.cc (speed, same language): `format: email` was one regex expanded into
   grammar rules, so at every step inside its domain (`alice@example|`) almost every token that
   starts with a letter or digit was "uncertain" (it may end the domain's nested rules) and
   checked by running the parser over its bytes: ~1 ms per mask on a 150K byte-level vocabulary,
   the whole p99 of `fp4moe bench grammar`. The domain part (after the one `@`; ASCII letters,
   digits, `-` and `.`) is now its own regex rule built as an automaton, whose per-state token
   masks are precomputed; the local part (with its quoted form, which the comment above it says
   must keep the rule expansion) stays as it was, `^(...)$` of the same text. The domain is
   written deterministically, `[A-Za-z0-9](-*[A-Za-z0-9])*(\.[A-Za-z0-9](-*[A-Za-z0-9])+)*`, the
   same language as xgrammar's `[A-Za-z0-9]([\-A-Za-z0-9]*[A-Za-z0-9])?` + `(\.[A-Za-z0-9]
   [\-A-Za-z0-9]*[A-Za-z0-9])*` (a label: a letter or digit, then any hyphens before each further
   letter or digit): xgrammar's automaton path takes the original form wrongly (after
   `example-` it allows `"`: fix 6, found here). Used only when the format's regex is still the
   text this was written for. The JSON string form only (the XML tool-call raw form is not
   reached: serve/ refuses `format` in raw strings). tests/grammar/grammar_email_format_test.cpp
   compares every mask with the old expansion's and with a brute force; `fp4moe bench grammar
   --mask-digest` gives the same hash as before on its workload.
6. fsm.cc: a regex's `?` added an epsilon edge from the group's start to its end, but the start
   of a group that begins with a starred part is re-entered by that loop, so `(b*c)?` accepted
   `b` and the schema pattern `^[a-z]([\-a-z]*[a-z])?$` let `"ab-"` end the string (an output the
   pattern forbids; tests/grammar/grammar_pattern_test.cpp). `?` now adds a new start state,
   accepting, with an epsilon edge to the group's start (as `*` does).
"""
import os
import sys

FIXES = [  # (file, old, new, times)
    ("cpp/tokenizer_info.cc",
     "(token.find(prefix_stack.top().first) == std::string::npos)",
     "(token.rfind(prefix_stack.top().first, 0) != 0)", 1),
    ("cpp/json_schema_converter.cc",
     "builder_.AddCharacterClass({{'\"', '\"'}, {'\\\\', '\\\\'}, {'\\r', '\\r'}, {'\\n', '\\n'}}, true);\n"
     "      int32_t body = Repeat(rule_name + \"_characters\"",
     "builder_.AddCharacterClass({{0, 0x1f}, {'\"', '\"'}, {'\\\\', '\\\\'}, {'\\r', '\\r'}, {'\\n', '\\n'}}, true);\n"
     "      int32_t body = Repeat(rule_name + \"_characters\"", 1),
    ("cpp/fsm_builder.cc",
     "  for (const auto& [low, high] : ranges) {\n"
     "    if (low <= kMax1ByteUnicode) {\n",
     "  for (const auto& [range_low, range_high] : ranges) {\n"
     "   for (int part = 0; part < 2; ++part) {  // UTF-8 has no surrogates: the range without them\n"
     "    const uint32_t low = part == 0 ? range_low : std::max<uint32_t>(range_low, 0xE000);\n"
     "    const uint32_t high = part == 0 ? std::min<uint32_t>(range_high, 0xD7FF) : range_high;\n"
     "    if (low > high) continue;\n"
     "    if (low <= kMax1ByteUnicode) {\n", 1),
    ("cpp/fsm_builder.cc",
     "          *fsm, from, to, CodepointToPackedUTF8(multi_byte_low), CodepointToPackedUTF8(high)\n"
     "      );\n"
     "    }\n"
     "  }\n",
     "          *fsm, from, to, CodepointToPackedUTF8(multi_byte_low), CodepointToPackedUTF8(high)\n"
     "      );\n"
     "    }\n"
     "   }\n"
     "  }\n", 1),
    ("cpp/grammar_functor.cc",
     "  constexpr uint32_t width_ends[] = {0x7F, 0x7FF, 0xFFFF, 0x10FFFF};\n"
     "  for (uint32_t width_end : width_ends) {\n"
     "    if (low <= high && low <= width_end) {\n"
     "      auto end = std::min(high, width_end);\n"
     "      AddCharacterRange(from, to, CodepointToPackedUTF8(low), CodepointToPackedUTF8(end));\n"
     "      low = end + 1;\n"
     "    }\n"
     "  }\n",
     "  // UTF-8 has no surrogates: a range stops at U+D7FF and goes on from U+E000.\n"
     "  constexpr uint32_t width_ends[] = {0x7F, 0x7FF, 0xD7FF, 0xFFFF, 0x10FFFF};\n"
     "  for (uint32_t width_end : width_ends) {\n"
     "    if (low <= high && low <= width_end) {\n"
     "      auto end = std::min(high, width_end);\n"
     "      AddCharacterRange(from, to, CodepointToPackedUTF8(low), CodepointToPackedUTF8(end));\n"
     "      low = end + 1;\n"
     "    }\n"
     "    if (width_end == 0xD7FF && low >= 0xD800 && low <= 0xDFFF) low = 0xE000;\n"
     "  }\n", 1),
    ("cpp/support/encoding.h",
     "      codepoint = codepoint * 16 + digit;\n      ++len;\n",
     "      if (codepoint > 0x10FFFF) return {CharHandlingError::kInvalidEscape, 0};\n"
     "      codepoint = codepoint * 16 + digit;\n      ++len;\n", 1),
    ("cpp/json_schema_converter.cc",
     "      return Sequence({ByteString(\"\\\"\"), RegexExpression(*regex, false, true), ByteString(\"\\\"\")});\n",
     "      // fp4moe: the email's domain as an automaton, written deterministically (same language).\n"
     "      const size_t at = *spec.format == \"email\" ? regex->find(\")@\") : std::string::npos;\n"
     "      if (at != std::string::npos && regex->substr(at + 2) ==\n"
     "          \"([A-Za-z0-9]([\\\\-A-Za-z0-9]*[A-Za-z0-9])?)((\\\\.[A-Za-z0-9][\\\\-A-Za-z0-9]*[A-Za-z0-9])*)$\") {\n"
     "        return Sequence({ByteString(\"\\\"\"), RegexExpression(regex->substr(0, at + 1) + \"$\", false, true),\n"
     "                         ByteString(\"@\"),\n"
     "                         RegexExpression(\"^[A-Za-z0-9](-*[A-Za-z0-9])*(\\\\.[A-Za-z0-9](-*[A-Za-z0-9])+)*$\", false, false),\n"
     "                         ByteString(\"\\\"\")});\n"
     "      }\n"
     "      return Sequence({ByteString(\"\\\"\"), RegexExpression(*regex, false, true), ByteString(\"\\\"\")});\n", 1),
    ("cpp/fsm.cc",
     "  FSM fsm = fsm_.Copy();\n"
     "  if (!ends_.empty()) {\n"
     "    fsm.AddEpsilonEdge(start_, ends_.front());\n"
     "  }\n"
     "  return FSMWithStartEnd(fsm, start_, ends_);\n",
     "  FSM fsm = fsm_.Copy();\n"
     "  // fp4moe: a new accepting start state (the old start may be re-entered by a loop).\n"
     "  const int32_t new_start = fsm.AddState();\n"
     "  fsm.AddEpsilonEdge(new_start, start_);\n"
     "  std::vector<int32_t> ends = ends_;\n"
     "  ends.push_back(new_start);\n"
     "  return FSMWithStartEnd(fsm, new_start, ends);\n", 1),
    ("cpp/support/encoding.h",
     "      codepoint = codepoint * 16 + digit;\n    }\n",
     "      if (codepoint > 0x10FFFF) return {CharHandlingError::kInvalidEscape, 0};\n"
     "      codepoint = codepoint * 16 + digit;\n    }\n", 1),
]

root = sys.argv[1]
for path, old, new, times in FIXES:
    p = os.path.join(root, path)
    text = open(p, encoding="utf-8").read()
    if text.count(old) != times:
        sys.exit(f"patch_xgrammar.py: {path}: the text to fix occurs {text.count(old)} times, not {times}")
    open(p, "w", encoding="utf-8").write(text.replace(old, new))
print(f"patch_xgrammar.py: {len(FIXES)} fixes applied to {root}")
