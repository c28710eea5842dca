#!/usr/bin/env python3
"""Fails on an import circle between the Rust files of the library (src/) or the command
(cli/src/): two or more files that import each other, directly or through others.

A file's imports are read from its `use crate::..`, `use super::..` and `use self::..` lines
(the part before `#[cfg(test)]`; test files are skipped), each mapped to the file of the
longest module path it names. Imports of a `mod.rs`, `lib.rs` or `main.rs` do not count: a
folder's `mod.rs` re-exports its children, which is no circle. CI runs it
(`python3 scripts/import_circles.py`); it prints every circle and exits 1 when there is one.
"""
import os
import re
import sys

USE = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?use\s+([^;]+);", re.M)
ROOTS = ("src", "cli/src")


def rust_files(root):
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d != "tests"]
        for name in names:
            if name.endswith(".rs") and name != "tests.rs":
                yield os.path.join(folder, name)


def module_path(path, root):
    parts = os.path.relpath(path, root)[:-3].split(os.sep)
    return tuple(parts[:-1] if parts[-1] in ("mod", "lib", "main") else parts)


def paths_of(tree):
    """`a::{b, c::{d, e}}` as `a::b`, `a::c::d`, `a::c::e`."""
    tree = re.sub(r"\s+", "", tree)
    brace = tree.find("{")
    if brace < 0:
        return [tree]
    head, body = tree[:brace], tree[brace + 1 : tree.rindex("}")]
    items, depth, item = [], 0, ""
    for ch in body:
        if ch == "," and depth == 0:
            items.append(item)
            item = ""
            continue
        depth += (ch == "{") - (ch == "}")
        item += ch
    items.append(item)
    return [path for item in items if item for path in paths_of(head + item)]


def imports(path, root, files):
    me = module_path(path, root)
    text = open(path, encoding="utf-8").read()
    text = text.split("#[cfg(test)]")[0]
    for used in USE.finditer(text):
        for full in paths_of(used.group(1)):
            parts = [p.split(" as ")[0] for p in full.split("::") if p]
            if not parts:
                continue
            if parts[0] == "crate":
                target = parts[1:]
            elif parts[0] in ("super", "self"):
                base = list(me)
                while parts and parts[0] == "super":
                    base.pop()
                    parts = parts[1:]
                if parts and parts[0] == "self":
                    parts = parts[1:]
                target = base + parts
            else:
                continue
            for n in range(len(target), 0, -1):
                found = files.get(tuple(target[:n]))
                if found:
                    if found != path and os.path.basename(found) not in (
                        "mod.rs",
                        "lib.rs",
                        "main.rs",
                    ):
                        yield found
                    break


def circles(graph):
    """The strongly connected components of more than one file (Tarjan's algorithm)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = [0]

    def visit(node):
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                on_stack.discard(other)
                component.append(other)
                if other == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for node in graph:
        if node not in index:
            visit(node)
    return found


def main():
    top = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    os.chdir(top)
    found = []
    for root in ROOTS:
        paths = list(rust_files(root))
        files = {module_path(path, root): path for path in paths}
        graph = {path: set(imports(path, root, files)) for path in paths}
        found += circles(graph)
    for component in found:
        print("import circle: " + ", ".join(component))
    print(f"{len(found)} import circles")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
