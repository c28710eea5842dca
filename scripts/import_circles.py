#!/usr/bin/env python3
"""Fails on an import circle between the Rust files of the library (src/), the command
(cli/src/) or the engine (engine/src/): two or more files that use each other's items,
directly or through others.

A file uses what its `use` lines name and what its code names by path (`crate::a::B`,
`super::C`, `self::d::E`), comments and the part after `#[cfg(test)]` left out (test files are
skipped). A path is followed to the file that defines the item: through the longest module
path it names, then through the re-exports (`pub use`, `pub(crate) use`) of `mod.rs` and
`lib.rs` files, so a folder's `mod.rs` that only re-exports its children is no circle, while
one that defines an item a child uses, and uses that child, is. CI runs it
(`python3 scripts/import_circles.py`); it prints every circle and exits 1 when there is one.
"""
import os
import re
import sys

USE = re.compile(r"^\s*(pub(?:\([^)]*\))?\s+)?use\s+([^;]+);", re.M)
PATH = re.compile(r"\b(?:crate|super|self)(?:::[A-Za-z_][A-Za-z0-9_]*)+")
ROOTS = ("src", "cli/src", "engine/src")


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
    tree = re.sub(r"\s+", " ", tree).strip()
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
    return [path for item in items if item.strip() for path in paths_of(head + item.strip())]


def code_of(path):
    """The file's code before its tests, without comments."""
    text = open(path, encoding="utf-8").read().split("#[cfg(test)]")[0]
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return "\n".join(line.split("//")[0] for line in text.splitlines())


def absolute(module, segments):
    """`segments` (a path written in `module`) from the crate's root; `None` for other crates'."""
    if not segments:
        return None
    if segments[0] == "crate":
        return list(segments[1:])
    if segments[0] in ("super", "self"):
        base = list(module)
        while segments and segments[0] in ("super", "self"):
            if segments[0] == "super":
                base.pop()
            segments = segments[1:]
        return base + list(segments)
    return None


class Crate:
    def __init__(self, root):
        self.paths = list(rust_files(root))
        self.files = {module_path(path, root): path for path in self.paths}
        self.modules = {path: module_path(path, root) for path in self.paths}
        self.code = {path: code_of(path) for path in self.paths}
        # name -> the absolute path it re-exports, per module file
        self.exports = {}
        for path in self.paths:
            if os.path.basename(path) not in ("mod.rs", "lib.rs", "main.rs"):
                continue
            module, names = self.modules[path], {}
            for used in USE.finditer(self.code[path]):
                if not used.group(1):
                    continue
                for full in paths_of(used.group(2)):
                    target, _, alias = full.partition(" as ")
                    segments = [s for s in target.strip().split("::") if s]
                    # At a module's root, `use gate::X` names the child module `gate`.
                    if segments and segments[0] not in ("crate", "super", "self"):
                        if tuple(list(module) + segments[:1]) in self.files:
                            segments = ["self"] + segments
                    resolved = absolute(module, segments)
                    if resolved:
                        names[(alias.strip() or resolved[-1])] = resolved
            self.exports[path] = names

    def resolve(self, segments, depth=0):
        """The file that defines what the absolute path `segments` names."""
        for n in range(len(segments), 0, -1):
            found = self.files.get(tuple(segments[:n]))
            if found is None:
                continue
            rest = segments[n:]
            target = self.exports.get(found, {}).get(rest[0]) if rest else None
            if target and depth < 16:
                return self.resolve(target + rest[1:], depth + 1)
            return found
        return None

    def uses(self, path):
        module, code, found = self.modules[path], self.code[path], set()
        written = []
        for used in USE.finditer(code):
            for full in paths_of(used.group(2)):
                written.append(full.partition(" as ")[0].strip())
        written += PATH.findall(code)
        for text in written:
            segments = [s for s in text.split("::") if s and s != "*"]
            resolved = absolute(module, segments)
            target = self.resolve(resolved) if resolved else None
            if target and target != path:
                found.add(target)
        return found


def circles(graph):
    """The strongly connected components of more than one file (Tarjan's algorithm)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = [0]

    def visit(node):
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
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
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def main():
    os.chdir(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    found = []
    for root in ROOTS:
        crate = Crate(root)
        graph = {path: crate.uses(path) for path in crate.paths}
        found += circles(graph)
    for component in found:
        print("import circle: " + ", ".join(component))
    print(f"{len(found)} import circles")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
