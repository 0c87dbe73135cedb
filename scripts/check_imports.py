#!/usr/bin/env python3
"""No import circle, at file or at module level, in any crate of the workspace.

    python3 scripts/check_imports.py            # every crate's src/
    python3 scripts/check_imports.py broker     # one crate

For each crate, every file of src/ is a module (lib.rs or main.rs the root, a/b.rs or
a/b/mod.rs the module a::b). A file imports a module when its code (comments and strings
left out) names a path into it: `crate::a::b::Item`, `super::b::Item`, `self::b::Item`
or, in a module, the names of its own child modules. A name re-exported (`pub use
a::b::Item;`, as lib.rs does) counts as a path into a::b. A module and its ancestors are
one family: a child using what its parent defines (`use super::*`, `crate::Error`) and a
parent declaring and re-exporting its children are not circles, so only imports between
modules neither of which contains the other count. Files under src/bin/ are binaries:
they import the library from outside and are left out.

Two checks:
- files: no file imports itself back through others;
- modules: the same with every file counted as its top-level module (`net`, `serve`, ...),
  so that two directories of one crate never import each other.

Prints each circle it finds as `a -> b -> a` and exits 1 if there is one; prints a
summary line in cargo's test format (CI counts it) either way.
"""

import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def strip(code):
    """Code without comments, string literals and char literals (paths in docs and
    messages are not imports)."""
    out = []
    i, n = 0, len(code)
    while i < n:
        c = code[i]
        if code.startswith("//", i):
            j = code.find("\n", i)
            i = n if j < 0 else j
        elif code.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if code.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif code.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif c == "r" and re.match(r'r#*"', code[i:i + 10]) and (i == 0 or not (code[i - 1].isalnum() or code[i - 1] == "_")):
            hashes = re.match(r'r(#*)"', code[i:]).group(1)
            end = code.find('"' + hashes, i + 2 + len(hashes))
            i = n if end < 0 else end + 1 + len(hashes)
            out.append('""')
        elif c == '"':
            i += 1
            while i < n and code[i] != '"':
                i += 2 if code[i] == "\\" else 1
            i += 1
            out.append('""')
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", code[i:i + 4] + "   "):
            m = re.match(r"'(\\[^']*|[^\\'])'", code[i:])
            i += len(m.group(0)) if m else 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def modules_of(src):
    """{module path tuple: file} for every .rs file of a crate's src/ (not bin/)."""
    mods = {}
    for dirpath, dirnames, files in os.walk(src):
        rel = os.path.relpath(dirpath, src)
        parts = () if rel == "." else tuple(rel.split(os.sep))
        if parts[:1] == ("bin",):
            continue
        for f in files:
            if not f.endswith(".rs"):
                continue
            name = f[:-3]
            if not parts and name in ("lib", "main"):
                path = ()
            elif name == "mod":
                path = parts
            else:
                path = parts + (name,)
            mods[path] = os.path.join(dirpath, f)
    return mods


USE = re.compile(r"\buse\s+([^;]+);", re.S)


def use_paths(tree, prefix=()):
    """The paths a `use` tree names: `a::{b, c::d as e}` -> [a::b, a::c::d]."""
    tree = tree.strip()
    depth, split = 0, None
    for i, ch in enumerate(tree):
        if ch == "{":
            if depth == 0 and split is None:
                split = i
            depth += 1
        elif ch == "}":
            depth -= 1
    if split is None:
        path = re.sub(r"\s+as\s+\w+$", "", tree)
        return [prefix + tuple(p for p in path.replace(" ", "").split("::") if p)]
    head = tuple(p for p in tree[:split].replace(" ", "").split("::") if p)
    inner = tree[split + 1:tree.rfind("}")]
    parts, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += ch == "{"
        depth -= ch == "}"
        cur += ch
    parts.append(cur)
    out = []
    for p in parts:
        if p.strip():
            out.extend(use_paths(p, prefix + head))
    return out


def reexports(mods, code_of):
    """{(module path, name): module path it comes from}, for `pub use` in every file."""
    table = {}
    for path in mods:
        for m in USE.finditer(code_of[path]):
            start = m.start()
            before = code_of[path][max(0, start - 12):start]
            if not re.search(r"pub(\([^)]*\))?\s*$", before):
                continue
            for p in use_paths(m.group(1)):
                full = absolute(p, path, mods)
                if full is None or not p:
                    continue
                table[(path, p[-1])] = full
    return table


def absolute(p, here, mods):
    """The crate-absolute path of `p` named in module `here`, or None (an extern crate)."""
    if not p:
        return None
    if p[0] == "crate":
        return p[1:]
    if p[0] == "self":
        return here + p[1:]
    if p[0] == "super":
        base = here
        while p and p[0] == "super":
            base, p = base[:-1], p[1:]
        return base + p
    if here + (p[0],) in mods:
        return here + p
    return None


def target(full, mods, table, seen=()):
    """The file module a crate-absolute path lands in (following re-exports)."""
    for k in range(len(full), -1, -1):
        prefix = full[:k]
        if prefix in mods:
            rest = full[k:]
            if rest and (prefix, rest[0]) in table and full not in seen:
                return target(table[(prefix, rest[0])] + rest[1:], mods, table, seen + (full,))
            return prefix
    return ()


PATH = re.compile(r"\b((?:crate|super|self)(?:\s*::\s*\w+)+)")


def graph(mods, code_of):
    table = reexports(mods, code_of)
    edges = {p: set() for p in mods}
    for here in mods:
        code = code_of[here]
        found = [tuple(x.replace(" ", "").split("::")) for x in PATH.findall(code)]
        for m in USE.finditer(code):
            found.extend(use_paths(m.group(1)))
        # Child modules named by their plain name (`use foo::Bar`, `foo::baz()`).
        for child in [p for p in mods if p[:-1] == here and p]:
            if re.search(r"(?<![\w:])" + child[-1] + r"\s*::", code):
                found.append(child)
        for p in found:
            full = absolute(p, here, mods)
            if full is None:
                continue
            # A glob names the module itself (`super::*`, `crate::x::*`), not a re-export.
            t = target(full[:-1], mods, {}) if full[-1:] == ("*",) else target(full, mods, table)
            if here[:len(t)] == t or t[:len(here)] == here:
                continue  # itself, an ancestor (a child using what its parent defines) or a descendant
            edges[here].add(t)
    return edges


def circles(edges):
    """Strongly connected components with more than one node (Tarjan)."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
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
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def name(path):
    return "::".join(path) or "crate"


def check_crate(src):
    """(file circles, module circles, file graph, module graph) of the crate at `src`."""
    mods = modules_of(src)
    code_of = {p: strip(open(f, encoding="utf-8").read()) for p, f in mods.items()}
    edges = graph(mods, code_of)
    top = {}
    for a, bs in edges.items():
        for b in bs:
            if a and b and b[0] != a[0]:
                top.setdefault((a[0],), set()).add((b[0],))
    return circles(edges), circles(top), edges, top


def self_test():
    """The check sees a circle through a re-export and a module-level one, and none in a
    parent and its child: run first, so a check that sees nothing cannot pass."""
    import tempfile

    cases = {
        "circle": ({"lib.rs": "mod a; mod b; pub use b::B;", "a.rs": "use crate::B; pub struct A;",
                    "b.rs": "// crate::a::A in a comment\npub struct B(crate::a::A);"}, True),
        "modules": ({"lib.rs": "mod n; mod s;", "n/mod.rs": "mod x;", "n/x.rs": "use crate::s::y::Y;",
                     "s/mod.rs": "mod y; mod z;", "s/y.rs": "pub struct Y;", "s/z.rs": "use crate::n::Q;"}, True),
        "family": ({"lib.rs": "mod a; pub use a::A; pub struct E;",
                    "a/mod.rs": "mod b; pub use b::B; pub struct A(crate::E);",
                    "a/b.rs": "use super::*; pub struct B; #[cfg(test)] mod t { use crate::a::A; }"}, False),
    }
    for label, (files, want) in cases.items():
        with tempfile.TemporaryDirectory() as d:
            for rel, text in files.items():
                os.makedirs(os.path.dirname(os.path.join(d, rel)), exist_ok=True)
                open(os.path.join(d, rel), "w").write(text)
            file_c, mod_c, _, _ = check_crate(d)
            if bool(file_c or mod_c) != want:
                print(f"check_imports: self-test '{label}': expected {'a' if want else 'no'} circle, "
                      f"found files {file_c}, modules {mod_c}", file=sys.stderr)
                return False
    return True


def main():
    if not self_test():
        print("test result: FAILED. 0 passed; 1 failed; 0 ignored (scripts/check_imports.py self-test)")
        return 1
    crates = sys.argv[1:] or sorted(
        d for d in os.listdir(ROOT)
        if os.path.isfile(os.path.join(ROOT, d, "Cargo.toml")) and os.path.isdir(os.path.join(ROOT, d, "src"))
    ) + ["."]
    failed = passed = 0
    for crate in crates:
        file_c, mod_c, edges, top = check_crate(os.path.join(ROOT, crate, "src"))
        label = os.path.basename(os.path.abspath(os.path.join(ROOT, crate)))
        for level, g, found in (("files", edges, file_c), ("modules", top, mod_c)):
            if found:
                failed += 1
                for comp in found:
                    detail = "; ".join(
                        f"{name(a)} -> {', '.join(name(b) for b in sorted(g[a]) if b in comp)}" for a in comp
                    )
                    print(f"check_imports: {label}: import circle among {level}: {detail}", file=sys.stderr)
            else:
                passed += 1
    print(f"test result: {'ok' if not failed else 'FAILED'}. {passed} passed; {failed} failed; 0 ignored (scripts/check_imports.py)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
