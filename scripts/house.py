"""The shape of the house: import circles, upward arrows, long files and long functions.

    .venv/bin/python scripts/house.py [--strict]

Every import statement counts, lazy and type-only ones too: a circle hidden behind TYPE_CHECKING
is still a circle for the reader. Layers run one way (docs/code-layout.md), top first:

    cli -> train, eval, compare -> recipe -> rollout, rewards, models, data -> sandbox, runs
        -> algorithms -> core

The top level holds cli.py and folders only (TOP_LEVEL). An
arrow from a lower layer to a higher one is "upward". Inside a layer's package, its wings (WINGS)
are layers too: train/'s run -> async_rollouts -> step -> engines. Two packages that import each
other are a "package circle" even on one layer (rollout/ and models/, say): the type both sides
share belongs below both. Not an import: gspo_cli/core/engine_catalogue.py names
each engine's class as "module:attribute", loaded by the layer that builds it (the list sits
low so that the recipe can check names; the classes stay where they belong).

A function may pass MAX_FUNCTION_LINES only when its first comment line starts with
LONG_FUNCTION_MARK and says why. Prints every finding and a summary line; with --strict exits 1
when there is any (tests/unit/repo/test_house.py holds the package at none).
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

PACKAGE = "gspo_cli"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60
# Top layer first; a module's layer is that of its first dotted part below the package.
LAYERS: list[set[str]] = [
    {"cli"},
    {"train", "eval", "compare"},
    {"recipe"},
    {"rollout", "rewards", "models", "data"},
    {"sandbox", "runs"},
    {"algorithms"},
    {"core"},
]
# A package's wings, top first: a wing imports only the wings below it.
WINGS: dict[str, list[str]] = {"train": ["run", "async_rollouts", "step", "engines"]}
LONG_FUNCTION_MARK = "# long on purpose:"
# The package's top level: these files, and folders. Anything else is a loose module.
TOP_LEVEL = {"__init__.py", "cli.py"}
# Packages of one layer that must not import the other: (importer, imported).
APART: list[tuple[str, str]] = [
    ("rollout", "rewards"),  # the sandbox and the import probe sit below both
    ("models", "rollout"),  # a model knows nothing of rollouts; the step builds its batch
]


def module_name(path: Path, root: Path = ROOT) -> str:
    """gspo_cli/train/step.py -> gspo_cli.train.step (a package is its __init__)."""
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(tree: ast.Module, name: str, is_package: bool, known: set[str]) -> set[str]:
    """The package's modules that `name` imports anywhere (top level, lazily or type-only)."""
    found: set[str] = set()
    package = name if is_package else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            # `from pkg import module` imports the module; `from module import thing` the module.
            submodules = [f"{base}.{alias.name}" for alias in node.names]
            targets = [m for m in submodules if m in known] or [base]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def layer_of(module: str) -> int:
    """0 for cli, growing downwards; the top-level helpers are the bottom layer."""
    first = module.split(".")[1] if "." in module else ""
    for rank, layer in enumerate(LAYERS):
        if first in layer:
            return rank
    return len(LAYERS)


def wing_of(module: str) -> tuple[str, int] | None:
    """(package, rank) of the wing `module` sits in (0 = the top wing), or None."""
    parts = module.split(".")
    if len(parts) < 3 or parts[1] not in WINGS:
        return None
    wings = WINGS[parts[1]]
    return (parts[1], wings.index(parts[2])) if parts[2] in wings else None


def upward(source: str, target: str) -> bool:
    """Whether `source` -> `target` runs up a layer, or up a wing inside one package."""
    if layer_of(target) != layer_of(source):
        return layer_of(target) < layer_of(source)
    here, there = wing_of(source), wing_of(target)
    return here is not None and there is not None and here[0] == there[0] and there[1] < here[1]


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Arrows between sibling parts of the package: for each module arrow a -> b, the two
    children of their deepest common package that hold a and b (a module or a package)."""
    found: dict[str, set[str]] = {}
    for source, targets in graph.items():
        for target in targets:
            a, b = source.split("."), target.split(".")
            common = 0
            while common < min(len(a), len(b)) and a[common] == b[common]:
                common += 1
            if common >= min(len(a), len(b)):  # one contains the other: a package's own code
                continue
            child_a, child_b = ".".join(a[: common + 1]), ".".join(b[: common + 1])
            found.setdefault(child_a, set()).add(child_b)
            found.setdefault(child_b, set())
    return found


def package_circles(graph: dict[str, set[str]], packages: set[str]) -> list[list[str]]:
    """Circles between sibling parts that hold a package: packages that import each other."""
    return [c for c in circles(package_graph(graph)) if packages.intersection(c)]


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            advanced = False
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def apart(source: str, target: str) -> bool:
    """Whether `source` -> `target` joins two packages that APART keeps apart."""
    first = lambda module: module.split(".")[1] if "." in module else ""  # noqa: E731
    return (first(source), first(target)) in APART


def long_functions(tree: ast.Module, lines: list[str]) -> list[tuple[str, int, int]]:
    """(name, first line, length) of each function longer than MAX_FUNCTION_LINES, unexplained."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        length = (node.end_lineno or node.lineno) - start + 1
        if length > MAX_FUNCTION_LINES and not _explained(node, lines):
            found.append((node.name, node.lineno, length))
    return found


def _explained(node: ast.FunctionDef | ast.AsyncFunctionDef, lines: list[str]) -> bool:
    """Whether the function's first comment line (after its signature) is the long mark."""
    body = lines[node.lineno : node.end_lineno]  # after the `def` line
    comments = [line.strip() for line in body if line.strip().startswith("#")]
    return bool(comments) and comments[0].startswith(LONG_FUNCTION_MARK)


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Each module of the package at `root` -> the package's modules it imports."""
    files = sorted(root.rglob("*.py"))
    known = {module_name(path, root) for path in files}
    return {
        module_name(path, root): imported_modules(
            ast.parse(path.read_text()), module_name(path, root), path.name == "__init__.py", known
        )
        for path in files
    }


def survey(root: Path = ROOT) -> list[str]:
    """Every finding, one line each."""
    findings: list[str] = []
    for path in sorted(root.glob("*.py")):
        if path.name not in TOP_LEVEL:
            findings.append(f"loose module: {path.relative_to(root.parent)} (top level: folders)")
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        lines = text.splitlines()
        where = path.relative_to(root.parent)
        if len(lines) > MAX_FILE_LINES:
            findings.append(f"long file: {where} has {len(lines)} lines")
        for function, line, length in long_functions(ast.parse(text), lines):
            findings.append(f"long function: {where}:{line} {function} has {length} lines")
    graph = import_graph(root)
    for name, targets in sorted(graph.items()):
        for target in sorted(targets):
            if upward(name, target):
                findings.append(f"upward arrow: {name} -> {target}")
            if apart(name, target):
                findings.append(f"forbidden arrow: {name} -> {target}")
    for component in circles(graph):
        findings.append("import circle: " + " <-> ".join(component))
    packages = {module_name(path, root) for path in root.rglob("__init__.py")}
    for component in package_circles(graph, packages):
        findings.append("package circle: " + " <-> ".join(component))
    return findings


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strict", action="store_true", help="exit 1 when anything is found")
    findings = survey()
    strict = parser.parse_args().strict
    for finding in findings:
        print(finding)
    kinds = [
        "import circle", "package circle", "upward arrow", "forbidden arrow", "loose module",
        "long file", "long function",
    ]  # fmt: skip
    print(", ".join(f"{sum(f.startswith(k) for f in findings)} {k}s" for k in kinds))
    return 1 if strict and findings else 0


if __name__ == "__main__":
    sys.exit(main())
