"""The training corpus: CPython's standard-library sources (PSF licence), as every Debian machine
has them under /usr/lib/python3.X/ (site-packages / dist-packages excluded: not the standard
library), or from a tarball that `pack` wrote (to carry the same files to another machine).

Deterministic split: a file is held out iff the first 8 hex digits of the SHA-256 of its bytes,
as an integer, are divisible by HELD_OUT_MOD (about 1 in 20 files). Files with the same bytes
count once. Each file becomes one chat-shaped document (see `document`).

    python3 tools/train_small/corpus.py pack OUT.tar.xz   # the files as this machine has them
    python3 tools/train_small/corpus.py stats [--corpus-tar T]
"""
import argparse
import glob
import hashlib
import io
import os
import re
import sys
import tarfile

HELD_OUT_MOD = 20
MAX_FILE_BYTES = 400_000  # larger files (generated tables) are skipped


def _from_dirs():
    files = {}
    for root in sorted(glob.glob("/usr/lib/python3.*/")):
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d not in ("site-packages", "dist-packages", "__pycache__"))
            for name in sorted(filenames):
                if not name.endswith(".py"):
                    continue
                path = os.path.join(dirpath, name)
                with open(path, "rb") as f:
                    files[os.path.relpath(path, "/usr/lib")] = f.read()
    return files


def _from_tar(path):
    files = {}
    with tarfile.open(path) as t:
        for m in t.getmembers():
            if m.isfile() and m.name.endswith(".py"):
                files[m.name] = t.extractfile(m).read()
    return files


def load(corpus_tar=None):
    """[(relative path, text)] sorted by path, deduplicated by content, utf-8 decodable only."""
    raw = _from_tar(corpus_tar) if corpus_tar else _from_dirs()
    if not raw:
        sys.exit("corpus: no /usr/lib/python3.*/**/*.py found (pass --corpus-tar)")
    seen, out = set(), []
    for path in sorted(raw):
        data = raw[path]
        h = hashlib.sha256(data).hexdigest()
        if h in seen or len(data) > MAX_FILE_BYTES or not data.strip():
            continue
        seen.add(h)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        out.append((path, text, h))
    return out


def is_held_out(sha_hex):
    return int(sha_hex[:8], 16) % HELD_OUT_MOD == 0


def split(corpus_tar=None):
    """(train, held_out): lists of (path, text)."""
    train, held = [], []
    for path, text, h in load(corpus_tar):
        (held if is_held_out(h) else train).append((path, text))
    return train, held


_DOCSTRING = re.compile(r'^\s*(?:#[^\n]*\n\s*)*[rRuU]?("""|\'\'\')\s*([^\n]*?)\s*(?:\1|\n)', re.S)


def request_of(path, text):
    """The user turn of a file's document: its module docstring's first line, else its path."""
    m = _DOCSTRING.match(text)
    line = m.group(2).strip() if m else ""
    return line if 3 <= len(line) <= 200 else path.split("/", 1)[-1]


def document(path, text):
    """One file as the chat template renders a one-turn chat, plus the end-of-text token."""
    return f"<|user|>{request_of(path, text)}<|assistant|>{text}<|endoftext|>"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack", help="write the standard-library .py files of this machine to a tarball")
    p.add_argument("out")
    s = sub.add_parser("stats", help="file and byte counts of the split")
    s.add_argument("--corpus-tar")
    a = ap.parse_args()
    if a.cmd == "pack":
        files = _from_dirs()
        with tarfile.open(a.out, "w:xz") as t:
            for path in sorted(files):
                info = tarfile.TarInfo(path)
                info.size, info.mtime, info.mode = len(files[path]), 0, 0o644
                t.addfile(info, io.BytesIO(files[path]))
        print(f"{a.out}: {len(files)} files")
    else:
        train, held = split(a.corpus_tar)
        for name, part in (("train", train), ("held-out", held)):
            print(f"{name}: {len(part)} files, {sum(len(t.encode()) for _, t in part)} bytes")


if __name__ == "__main__":
    main()
