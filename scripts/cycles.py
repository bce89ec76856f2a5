#!/usr/bin/env python3
"""No import loops (part of scripts/floors.sh): within each crate, between files and between
rooms (a crate's top-level modules), whatever the floors allow.

An edge is a path a file names in code (not in a comment, nor in its unit tests from its
`#[cfg(test)]` on): `crate::a::b`, `super::a`, `self::a`, or a child module's name in a `use`,
resolved to the file that defines the longest prefix of it (a `mod.rs` for a folder), or
to the child a module file re-exports the name from. Braces (`use crate::{a::b, c}`) are
expanded one level. A file naming its own ancestor module (`super::Invalid` from a child of
`config`) is not an edge: a parent that assembles its children is not in a loop with them. Names the crate re-exports from another crate
(the gateway's `crate::policy` is the core's) have no file here and no edge: crates cannot
import each other in a loop.

    scripts/cycles.py            check; exit 1 naming every loop, with the names that tie it
    scripts/cycles.py --edges    print the file graph (one `from -> to` a line)
"""

import re
import sys
from pathlib import Path

CRATES = ["crates/core/src", "src"]


PATH_RE = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)*)(::\{[^}]*\})?")
USE_RE = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?use\s+([A-Za-z_][A-Za-z0-9_]*)((?:::[A-Za-z_][A-Za-z0-9_]*)*)(::\{[^}]*\})?")


def module_of(root: Path, file: Path) -> list:
    rel = file.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return parts


def file_of(root: Path, parts: list):
    """The file of the longest prefix of `parts` that is a module of the crate."""
    for n in range(len(parts), 0, -1):
        base = root.joinpath(*parts[:n])
        for f in (base.with_suffix(".rs"), base / "mod.rs"):
            if f.is_file():
                return f
    return None


def code_lines(file: Path):
    lines = file.read_text().splitlines()
    for i, line in enumerate(lines):
        if line.startswith("#[cfg(test)]"):
            return
        if re.match(r"^\s*//", line):
            continue
        yield line


def children(root: Path, mod: list) -> set:
    """The names of `mod`'s child modules (files or folders beside or under it)."""
    folder = root.joinpath(*mod)
    if not folder.is_dir():
        return set()
    return {p.stem for p in folder.glob("*.rs") if p.stem != "mod"} | {
        p.name for p in folder.iterdir() if p.is_dir() and (p / "mod.rs").exists()
    }


def test_only(root: Path) -> set:
    """Files of modules declared under a `#[cfg(test)]` or `#[cfg(any(test, ...))]` attribute:
    test code, as a file's own unit tests are."""
    out = set()
    for file in root.rglob("*.rs"):
        mod = module_of(root, file)
        folder = root.joinpath(*mod) if file.name in ("mod.rs", "lib.rs", "main.rs") else file.with_suffix("")
        lines = file.read_text().splitlines()
        for i, line in enumerate(lines[1:], 1):
            m = re.match(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+([A-Za-z_][A-Za-z0-9_]*)\s*;", line)
            if m and re.match(r"^\s*#\[cfg\((test|any\(test)", lines[i - 1]):
                for f in (folder / f"{m.group(1)}.rs", folder / m.group(1) / "mod.rs"):
                    if f.exists():
                        out.add(f)
    return out


def reexports(file: Path) -> dict:
    """What a module file re-exports from its children: name -> child."""
    out = {}
    for line in code_lines(file):
        m = re.match(r"^\s*pub(?:\([^)]*\))?\s+use\s+(?:self::)?([a-z_][a-z0-9_]*)::(.*);", line)
        if not m:
            continue
        rest = m.group(2)
        names = rest[1:-1].split(",") if rest.startswith("{") else [rest.split("::")[-1]]
        for n in names:
            n = n.strip().split(" as ")[-1].split("::")[-1]
            if n and n != "self":
                out[n] = m.group(1)
    return out


def edges(root: Path):
    out = {}
    tests = test_only(root)
    for file in sorted(root.rglob("*.rs")):
        if file.name == "main.rs" and file.parent == root and (root / "lib.rs").exists():
            continue
        if file in tests:
            continue
        mod = module_of(root, file)
        # `self::` and a child's name in `use` point below the module itself; `super::` at
        # the module above it.
        here = mod
        kids = children(root, mod)
        targets = {}
        for line in code_lines(file):
            found = []
            for m in PATH_RE.finditer(line):
                found.append((m.group(1), m.group(2), m.group(3)))
            u = USE_RE.match(line)
            if u and u.group(1) in kids:
                found.append(("self", "::" + u.group(1) + u.group(2), u.group(3)))
            for head, rest, braces in found:
                names = [p for p in rest.split("::") if p]
                if head == "crate":
                    base = []
                elif head == "super":
                    base = mod[:-1]
                    while names and names[0] == "super":
                        base, names = base[:-1], names[1:]
                else:
                    base = here
                paths = [base + names]
                if braces:
                    for item in braces[3:-1].split(","):
                        item = item.strip().split(" as ")[0]
                        sub = [p for p in item.split("::") if p and p not in ("self", "*")]
                        if sub:
                            paths.append(base + names + sub)
                for p in paths:
                    t = file_of(root, p)
                    # A name a module file re-exports from a child is the child's.
                    if t is not None and t.name == "mod.rs" and p:
                        child = reexports(t).get(p[-1])
                        if child is not None:
                            t = file_of(root, module_of(root, t) + [child]) or t
                    if t is not None and t in tests:
                        continue
                    # What a module's ancestors define is its own to use (`super::Invalid`):
                    # a parent that assembles its children is not in a loop with them.
                    if t is not None and t.name in ("mod.rs", "lib.rs") and file.is_relative_to(t.parent):
                        continue
                    if t is not None and t != file:
                        targets.setdefault(t, set()).add("::".join(p[len(base):]) or p[-1])
        out[file] = targets
    return out


def loops(graph: dict) -> list:
    """Strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on, comps = {}, {}, [], set(), []
    counter = [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return comps


def report(crate: str, kind: str, graph: dict, ties: dict) -> int:
    """Print every loop of `graph` (files or rooms) with what ties each step; 1 if any."""
    found = 0
    for comp in loops(graph):
        found = 1
        print(f"cycles: {crate}: {kind} in a loop:", file=sys.stderr)
        for a in comp:
            for b in sorted(set(graph.get(a, ())) & set(comp)):
                print(f"  {a} -> {b}: {ties[(a, b)]}", file=sys.stderr)
    return found


def main() -> int:
    bad = 0
    nodes = 0
    for crate in CRATES:
        root = Path(crate)
        g = edges(root)
        nodes += len(g)
        if "--edges" in sys.argv:
            for f, ts in g.items():
                for t, names in ts.items():
                    print(f"{f} -> {t}: {', '.join(sorted(names))}")
            continue
        files = {f: set(ts) for f, ts in g.items()}
        ties = {(f, t): ", ".join(sorted(names)) for f, ts in g.items() for t, names in ts.items()}
        bad |= report(crate, "files", files, ties)

        def room(f: Path) -> str:
            m = module_of(root, f)
            return m[0] if m else "(crate root)"

        rooms = {}
        by = {}
        for f, ts in g.items():
            for t in ts:
                a, b = room(f), room(t)
                if a != b and a != "(crate root)" and b != "(crate root)":
                    rooms.setdefault(a, set()).add(b)
                    by.setdefault((a, b), []).append(f"{f} -> {t}")
        ties = {k: "; ".join(v[:3]) for k, v in by.items()}
        bad |= report(crate, "rooms", rooms, ties)
    if "--edges" in sys.argv:
        return 0
    if bad:
        return 1
    print(f"ok: no import loop among {nodes} files and their rooms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
