#!/usr/bin/env python3
"""The Rust layer contract, checked (`make test` runs it; Python 3's standard library only).

1. Crates form a ladder (ARCHITECTURE.md, ../shared/DESIGN.md): a crate's normal and build
   dependencies are workspace crates *below* it in LADDER. Dev-dependencies are exempt on purpose:
   nearrec-device's tests run the engine over the flash model, a test-only use of a crate above.
   Some crates have a lower ceiling than their rung (CEILING): the benchmark limits and baselines
   (nearrec-bench) measure the machine and must not link the engine or the facade they measure.
   A workspace crate missing from LADDER fails too, so a new crate is placed on purpose.
2. Within a crate, the top-level modules of src/ have no cycle: module `a` depends on `b` when a's
   files name `crate::b` (`use crate::b::X`, `crate::b::f()`, `use crate::{b, c}`), or an item the
   crate root re-exports from `b` (`crate::X` where lib.rs has `pub use b::X`). Comments, doc
   comments and string literals are ignored. A cycle means two modules that are really one
   concept, or a third concept waiting to be pulled out of both. The submodules of every module
   with a directory (`src/live/`) are held to the same, one level at a time: `live::a` depends
   on `live::b` when a's file names `super::b` or `crate::live::b`.

Usage: check_layers.py [--self-test]   (exit status 1 on a violation, each one reported)
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

# Lowest first. A crate may depend only on crates listed before it.
LADDER = [
    "nearrec-format",
    "nearrec-testkit",  # what the tests share (dev-dependencies only)
    "nearrec-kernels",
    "nearrec-io",
    "nearrec-cache",
    "nearrec-plan",
    "nearrec-device",
    "nearrec-engine",
    "nearrec",  # the facade: the product every surface goes through
    "nearrec-wire",  # the storage node's protocol, shared by the node and its clients
    "nearrec-client",  # a node's store as a StoreApi
    "nearrec-cluster",  # a store sharded over nodes: the router, over the client
    # surfaces
    "nearrec-server",
    "nearrec-loadgen",  # the node's load generator, for the benchmarks
    "nearrec-py",
    "nearrec-bench",
    "nearrec-bench-py",
    "nearrec-fuzz",  # what the fuzz targets check (fuzz/ runs them under libFuzzer)
]
# Crates that may depend on nothing above the named rung, whatever their own rung.
CEILING = {"nearrec-bench": "nearrec-io"}


def check_ladder(metadata: dict) -> list[str]:
    """Violations of the crate ladder in `cargo metadata --no-deps` output."""
    rung = {name: i for i, name in enumerate(LADDER)}
    members = set(metadata["workspace_members"])
    packages = [p for p in metadata["packages"] if p["id"] in members]
    names = {p["name"] for p in packages}
    problems = [
        f"{name}: a workspace crate missing from the ladder (scripts/check_layers.py LADDER)"
        for name in sorted(names - rung.keys())
    ]
    problems += [
        f"{name}: in the ladder but not in the workspace" for name in LADDER if name not in names
    ]
    for p in packages:
        me = p["name"]
        if me not in rung:
            continue
        limit = rung[CEILING[me]] if me in CEILING else rung[me] - 1
        for d in p["dependencies"]:
            dep, kind = d["name"], d["kind"]
            if kind == "dev" or dep not in rung:
                continue
            if rung[dep] > limit:
                why = (
                    f"{me} may depend on nothing above {CEILING[me]}"
                    if me in CEILING
                    else f"{dep} is not below {me}"
                )
                problems.append(f"{me} depends on {dep} ({kind or 'normal'}): {why}")
    return problems


# --- module cycles ----------------------------------------------------------------------------

_LEX = re.compile(
    r"""
      (?P<line>//[^\n]*)
    | (?P<block>/\*)
    | (?P<raw>b?r(?P<hashes>\#*)")
    | (?P<str>b?"(?:\\.|[^"\\])*")
    | (?P<char>b?'(?:\\(?:x[0-9a-fA-F]{2}|u\{[0-9a-fA-F]+\}|.)|[^'\\\n])')
    """,
    re.VERBOSE | re.DOTALL,
)


def strip(text: str) -> str:
    """`text` with comments (nested block comments too), strings and char literals blanked,
    newlines kept so that line numbers still hold. Lifetimes (`'a`) are left alone."""
    out, at = [], 0
    while True:
        m = _LEX.search(text, at)
        if not m:
            out.append(text[at:])
            return "".join(out)
        out.append(text[at : m.start()])
        if m.group("block"):
            depth, end = 1, m.end()
            while depth and end < len(text):
                if text.startswith("/*", end):
                    depth, end = depth + 1, end + 2
                elif text.startswith("*/", end):
                    depth, end = depth - 1, end + 2
                else:
                    end += 1
        elif m.group("raw") is not None:
            close = '"' + m.group("hashes")
            found = text.find(close, m.end())
            end = len(text) if found < 0 else found + len(close)
        else:
            end = m.end()
        out.append(re.sub(r"[^\n]", " ", text[m.start() : end]))
        at = end


def _group_heads(text: str, at: int) -> tuple[list[str], int]:
    """The first path segment of each item of the `{...}` group opening at `text[at]`."""
    heads, depth, item_start = [], 0, at + 1
    for i in range(at, len(text)):
        c = text[i]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        if (c == "," and depth == 1) or depth == 0:
            head = re.match(r"\s*([A-Za-z_][A-Za-z0-9_]*)", text[item_start:i])
            if head:
                heads.append(head.group(1))
            item_start = i + 1
        if depth == 0:
            return heads, i + 1
    return heads, len(text)


def crate_paths(code: str) -> list[tuple[str, int]]:
    """Each `crate::NAME` the code names (`crate::{a, b::c}` gives a and b), with its line."""
    return path_heads(code, "crate")


def reexports(root_code: str, modules: set[str]) -> dict[str, str]:
    """Names the crate root re-exports from its modules: `pub use m::{A, b::C as D}` → A, D."""
    names = {}
    pattern = r"\bpub\s+use\s+(?:(?:self|crate)\s*::\s*)?([A-Za-z_]\w*)\s*::"
    for m in re.finditer(pattern, root_code):
        module = m.group(1)
        if module not in modules:
            continue
        end = root_code.find(";", m.end())
        body = root_code[m.end() : end]
        for leaf in re.findall(r"(\w+)\s*(?=[,}]|$)", body.replace("\n", " ")):
            names.setdefault(leaf, module)
    return names


def module_graph(src: Path) -> dict[str, dict[str, tuple[str, int]]]:
    """For a crate's src/: each top-level module → the modules it names → where (file, line)."""
    root = next((src / f for f in ("lib.rs", "main.rs") if (src / f).exists()), None)
    if root is None:
        return {}
    files: dict[str, list[Path]] = {}
    for f in sorted(src.rglob("*.rs")):
        rel = f.relative_to(src)
        if f == root or rel.parts[0] in ("bin",):
            continue
        files.setdefault(rel.parts[0].removesuffix(".rs"), []).append(f)
    modules = set(files)
    via_root = reexports(strip(root.read_text()), modules)
    graph: dict[str, dict[str, tuple[str, int]]] = {m: {} for m in modules}
    for module, paths in files.items():
        for f in paths:
            for name, line in crate_paths(strip(f.read_text())):
                target = name if name in modules else via_root.get(name)
                if target and target != module:
                    graph[module].setdefault(target, (str(f), line))
    return graph


def path_heads(code: str, prefix: str) -> list[tuple[str, int]]:
    """Each `PREFIX::NAME` the code names (`PREFIX::{a, b::c}` gives a and b), with its line;
    `prefix` is a path regex (`super`, `crate\\s*::\\s*live`)."""
    found = []
    pattern = rf"(?<![\w$:]){prefix}\s*::\s*(\{{|[A-Za-z_][A-Za-z0-9_]*)"
    for m in re.finditer(pattern, code):
        line = code.count("\n", 0, m.start()) + 1
        if m.group(1) == "{":
            found += [(h, line) for h in _group_heads(code, m.start(1))[0]]
        else:
            found.append((m.group(1), line))
    return found


def submodule_graphs(src: Path) -> dict[str, dict[str, dict[str, tuple[str, int]]]]:
    """For each module of src/ with a directory (`live/`, nested ones too), by its path
    (`live`): each submodule → the sibling submodules it names → where."""
    graphs = {}
    for d in sorted(p for p in src.rglob("*") if p.is_dir()):
        parts = d.relative_to(src).parts
        if parts[0] == "bin":
            continue
        children: dict[str, list[Path]] = {}
        for f in sorted(d.rglob("*.rs")):
            rel = f.relative_to(d)
            if rel.parts == ("mod.rs",):
                continue
            children.setdefault(rel.parts[0].removesuffix(".rs"), []).append(f)
        if len(children) < 2:
            continue
        absolute = r"crate\s*::\s*" + r"\s*::\s*".join(parts)
        graph: dict[str, dict[str, tuple[str, int]]] = {c: {} for c in children}
        for child, files in children.items():
            for f in files:
                code = strip(f.read_text())
                # `super::` from the child's own file is this module; deeper files name their
                # siblings by the absolute path
                own = f.parent == d or f.name == "mod.rs" and f.parent.parent == d
                names = path_heads(code, absolute) + (path_heads(code, "super") if own else [])
                for name, line in names:
                    if name in children and name != child:
                        graph[child].setdefault(name, (str(f), line))
        graphs["::".join(parts)] = graph
    return graphs


def cycles(graph: dict[str, dict[str, tuple[str, int]]]) -> list[tuple[list[str], set[str]]]:
    """For each strongly connected component of more than one module (Tarjan's algorithm), one
    shortest cycle through it (a, b, ..., a) and the component's modules."""
    index, low, on, stack, sccs = {}, {}, set(), [], []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
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
            if len(scc) > 1:
                sccs.append(set(scc))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    found = []
    for scc in sccs:
        start = min(scc)
        # a shortest way back to `start` inside the component (breadth first)
        came = {start: None}
        queue, end = [start], None
        while queue and end is None:
            v = queue.pop(0)
            for w in sorted(graph[v]):
                if w == start:
                    end = v
                    break
                if w in scc and w not in came:
                    came[w] = v
                    queue.append(w)
        path = [start]
        while end is not None and end != start:
            path.insert(1, end)
            end = came[end]
        found.append((path + [start], scc))
    return found


def check_modules(crates: list[Path], root: Path | None = None) -> list[str]:
    """Module cycles in each crate, each edge with the file and line that makes it."""
    problems = []
    for crate in crates:
        levels = {"": module_graph(crate / "src")}
        for parent, graph in submodule_graphs(crate / "src").items():
            levels[parent + "::"] = graph
        for parent, graph in levels.items():
            problems += _cycles_of(crate, parent, graph, root)
    return problems


def _cycles_of(
    crate: Path, parent: str, graph: dict[str, dict[str, tuple[str, int]]], root: Path | None
) -> list[str]:
    """The cycles of one level's graph, each module named with its parent's path (`live::`)."""
    problems = []
    for cycle, scc in cycles(graph):
        steps = []
        for a, b in zip(cycle, cycle[1:], strict=False):
            file, line = graph[a][b]
            shown = Path(file).relative_to(root) if root else Path(file).name
            steps.append(f"{parent}{a} → {parent}{b} ({shown}:{line})")
        more = ""
        if len(scc) > len(cycle) - 1:
            more = f" (all modules of the cycle: {', '.join(parent + m for m in sorted(scc))})"
        shown_cycle = " → ".join(parent + m for m in cycle)
        problems.append(f"{crate.name}: module cycle {shown_cycle}{more}: {'; '.join(steps)}")
    return problems


# --- the checker's own test: it must fail on planted violations --------------------------------


def self_test() -> None:
    def metadata(deps: dict[str, list[tuple[str, str | None]]]) -> dict:
        pkgs = [
            {"id": n, "name": n, "dependencies": [{"name": d, "kind": k} for d, k in ds]}
            for n, ds in deps.items()
        ]
        return {"workspace_members": list(deps), "packages": pkgs}

    clean = {n: [] for n in LADDER}
    clean["nearrec-device"] = [("nearrec-engine", "dev"), ("nearrec-plan", None)]
    assert check_ladder(metadata(clean)) == [], check_ladder(metadata(clean))
    for me, dep in [
        ("nearrec-io", "nearrec-engine"),
        ("nearrec-format", "nearrec-format"),
        ("nearrec-bench", "nearrec-cache"),
        ("nearrec-py", "nearrec-bench"),
    ]:
        assert check_ladder(metadata({**clean, me: [(dep, None)]})), (me, dep)
    assert check_ladder(metadata({**clean, "nearrec-io": [("nearrec-engine", "build")]}))
    assert check_ladder(metadata({**clean, "nearrec-new": []}))

    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "demo" / "src"
        (src / "c").mkdir(parents=True)
        (src / "lib.rs").write_text("mod a;\nmod b;\nmod c;\npub use c::{Thing, deep::Other as O};")
        # a names b; mentions of c in comments, strings and char literals do not count
        (src / "a.rs").write_text(
            "use crate::{b::X, error};\n// use crate::c;\n/// [`crate::c`]\n"
            'const S: &str = "crate::c";\nconst R: &str = r#"crate::c"#;\n'
            "fn f<'a>() -> char { '\"' }\n"
        )
        (src / "b.rs").write_text("pub(crate) struct X;\nmacro_rules! m { () => { $crate::c::Y } }")
        (src / "c" / "mod.rs").write_text("pub struct Thing;\n")
        (src / "c" / "deep.rs").write_text("pub struct Other;\n")
        crate = Path(tmp) / "demo"
        assert check_modules([crate]) == [], check_modules([crate])
        (src / "c" / "deep.rs").write_text("use crate::a;\npub struct Other;\n")  # c → a
        (src / "b.rs").write_text("pub(crate) struct X;\nfn g() -> crate::O { todo!() }\n")  # b → c
        problems = check_modules([crate])
        assert len(problems) == 1 and "a → b → c → a" in problems[0], problems
        # a circle between two submodules of c, through `super::` and the absolute path
        (src / "c" / "deep.rs").write_text("use super::deeper::Y;\npub struct Other;\n")
        (src / "c" / "deeper.rs").write_text("pub struct Y(crate::c::deep::Other);\n")
        problems = check_modules([crate])
        assert any("c::deep → c::deeper → c::deep" in p for p in problems), problems
        (src / "c" / "deeper.rs").write_text("pub struct Y;\n")
        (src / "b.rs").write_text("pub(crate) struct X;\n")
        assert check_modules([crate]) == [], check_modules([crate])
    print("check_layers self-test: planted violations are caught")


def main() -> int:
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        return 0
    repo = Path(__file__).resolve().parent.parent
    metadata = json.loads(
        subprocess.run(
            ["cargo", "metadata", "--format-version", "1", "--no-deps"],
            cwd=repo,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    members = set(metadata["workspace_members"])
    crates = [Path(p["manifest_path"]).parent for p in metadata["packages"] if p["id"] in members]
    problems = check_ladder(metadata) + check_modules(sorted(crates), repo)
    for p in problems:
        print(f"layer contract: {p}", file=sys.stderr)
    if problems:
        return 1
    print(f"layer contract: {len(crates)} crates on the ladder, no module cycles")
    return 0


if __name__ == "__main__":
    sys.exit(main())
