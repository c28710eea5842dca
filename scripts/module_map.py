#!/usr/bin/env python3
"""The module map of ARCHITECTURE.md, drawn from the code: one row per Rust file of the library
(src/), the command (cli/src/) and the engine (engine/src/), the file and the first sentence of its `//!` docs.

    python3 scripts/module_map.py           # checks that ARCHITECTURE.md's maps are the code's
    python3 scripts/module_map.py --write   # rewrites them

Each map sits between `<!-- module map: ROOT -->` and `<!-- end of module map -->` in
ARCHITECTURE.md. CI runs the check, so a file added, removed, renamed or redescribed without the
map following it fails the build. A file without `//!` docs is an error too.
"""
import os
import re
import sys

DOC = "ARCHITECTURE.md"
ROOTS = ("src", "cli/src", "engine/src")
BEGIN = "<!-- module map: {root} -->"
END = "<!-- end of module map -->"


def files(root):
    found = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d != "tests"]
        found += [os.path.join(folder, n) for n in names if n.endswith(".rs")]
    return sorted(found)


def concept(path):
    """The first sentence of the file's first `//!` paragraph."""
    lines = []
    for line in open(path, encoding="utf-8"):
        line = line.strip()
        if not line.startswith("//!"):
            if lines or (line and not line.startswith("#!")):
                break
            continue
        text = line[3:].strip()
        if not text:
            if lines:
                break
            continue
        lines.append(text)
    paragraph = " ".join(lines)
    if not paragraph:
        return None
    # Intra-doc links read as their text.
    paragraph = re.sub(r"\[([^\]]+)\]\([^)]*\)", r"\1", paragraph)
    paragraph = re.sub(r"\[(`[^\]]+`)\]", r"\1", paragraph)
    sentence = re.match(r"(.+?\.)(\s|$)", paragraph)
    return (sentence.group(1) if sentence else paragraph).rstrip(".") + "."


def table(root):
    rows = ["| file | concept |", "|---|---|"]
    missing = []
    for path in files(root):
        text = concept(path)
        if text is None:
            missing.append(path)
            continue
        rows.append(f"| `{path}` | {text.replace('|', '/')} |")
    return "\n".join(rows), missing


def main():
    os.chdir(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    write = "--write" in sys.argv[1:]
    doc = open(DOC, encoding="utf-8").read()
    problems = []
    for root in ROOTS:
        begin = BEGIN.format(root=root)
        start = doc.find(begin)
        end = doc.find(END, start)
        if start < 0 or end < 0:
            problems.append(f"{DOC} has no `{begin}` ... `{END}` section")
            continue
        rows, missing = table(root)
        problems += [f"{path} has no `//!` docs" for path in missing]
        current = doc[start + len(begin) : end].strip("\n")
        if current != rows:
            if write:
                doc = doc[: start + len(begin)] + "\n" + rows + "\n" + doc[end:]
            else:
                problems.append(
                    f"the module map of {root} in {DOC} is not the code's: run "
                    "`python3 scripts/module_map.py --write` and review the rows"
                )
    if write:
        open(DOC, "w", encoding="utf-8").write(doc)
    for problem in problems:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
