#!/usr/bin/env python3
"""Checks CMakeLists.txt's layer comment against the code, and README.md's diagram against it
(issue 38 item 9):

    check_layers.py [REPO_ROOT]

- every arrow `a -> b` of the comment (the lines after "# ---- layers", `a -> b -> c` chains,
  `a -> b, c` fan-outs, `;`-separated) is a link of library a to library b in src/a/CMakeLists.txt
  (target_link_libraries, fp4moe_<folder>; cli is the fp4moe executable, engine/dist fp4moe_dist,
  backend/<x> fp4moe_backend_<x>);
- every link between our libraries is a path of the comment's arrows (a link to a layer further
  down, e.g. cli -> cpu, is drawn through the layers between);
- every folder of src/ with a CMakeLists.txt is named in it;
- README.md's layer diagram (the code block under "## Layout") has the same arrows.
Prints the differences and exits 1, else one line and 0.
"""
import os
import re
import sys

TARGETS = {"fp4moe": "cli", "fp4moe_dist": "engine/dist", "fp4moe_backend_cpu": "backend/cpu",
           "fp4moe_backend_fake": "backend/fake", "fp4moe_backend_cuda": "backend/cuda"}


def layer_of(target, layers):
    if target in TARGETS:
        return TARGETS[target]
    name = target[len("fp4moe_"):] if target.startswith("fp4moe_") else None
    return name if name in layers else None


def arrows(lines):
    """The (a, b) arrows of `a -> b -> c` chains and `a -> b, c` fan-outs, `;`-separated."""
    said = set()
    for line in lines:
        if "->" not in line or line.startswith("Kernels"):
            continue
        for part in line.split(";"):
            steps = [s.strip() for s in part.split("->")]
            for a, b in zip(steps, steps[1:]):
                a = re.sub(r"\s*\(.*\)", "", a).split(",")[-1].strip()
                for t in re.sub(r"\s*\(.*\)", "", b).split(","):
                    said.add((a, t.strip()))
    return said


def readme_arrows(root):
    """The arrows of the code block under README.md's "## Layout"."""
    text = open(os.path.join(root, "README.md"), encoding="utf-8").read()
    m = re.search(r"## Layout\n.*?```\n(.*?)```", text, re.S)
    return arrows(m.group(1).split("\n")) if m else set()


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "../..")
    layers = sorted(os.path.relpath(d, os.path.join(root, "src")) for d, _, files in os.walk(os.path.join(root, "src"))
                    if "CMakeLists.txt" in files and os.path.relpath(d, os.path.join(root, "src")) != ".")
    # cuda's per-arch subfolders build into fp4moe_cuda's family: not layers of their own
    layers = [l for l in layers if "/" not in l or l.startswith(("engine/", "backend/"))]
    top = open(os.path.join(root, "CMakeLists.txt"), encoding="utf-8").read().split("\n")
    start = next(i for i, l in enumerate(top) if l.startswith("# ---- layers"))
    comment = []
    for l in top[start + 1:]:
        if not l.startswith("#"):
            break
        comment.append(l.lstrip("#").strip())
    said = arrows(comment)
    real = set()
    for l in layers:
        text = open(os.path.join(root, "src", l, "CMakeLists.txt"), encoding="utf-8").read()
        for m in re.finditer(r"target_link_libraries\((\S+)([^)]*)\)", text):
            src = layer_of(m.group(1), layers)
            if src != l:
                continue
            for t in m.group(2).split():
                dst = layer_of(t, layers)
                if dst and dst != l:
                    real.add((l, dst))
    bad = []
    bad += [f"the comment says {a} -> {b}, but src/{a}/CMakeLists.txt does not link it" for a, b in sorted(said - real)]
    def reach(a):
        seen, todo = set(), [a]
        while todo:
            x = todo.pop()
            for u, v in said:
                if u == x and v not in seen:
                    seen.add(v)
                    todo.append(v)
        return seen
    bad += [f"src/{a}/CMakeLists.txt links {b}, but the comment has no path {a} -> ... -> {b}"
            for a, b in sorted(real) if b not in reach(a)]
    named = {x for e in said for x in e}
    bad += [f"src/{l} is not in the layer comment" for l in layers if l not in named]
    in_readme = readme_arrows(root)
    bad += [f"README.md's layer diagram has {a} -> {b}, CMakeLists.txt's comment does not" for a, b in sorted(in_readme - said)]
    bad += [f"CMakeLists.txt's comment has {a} -> {b}, README.md's layer diagram does not" for a, b in sorted(said - in_readme)]
    for b in bad:
        print(b)
    if bad:
        return 1
    print(f"layer comment matches: {len(real)} links over {len(layers)} folders")
    return 0


if __name__ == "__main__":
    sys.exit(main())
