#!/usr/bin/env python3
"""Fixes applied to xgrammar 0.2.9's unpacked source distribution (setup.sh --deps runs it).

    patch_xgrammar.py XGRAMMAR_DIR

Each fix is an exact text replacement that must match once (the script fails otherwise, so a
new xgrammar version is looked at again). Both were found by this repository's tests:
1. tokenizer_info.cc: the vocabulary's pseudo-trie took a token as inside another's subtree
   when it merely CONTAINED it (std::string::find) instead of starting with it: rejecting `":`
   also rejected the tokens sorted after it that contain `":` (e.g. `"k":`), an over-strict mask
   (tests/grammar/grammar_mask_test.cpp, against a brute force over the vocabulary).
2. json_schema_converter.cc: a string with minLength / maxLength allowed raw control characters
   U+0000-U+001F (other than CR, LF), which JSON forbids unescaped; the class now excludes them
   as the unbounded string's does (tests/serve/structured_output_e2e_test.py, json.loads).
"""
import os
import sys

FIXES = [
    ("cpp/tokenizer_info.cc",
     "(token.find(prefix_stack.top().first) == std::string::npos)",
     "(token.rfind(prefix_stack.top().first, 0) != 0)"),
    ("cpp/json_schema_converter.cc",
     "builder_.AddCharacterClass({{'\"', '\"'}, {'\\\\', '\\\\'}, {'\\r', '\\r'}, {'\\n', '\\n'}}, true);\n"
     "      int32_t body = Repeat(rule_name + \"_characters\"",
     "builder_.AddCharacterClass({{0, 0x1f}, {'\"', '\"'}, {'\\\\', '\\\\'}, {'\\r', '\\r'}, {'\\n', '\\n'}}, true);\n"
     "      int32_t body = Repeat(rule_name + \"_characters\""),
]

root = sys.argv[1]
for path, old, new in FIXES:
    p = os.path.join(root, path)
    text = open(p, encoding="utf-8").read()
    if text.count(old) != 1:
        sys.exit(f"patch_xgrammar.py: {path}: the text to fix occurs {text.count(old)} times, not once")
    open(p, "w", encoding="utf-8").write(text.replace(old, new))
print(f"patch_xgrammar.py: {len(FIXES)} fixes applied to {root}")
