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
3. earley_parser.cc: a character class matched a multi-byte character by its code point alone,
   so ranges like [0, 0x10FFFF] (every JSON string character) took byte sequences that are not
   UTF-8: the UTF-16 surrogates U+D800-U+DFFF (ED A0..BF xx), overlong forms (C0 80, E0 80 80,
   ...) and code points past U+10FFFF (F4 90 ...): a JSON string argument then failed to parse
   (tests/serve/tool_choice_grammar_test.cpp, random walks). Such a sequence now matches no
   class, positive or negative, from its first byte that rules it out (so the mask never
   offers a dead end); the checks sit in both of the parser's character-class steps (plain and
   starred), hence the two occurrences of each text.
"""
import os
import sys

_UTF8_PARTIAL = ("        int32_t max_codepoint = min_codepoint | ((1 << (6 * remaining_bytes)) - 1);\n\n"
                 "        bool could_match = false;\n")
_UTF8_FIRST = "    int32_t max_codepoint = min_codepoint | ((1 << (6 * (num_bytes - 1))) - 1);\n"
_UTF8_DONE = "      // Check if the UTF8 character is completed.\n      if (new_state.sub_element_id == 0) {\n"
FIXES = [  # (file, old, new, times)
    ("cpp/tokenizer_info.cc",
     "(token.find(prefix_stack.top().first) == std::string::npos)",
     "(token.rfind(prefix_stack.top().first, 0) != 0)", 1),
    ("cpp/json_schema_converter.cc",
     "builder_.AddCharacterClass({{'\"', '\"'}, {'\\\\', '\\\\'}, {'\\r', '\\r'}, {'\\n', '\\n'}}, true);\n"
     "      int32_t body = Repeat(rule_name + \"_characters\"",
     "builder_.AddCharacterClass({{0, 0x1f}, {'\"', '\"'}, {'\\\\', '\\\\'}, {'\\r', '\\r'}, {'\\n', '\\n'}}, true);\n"
     "      int32_t body = Repeat(rule_name + \"_characters\"", 1),
    ("cpp/earley_parser.cc", _UTF8_DONE,
     "      // Check if the UTF8 character is completed (an overlong two-byte form is not UTF-8:\n"
     "      // no class matches it; the longer forms were ruled out at an earlier byte).\n"
     "      if (new_state.sub_element_id == 0 && new_state.partial_codepoint < 0x80) {\n"
     "        return;\n"
     "      }\n"
     "      if (new_state.sub_element_id == 0) {\n", 2),
    ("cpp/earley_parser.cc", _UTF8_PARTIAL,
     "        int32_t max_codepoint = min_codepoint | ((1 << (6 * remaining_bytes)) - 1);\n"
     "        // Not UTF-8 (all surrogates, past U+10FFFF, or an overlong three- or four-byte form):\n"
     "        // no class matches it.\n"
     "        if ((min_codepoint >= 0xD800 && max_codepoint <= 0xDFFF) || min_codepoint > 0x10FFFF ||\n"
     "            (remaining_bytes == 1 && max_codepoint < 0x800) ||\n"
     "            (remaining_bytes == 2 && max_codepoint < 0x10000)) {\n"
     "          return;\n"
     "        }\n"
     "\n"
     "        bool could_match = false;\n", 2),
    ("cpp/earley_parser.cc", _UTF8_FIRST,
     "    int32_t max_codepoint = min_codepoint | ((1 << (6 * (num_bytes - 1))) - 1);\n"
     "    // Not UTF-8 (C0 / C1: overlong two-byte forms; F5-F7: past U+10FFFF): no class matches.\n"
     "    if ((num_bytes == 2 && max_codepoint < 0x80) || min_codepoint > 0x10FFFF) {\n"
     "      return;\n"
     "    }\n", 2),
]

root = sys.argv[1]
for path, old, new, times in FIXES:
    p = os.path.join(root, path)
    text = open(p, encoding="utf-8").read()
    if text.count(old) != times:
        sys.exit(f"patch_xgrammar.py: {path}: the text to fix occurs {text.count(old)} times, not {times}")
    open(p, "w", encoding="utf-8").write(text.replace(old, new))
print(f"patch_xgrammar.py: {len(FIXES)} fixes applied to {root}")
