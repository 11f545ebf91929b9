"""Static checks of the project's structure: its import graph and where compressor names appear.

Run as ``python -m tests.support.structure`` for a report; ``tests/unit/test_structure.py``
asserts the same. Parsed with ``ast``, so imports inside functions (and under
``TYPE_CHECKING``) count as edges, and docstrings do not count as strings.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: The project's packages (tests excepted: nothing imports them).
PACKAGES = ("planning", "compressors", "workers", "coordinator", "gradwire", "dashboards", "benchmarks", "examples")


def project_modules(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name → file, for every Python file of :data:`PACKAGES`."""
    modules: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def _imported(node: ast.AST, module: str, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        if node.level:
            base = module.split(".")
            base = base[: len(base) - node.level + (1 if is_package else 0)]
            prefix = ".".join(base + ([node.module] if node.module else []))
        else:
            prefix = node.module or ""
        return [prefix] + [f"{prefix}.{alias.name}" for alias in node.names]
    return []


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module → the project modules it imports anywhere in its file (functions included).

    ``from package import name`` counts as importing ``package.name`` when that is a module,
    and importing ``a.b.c`` also imports the packages ``a`` and ``a.b`` (their ``__init__``),
    except the importer's own enclosing packages: Python has imported those before the
    importer runs, so that edge is the same for every module and closes no cycle by itself.
    """
    modules = project_modules(root)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for target in _imported(node, name, is_package):
                parts = target.split(".")
                for end in range(1, len(parts) + 1):
                    candidate = ".".join(parts[:end])
                    if candidate in modules and candidate != name and not name.startswith(candidate + "."):
                        graph[name].add(candidate)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (``[a, b, ..., a]``), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))
    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                out.add(id(first.value))
    return out


def files_naming(names: list[str], root: Path = ROOT) -> dict[str, dict[str, list[int]]]:
    """Name → {file: lines} where a string constant equal to the name appears in code
    (docstrings aside), in every Python file outside ``tests/``, ``benchmarks/`` and venvs."""
    hits: dict[str, dict[str, list[int]]] = {name: defaultdict(list) for name in names}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] in ("tests", "benchmarks") or any(part.startswith(".") for part in rel.parts):
            continue
        tree = ast.parse(path.read_text(), str(path))
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in hits and id(node) not in docs:
                hits[node.value][str(rel)].append(node.lineno)
    return {name: dict(files) for name, files in hits.items()}


if __name__ == "__main__":  # pragma: no cover - a report for people
    sys.path.insert(0, str(ROOT))
    from planning import registry

    print("import cycle:", find_cycle(import_graph()) or "none")
    for name, files in files_naming(list(registry.names())).items():
        print(f"{name!r}: {len(files)} file(s) {files}")
