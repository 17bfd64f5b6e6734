#!/usr/bin/env python3
"""Finds import circles between sibling modules of each crate of the workspace (issue 41; DESIGN.md: "No import
circle inside any crate").

A module's file refers to a sibling when it names it through `crate::`, `super::` or `self::` paths (in `use`
items or inline). For a reference from module `a::b::c` to `a::d::e`, the edge is `b -> d` among the children of
`a`: the circle that matters is between the modules that share a parent. Test code is left out (files named
`tests.rs`, `*_tests.rs`, `*_test.rs`, `testutil.rs`, `perf.rs`, and everything from a `#[cfg(test)]` line to the end
of a file), since tests of a module may use anything beside it.

Every strongly connected set of two or more siblings is a circle. A circle is allowed only if it is listed in
`scripts/import-cycles.allow` (one a line: `crate parent: a b c`, members sorted; `#` comments), so the list
records what remains and must shrink: a listed circle that no longer exists is an error too (remove its line).

Usage: scripts/import_cycles.py [--all] [--allow FILE]
  --all    print every circle found, allowed or not, and exit 0
Exit status: 0 when every circle found is allowed and every allowed one exists, else 1.
"""

import os
import re
import sys
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEST_FILES = re.compile(r"^(tests|testutil|perf|.*_tests?)\.rs$")
PATH = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)+)(::\{)?")
CFG_TEST = re.compile(r"^\s*#\[cfg\(test\)\]")
MOD_DECL = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+([A-Za-z_][A-Za-z0-9_]*)\s*;")
PATH_ATTR = re.compile(r'^\s*#\[path\s*=\s*"([^"]+)"\]')


def crates():
    """(name, src dir) of every workspace member with a library or binary source tree."""
    with open(os.path.join(ROOT, "Cargo.toml"), "rb") as f:
        members = tomllib.load(f)["workspace"]["members"]
    for m in members:
        with open(os.path.join(ROOT, m, "Cargo.toml"), "rb") as f:
            name = tomllib.load(f)["package"]["name"]
        src = os.path.join(ROOT, m, "src")
        if os.path.isdir(src):
            yield name, src


def module_files(src):
    """{module path tuple: file} for the crate, following `mod x;` (and `#[path]`) from lib.rs or main.rs."""
    out = {}
    roots = [f for f in ("lib.rs", "main.rs") if os.path.isfile(os.path.join(src, f))]
    todo = [((), os.path.join(src, r), True) for r in roots[:1]]
    while todo:
        path, file, owns_dir = todo.pop()
        if path in out:
            continue
        out[path] = file
        # Children of `a/b.rs` live in `a/b/`; of `a/mod.rs` (or lib.rs) in `a/`.
        base = os.path.dirname(file)
        if not owns_dir:
            base = os.path.join(base, os.path.splitext(os.path.basename(file))[0])
        pending_path = None
        with open(file, encoding="utf-8") as f:
            for line in f:
                p = PATH_ATTR.match(line)
                if p:
                    pending_path = p.group(1)
                    continue
                m = MOD_DECL.match(line)
                if m:
                    name = m.group(1)
                    if pending_path:
                        child = os.path.normpath(os.path.join(os.path.dirname(file), pending_path))
                        todo.append((path + (name,), child, os.path.basename(child) == "mod.rs"))
                    else:
                        for cand, owns in ((os.path.join(base, name + ".rs"), False),
                                           (os.path.join(base, name, "mod.rs"), True)):
                            if os.path.isfile(cand):
                                todo.append((path + (name,), cand, owns))
                                break
                if not line.strip().startswith("#["):
                    pending_path = None
    return out


def code_of(file):
    """The file's non-test code, without comments and string contents."""
    lines = []
    with open(file, encoding="utf-8") as f:
        for line in f:
            if CFG_TEST.match(line):
                break
            lines.append(line)
    text = "".join(lines)
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
    return text


def references(text, here, modules):
    """Absolute module paths `here` refers to through crate::/super::/self:: paths (one level of `{}` groups)."""
    for m in PATH.finditer(text):
        head, rest = m.group(1), [s for s in m.group(2).split("::") if s]
        if head == "crate":
            start = ()
        elif head == "self":
            start = here
        else:
            start = here[:-1]
            while rest and rest[0] == "super":
                start, rest = start[:-1], rest[1:]
        tails = [rest]
        if m.group(3):
            group = text[m.end():text.find("}", m.end())]
            tails = [rest + [g.strip().split("::")[0]] for g in group.split(",") if g.strip()]
        for tail in tails:
            target = start
            for seg in tail:
                if target + (seg,) in modules:
                    target = target + (seg,)
                else:
                    break
            yield target


def circles(modules):
    """Sibling circles: {(parent, members)}."""
    edges = {}
    for here, file in modules.items():
        if TEST_FILES.match(os.path.basename(file)) or "tests" in here:
            continue
        for target in references(code_of(file), here, modules):
            k = 0
            while k < min(len(here), len(target)) and here[k] == target[k]:
                k += 1
            if k < len(here) and k < len(target):
                parent = here[:k]
                edges.setdefault(parent, {}).setdefault(here[k], set()).add(target[k])
    found = set()
    for parent, graph in edges.items():
        for scc in strongly_connected(graph):
            if len(scc) > 1:
                found.add(("::".join(parent) or "(root)", tuple(sorted(scc))))
    return found


def strongly_connected(graph):
    """Tarjan's algorithm over {node: {successors}}."""
    index, low, on, stack, out, n = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on.discard(w)
                scc.append(w)
                if w == v:
                    break
            out.append(scc)

    sys.setrecursionlimit(10000)
    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def main():
    args = sys.argv[1:]
    show_all = "--all" in args
    allow_file = os.path.join(ROOT, "scripts", "import-cycles.allow")
    if "--allow" in args:
        allow_file = args[args.index("--allow") + 1]
    allowed = set()
    if os.path.isfile(allow_file):
        with open(allow_file, encoding="utf-8") as f:
            for line in f:
                line = line.split("#", 1)[0].strip()
                if line:
                    head, members = line.split(":", 1)
                    allowed.add((head.strip(), tuple(sorted(members.split()))))
    found = set()
    for name, src in crates():
        for parent, members in circles(module_files(src)):
            found.add((f"{name} {parent}", members))
    if show_all:
        for head, members in sorted(found):
            print(f"{head}: {' '.join(members)}")
        return 0
    bad = 0
    for head, members in sorted(found - allowed):
        print(f"import circle: {head}: {' <-> '.join(members)} (break it, or list it in {allow_file})")
        bad += 1
    for head, members in sorted(allowed - found):
        print(f"stale entry in {allow_file}: {head}: {' '.join(members)} (no longer a circle: remove the line)")
        bad += 1
    if bad:
        return 1
    print(f"import circles: {len(found)}, all listed in {os.path.relpath(allow_file, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
