#!/usr/bin/env python3
"""Fails when code includes a header of a higher layer.

The layers are the `layers` block of docs/DESIGN.md ("Layers"), lowest first: a name, then
the src/ folders and public headers (kiln/x.h, or a folder such as kiln/impl) it holds. Every
#include "..." in src/ and include/kiln/ must name a header of the includer's layer or a lower
one; a folder or header that no layer names is an error too, so the table stays complete.
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def read_layers():
    text = (ROOT / "docs" / "DESIGN.md").read_text()
    block = re.search(r"^```layers\n(.*?)^```", text, re.M | re.S)
    if not block:
        sys.exit("check_layers: docs/DESIGN.md has no ```layers block")
    rank = {}
    for level, line in enumerate(block.group(1).splitlines()):
        name, *members = line.split()
        for m in members:
            if m in rank:
                sys.exit(f"check_layers: {m} is in two layers")
            rank[m] = (level, name)
    return rank


def layer_of(path, rank):
    """The layer of a repository-relative path or an include spelling, or None."""
    parts = pathlib.PurePosixPath(path).parts
    for n in range(len(parts), 0, -1):
        key = "/".join(parts[:n])
        if key in rank:
            return rank[key]
    return None


def main():
    rank = read_layers()
    errors = []
    files = sorted(
        p
        for p in list((ROOT / "src").rglob("*")) + list((ROOT / "include" / "kiln").rglob("*"))
        if p.suffix in (".h", ".cpp")
    )
    for f in files:
        rel = f.relative_to(ROOT).as_posix()
        # Public headers are named as they are included: kiln/x.h.
        own = rel[len("include/") :] if rel.startswith("include/") else rel
        mine = layer_of(own, rank)
        if mine is None:
            errors.append(f"{rel}: in no layer of docs/DESIGN.md")
            continue
        text = f.read_text()
        for m in INCLUDE.finditer(text):
            lineno, target = text.count("\n", 0, m.start()) + 1, m.group(1)
            # "x.h" next to the includer, else "folder/x.h" from src/ or "kiln/x.h".
            if "/" not in target:
                continue
            spelled = target if target.startswith("kiln/") else "src/" + target
            theirs = layer_of(spelled, rank)
            if theirs is None:
                errors.append(f"{rel}:{lineno}: includes {target}, which is in no layer")
            elif theirs[0] > mine[0]:
                errors.append(
                    f"{rel}:{lineno}: {mine[1]} includes {target} of the higher layer {theirs[1]}"
                )
    for e in errors:
        print(e)
    print(f"check_layers: {len(files)} files, {len(errors)} problems")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
