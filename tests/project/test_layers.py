"""The layer rules of DESIGN.md §3, read from the source: every import of an asrdist module, at
module level or inside a function, is an edge between two packages (a top-level module such as
`asrdist.config` is a node of its own). The rules hold and the package graph has no cycle."""
from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from tests.support.paths import PACKAGE


FORBIDDEN = {
    "parallel": {"corpus", "features", "data", "models", "train", "run", "eval", "bench", "compare", "sim",
                 "calibrate"},
    "models": {"parallel", "train", "run", "eval", "bench", "compare", "sim", "calibrate"},
    "train": {"bench", "eval", "sim", "corpus", "features", "run", "compare", "calibrate"},
    "features": {"corpus", "data", "train", "run", "eval", "calibrate"},
    "data": {"train", "run", "eval", "bench", "compare", "calibrate"},
    "io": {"corpus", "features", "data", "eval", "train", "run", "parallel", "models", "bench", "compare", "sim",
           "calibrate"},
    "utils": {"io", "corpus", "features", "data", "eval", "train", "run", "parallel", "models", "bench", "compare",
              "sim", "cluster", "optim", "calibrate"},
    "cluster": {"run", "train", "eval", "bench", "compare", "corpus", "features", "data", "calibrate"},
    "run": {"calibrate", "compare", "bench"},
    "sim": {"calibrate", "compare", "bench"},
    "calibrate": {"compare", "bench"},
}
"""package -> packages it must not import (DESIGN.md §3, and the layers it implies: io and utils at
the bottom, the engine and the strategies below the speech job, the simulator's calibration above
the job and the simulator, below the comparison and the benches that read it)."""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def node(module: str) -> str:
    """The graph node of an asrdist module: its package, or the module itself at the top."""
    parts = module.split(".")
    if len(parts) > 2 or (len(parts) == 2 and (PACKAGE / parts[1]).is_dir()):
        return parts[1]
    return module


def imports(path: Path) -> list[tuple[str, int, bool]]:
    """(imported asrdist module, line, at module level) of every import in the file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    top = {id(n) for n in tree.body}
    me = module_name(path)
    found = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            names = [a.name for a in n.names]
        elif isinstance(n, ast.ImportFrom):
            if n.level:
                base = me.split(".")[: len(me.split(".")) - n.level + (path.name == "__init__.py")]
                names = [".".join(base + ([n.module] if n.module else []))]
            else:
                names = [n.module or ""]
            # `from asrdist.pkg import module`: the module is imported
            names = [f"{names[0]}.{a.name}" if (PACKAGE.parent / f"{names[0]}.{a.name}".replace(".", "/")).with_suffix(".py").is_file()
                     or (PACKAGE.parent / f"{names[0]}.{a.name}".replace(".", "/")).is_dir() else names[0] for a in n.names]
        else:
            continue
        found += [(name, n.lineno, id(n) in top) for name in names if name.split(".")[0] == "asrdist"]
    return found


def package_edges() -> dict[tuple[str, str], list[str]]:
    """(from node, to node) -> where (file:line) for every import across nodes."""
    edges = defaultdict(list)
    for path in sorted(PACKAGE.rglob("*.py")):
        here = node(module_name(path))
        for name, line, _ in imports(path):
            there = node(name)
            if there != here and there != "asrdist":
                edges[(here, there)].append(f"{path.relative_to(PACKAGE.parent)}:{line}")
    return edges


def cycles(edges) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    graph = defaultdict(set)
    for a, b in edges:
        graph[a].add(b)
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
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

    for v in sorted(list(graph)):
        if v not in index:
            visit(v)
    return out


def test_layer_rules_hold():
    broken = [f"{a} -> {b}: {', '.join(where[:3])}" for (a, b), where in sorted(package_edges().items())
              if b in FORBIDDEN.get(a, ())]
    assert not broken, "\n".join(broken)


def test_no_package_cycles():
    edges = package_edges()
    found = cycles(edges)
    detail = [f"{a} -> {b}: {where[0]}" for comp in found for (a, b), where in sorted(edges.items())
              if a in comp and b in comp]
    assert not found, f"{found}\n" + "\n".join(detail)


@pytest.mark.parametrize("source, expected", [
    ({("a", "b"): [], ("b", "c"): []}, []),
    ({("a", "b"): [], ("b", "c"): [], ("c", "a"): [], ("c", "d"): []}, [["a", "b", "c"]]),
])
def test_the_cycle_finder_finds_cycles(source, expected):
    assert cycles(source) == expected


def test_the_reader_sees_imports_inside_functions(tmp_path, monkeypatch):
    module = PACKAGE / "train" / "trainer.py"
    inside = [name for name, _, top in imports(module) if not top]
    at_top = [name for name, _, top in imports(module) if top]
    assert at_top  # the engine's own imports are read
    assert all(name.startswith("asrdist.") for name in inside + at_top)
    fake = tmp_path / "asrdist" / "parallel" / "x.py"
    fake.parent.mkdir(parents=True)
    fake.write_text("def f():\n    from asrdist.corpus.lexicon import Lexicon\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path / "asrdist")
    assert [(n, top) for n, _, top in imports(fake)] == [("asrdist.corpus.lexicon", False)]


def unexplained_inner_imports(path: Path) -> list[str]:
    """Imports inside functions with no comment saying why: on the import's line, or on the line
    above it or above the imports it is grouped with."""
    lines = path.read_text().splitlines()
    tree = ast.parse("\n".join(lines), filename=str(path))
    import_lines = {i for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                    for i in range(n.lineno, n.end_lineno + 1)}
    found = []
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for n in ast.walk(fn):
            if not isinstance(n, (ast.Import, ast.ImportFrom)):
                continue
            if any("#" in lines[i - 1] for i in range(n.lineno, n.end_lineno + 1)):
                continue
            above = n.lineno - 1
            while above in import_lines and "#" not in lines[above - 1]:
                above -= 1
            if not lines[above - 1].strip().startswith("#") and "#" not in lines[above - 1]:
                found.append(f"{path.relative_to(PACKAGE.parent)}:{n.lineno}: {lines[n.lineno - 1].strip()}")
    return found


def test_imports_inside_functions_say_why():
    """DESIGN.md §3: imports at module top, unless a comment says why (a cycle, start-up time, an
    optional dependency)."""
    found = [line for path in sorted(PACKAGE.rglob("*.py")) for line in unexplained_inner_imports(path)]
    assert not found, "\n".join(found)


def test_an_unexplained_inner_import_is_found(tmp_path, monkeypatch):
    module = tmp_path / "asrdist" / "m.py"
    module.parent.mkdir()
    module.write_text("def f():\n    # why\n    import json\n    import os\n\n\ndef g():\n    import re\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path / "asrdist")
    assert unexplained_inner_imports(module) == ["asrdist/m.py:8: import re"]


def environment_reads(path: Path) -> list[str]:
    """`os.environ` / `os.getenv` / `os.putenv` uses in the file: each a line `path:line: text`."""
    tree = ast.parse(path.read_text(), filename=str(path))
    lines = path.read_text().splitlines()
    uses = sorted(n.lineno for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
                  and n.value.id == "os" and n.attr in ("environ", "getenv", "putenv", "unsetenv"))
    return [f"{path.relative_to(PACKAGE.parent)}:{line}: {lines[line - 1].strip()}" for line in uses]


def test_only_the_environment_module_touches_the_environment():
    """STYLE.md 5: nothing deep in the code reads os.environ; `asrdist.utils.environ` is the one
    module that reads or writes the process's variables (JobEnv reads the job's through it)."""
    owner = PACKAGE / "utils" / "environ.py"
    found = [line for path in sorted(PACKAGE.rglob("*.py")) if path != owner for line in environment_reads(path)]
    assert not found, "\n".join(found)
    assert environment_reads(owner)


def test_an_environment_read_is_found(tmp_path, monkeypatch):
    module = tmp_path / "asrdist" / "m.py"
    module.parent.mkdir()
    module.write_text("import os\n\nHOME = os.environ.get('HOME')\nX = os.getenv('X')\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path / "asrdist")
    assert environment_reads(module) == ["asrdist/m.py:3: HOME = os.environ.get('HOME')",
                                         "asrdist/m.py:4: X = os.getenv('X')"]
