#!/usr/bin/env python3
"""Checks that a reorganised Markdown file kept everything of the old one (bench/RESULTS.md
when it was regrouped by capability, issue 38 item 9):

    lines_kept.py OLD.md NEW.md        (or: lines_kept.py --git REV bench/RESULTS.md)

- every non-blank line of OLD that is not a heading appears in NEW at least as many times (table
  rows, numbers, prose: nothing dropped or edited);
- every heading's text of OLD appears in some line of NEW (headings may gain a date or move a
  level);
- every number of OLD (digits with their separators) appears in NEW at least as many times.
Prints what is missing and exits 1, else one line and 0.
"""
import collections
import re
import subprocess
import sys


def lines_of(text):
    return text.split("\n")


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--git":
        old = subprocess.run(["git", "show", f"{sys.argv[2]}:{sys.argv[3]}"], capture_output=True, text=True,
                             check=True).stdout
        new = open(sys.argv[3], encoding="utf-8").read()
    elif len(sys.argv) == 3:
        old = open(sys.argv[1], encoding="utf-8").read()
        new = open(sys.argv[2], encoding="utf-8").read()
    else:
        sys.exit(__doc__)
    old_lines, new_lines = lines_of(old), lines_of(new)
    body = collections.Counter(l for l in old_lines if l.strip() and not l.startswith("#"))
    have = collections.Counter(new_lines)
    missing = [(l, n - have[l]) for l, n in body.items() if have[l] < n]
    headings = [l.lstrip("#").strip() for l in old_lines if re.match(r"#+ ", l)]
    missing_headings = [h for h in headings if not any(h in l for l in new_lines)]
    num = re.compile(r"\d[\d.,]*")
    old_nums, new_nums = collections.Counter(num.findall(old)), collections.Counter(num.findall(new))
    missing_nums = [(x, n - new_nums[x]) for x, n in old_nums.items() if new_nums[x] < n]
    for l, n in missing:
        print(f"line missing ({n}x): {l[:160]}")
    for h in missing_headings:
        print(f"heading missing: {h[:160]}")
    for x, n in missing_nums:
        print(f"number missing ({n}x): {x}")
    if missing or missing_headings or missing_nums:
        return 1
    print(f"kept: {sum(body.values())} lines, {len(headings)} headings, {sum(old_nums.values())} numbers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
