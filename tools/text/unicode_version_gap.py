#!/usr/bin/env python3
"""How PCRE2's Unicode tables differ from those of the Oniguruma inside `tokenizers`.

    python3 tools/text/unicode_version_gap.py

For each general category used by pre-tokenizer regexes (L, N, M, P, S) prints how many
code points (U+0080..U+10FFFF) PCRE2 (libpcre2-8, through ctypes; UTF + UCP as
src/text/regex.cpp compiles) puts in \\p{X}, how many tokenizers' Split(Regex(r"\\p{X}"))
matches, and the first few code points only one of them has. A difference means the same
split regex can cut text differently in fp4moe and in tokenizers (src/text/README.md).
"""
import ctypes
import ctypes.util

from tokenizers import Regex, pre_tokenizers

UTF, UCP = 0x00080000, 0x00020000
CODE_POINTS = [c for c in range(0x80, 0x110000) if not 0xD800 <= c <= 0xDFFF]


def pcre2_class(lib, cls):
    pat = (r"^\p{%s}$" % cls).encode()
    err, off = ctypes.c_int(), ctypes.c_size_t()
    code = lib.pcre2_compile_8(pat, len(pat), UTF | UCP, ctypes.byref(err), ctypes.byref(off), None)
    data = lib.pcre2_match_data_create_8(4, None)
    out = set()
    for c in CODE_POINTS:
        b = chr(c).encode()
        if lib.pcre2_match_8(code, b, len(b), 0, 0, data, None) >= 0:
            out.add(c)
    return out


def tokenizers_class(cls):
    # Matches are removed; what is left over is every code point outside the class.
    split = pre_tokenizers.Split(Regex(r"\p{%s}" % cls), behavior="removed")
    rest = set()
    for piece, _ in split.pre_tokenize_str("".join(chr(c) for c in CODE_POINTS)):
        rest.update(ord(ch) for ch in piece)
    return set(CODE_POINTS) - rest


def main():
    lib = ctypes.CDLL(ctypes.util.find_library("pcre2-8") or "libpcre2-8.so.0")
    lib.pcre2_compile_8.restype = ctypes.c_void_p
    lib.pcre2_compile_8.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint32, ctypes.POINTER(ctypes.c_int),
                                    ctypes.POINTER(ctypes.c_size_t), ctypes.c_void_p]
    lib.pcre2_match_data_create_8.restype = ctypes.c_void_p
    lib.pcre2_match_data_create_8.argtypes = [ctypes.c_uint32, ctypes.c_void_p]
    lib.pcre2_match_8.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_uint32,
                                  ctypes.c_void_p, ctypes.c_void_p]
    for cls in ["L", "N", "M", "P", "S"]:
        ours, theirs = pcre2_class(lib, cls), tokenizers_class(cls)
        only_t, only_p = sorted(theirs - ours), sorted(ours - theirs)
        print(f"\\p{{{cls}}}: PCRE2 {len(ours)}, tokenizers {len(theirs)}; only tokenizers {len(only_t)} "
              f"{[hex(c) for c in only_t[:6]]}; only PCRE2 {len(only_p)} {[hex(c) for c in only_p[:6]]}")


if __name__ == "__main__":
    main()
