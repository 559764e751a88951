"""The layers of Riverbed and the imports allowed between them: written down once, here, and
checked by `python -m tools.layers` (and by tests/repo/test_layers.py, so `make test` fails on
a violation).

`ALLOWED` names every layer of the shipped packages and the layers each may import. A module
belongs to the layer with the longest name that is a prefix of its own (`riverbed.hot.storage.log`
belongs to `riverbed.hot.storage`); an import inside a layer is always allowed. Every import
counts: at the top of a module, inside a function, or under `if TYPE_CHECKING` (a type is a
dependency too). The checks:

- every module of `platform/` and `spark/riverbed_spark/` that imports one of them, and every
  module imported, belongs to a layer (a package's `__init__` holding only its docstring need
  not);
- every import of another layer is one that layer's entry allows;
- the allowed imports themselves form no cycle, so the table always describes layers;
- every import names a module of the source tree, and `from package import name` a submodule
  or a name its `__init__` defines: mypy looks for a submodule missing from the tree in the
  installed copy in site-packages, and would pass an import that only an old install can
  satisfy.

`python -m tools.layers --diagram` prints the layer diagram of docs/architecture.md, which the
test compares with the page.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

REPO: Final = Path(__file__).resolve().parents[1]

# Source folders by the import name of their package.
SOURCE_ROOTS: Final = {"riverbed": Path("platform"), "riverbed_spark": Path("spark/riverbed_spark")}
# `import riverbed` / `from riverbed import X` reach the generated package root, which is
# platform/_package.py (setup.py installs it as riverbed/__init__.py).
PACKAGE_ROOT_MODULE: Final = "riverbed._package"

_BASE: Final = frozenset({"riverbed.common", "riverbed.protocol"})
_HOT_BELOW: Final = _BASE | {
    "riverbed.configs",
    "riverbed.security",
    "riverbed.coordination",
    "riverbed.client",
}
_BROKER_BELOW: Final = _HOT_BELOW - {"riverbed.client"} | {
    "riverbed.hot.storage",
    "riverbed.hot.replication",
    "riverbed.tiering",
}

# layer -> the layers it may import. Top of the stack first.
ALLOWED: Final[Mapping[str, frozenset[str]]] = {
    # The command line and local cluster supervisor: may use every layer below.
    "riverbed.cli": frozenset(
        {"riverbed.broker", "riverbed.tiering", "riverbed.hot.storage", "riverbed.errors"}
        | _HOT_BELOW
    ),
    # The PySpark source reads the cold tier directly and the hot tail through the client.
    "riverbed_spark": frozenset(
        {"riverbed.client", "riverbed.configs", "riverbed.tiering", "riverbed.errors"} | _BASE
    ),
    # The broker process: its request path, coordinators and wiring.
    "riverbed.broker": frozenset(
        _BROKER_BELOW | {"riverbed.broker.network", "riverbed.broker.groups"}
    ),
    "riverbed.broker.groups": frozenset(_BROKER_BELOW - {"riverbed.tiering"}),
    "riverbed.broker.network": frozenset(_BASE | {"riverbed.security"}),
    # The cold tier sees the hot tier only through hot.local_log's Protocols.
    "riverbed.tiering": frozenset(_BASE | {"riverbed.configs", "riverbed.hot.local_log"}),
    "riverbed.hot.local_log": frozenset({"riverbed.hot.storage"}),
    "riverbed.hot.replication": frozenset(_HOT_BELOW | {"riverbed.hot.storage"}),
    "riverbed.hot.storage": frozenset(_BASE | {"riverbed.configs"}),
    "riverbed._package": frozenset({"riverbed.client", "riverbed.security"}),
    "riverbed.client": frozenset(_BASE | {"riverbed.errors", "riverbed.security"}),
    "riverbed.configs": frozenset(_BASE | {"riverbed.security", "riverbed.coordination"}),
    "riverbed.security": frozenset(_BASE | {"riverbed.coordination"}),
    "riverbed.coordination": _BASE,
    "riverbed.errors": frozenset({"riverbed.protocol"}),
    "riverbed.protocol": frozenset(),
    "riverbed.common": frozenset(),
}

# What each layer is, for the diagram.
ROLES: Final[Mapping[str, str]] = {
    "riverbed.cli": "the riverbed command, riverbed cluster up",
    "riverbed_spark": "PySpark data source and jobs",
    "riverbed.broker": "server wiring, dispatcher, request handlers, metrics",
    "riverbed.broker.groups": "the group coordinator",
    "riverbed.broker.network": "sockets: server, answers in order",
    "riverbed.tiering": "cold tier: Parquet, object stores, manifest",
    "riverbed.hot.local_log": "what the cold tier may see of a local log",
    "riverbed.hot.replication": "partitions, ISR, follower fetchers",
    "riverbed.hot.storage": "segments, indexes, log, cleaner, retention",
    "riverbed._package": "the public names: from riverbed import ...",
    "riverbed.client": "asyncio producer, consumer, admin",
    "riverbed.configs": "Kafka's broker and topic configs",
    "riverbed.security": "SASL, TLS, ACLs",
    "riverbed.coordination": "ZooKeeper: registry, controller, metadata",
    "riverbed.errors": "the client's exceptions",
    "riverbed.protocol": "sans-IO Kafka codec and record batches",
    "riverbed.common": "helpers: file I/O, backoff, throttle, log events",
}


@dataclass(frozen=True, slots=True)
class Problem:
    path: str  # relative to the repository
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"


def layer_of(module: str, allowed: Mapping[str, frozenset[str]] = ALLOWED) -> str | None:
    """The layer `module` belongs to: the longest layer name that is `module` or a package
    holding it."""
    best = None
    for layer in allowed:
        if (module == layer or module.startswith(layer + ".")) and (
            best is None or len(layer) > len(best)
        ):
            best = layer
    return best


def check(repo: Path = REPO, allowed: Mapping[str, frozenset[str]] = ALLOWED) -> list[Problem]:
    """Every problem with the layers of the tree at `repo`; empty when all holds."""
    problems = [Problem("tools/layers.py", 0, text) for text in _table_problems(allowed)]
    modules = dict(_modules(repo))
    for module, path in sorted(modules.items()):
        relative = str(path.relative_to(repo))
        for line, imported, problem in _imports(path, module, modules):
            problem = problem or _layer_problem(module, imported, allowed)
            if problem is not None:
                problems.append(Problem(relative, line, problem))
    return problems


def _layer_problem(module: str, imported: str, allowed: Mapping[str, frozenset[str]]) -> str | None:
    source, target = layer_of(module, allowed), layer_of(imported, allowed)
    if source is None:
        return f"{module} belongs to no layer of ALLOWED"
    if target is None:
        return f"{imported} belongs to no layer of ALLOWED"
    if target != source and target not in allowed[source]:
        return f"{source} may not import {target} ({imported})"
    return None


def diagram(allowed: Mapping[str, frozenset[str]] = ALLOWED) -> str:
    """The layers from the top down, each with its role and what it may import."""
    width = max(len(layer) for layer in allowed)
    rows = []
    for layer, may_import in allowed.items():
        below = ", ".join(_short(name) for name in sorted(may_import)) or "nothing"
        rows.append(f"{layer:<{width}}  {ROLES[layer]}\n{'':<{width}}    -> {below}")
    return "\n".join(rows)


def _short(layer: str) -> str:
    return layer.removeprefix("riverbed.")


def _modules(repo: Path) -> Iterator[tuple[str, Path]]:
    """(module name, file) for every Python module of the shipped packages; Cython sources
    by their .pyx (their .pyi stub describes the same module)."""
    for package, root in SOURCE_ROOTS.items():
        for path in sorted((repo / root).rglob("*")):
            if path.suffix not in (".py", ".pyx") or "__pycache__" in path.parts:
                continue
            parts = list(path.relative_to(repo / root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            yield ".".join([package, *parts]), path


def _imports(
    path: Path, module: str, modules: Mapping[str, Path]
) -> Iterator[tuple[int, str, str | None]]:
    """(line, module imported, problem or None) for every import of a shipped package in
    `path`. `from P import name` imports the module `P.name` when the tree has one, else P's
    name `name`, which P (a package: its `__init__`) must define."""
    if path.suffix == ".pyx":
        return  # Cython: its cimports are of the .pxd beside it, and it imports no layer
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _shipped(alias.name):
                    yield node.lineno, *_module(alias.name, modules)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, package)
            if base is None or not _shipped(base):
                continue
            for alias in node.names:
                if f"{base}.{alias.name}" in modules:
                    yield node.lineno, f"{base}.{alias.name}", None
                    continue
                imported, problem = _module(base, modules)
                # A plain module's names are mypy's to check; a package's missing submodule
                # would be looked for in site-packages (see the docstring).
                if (
                    problem is None
                    and _is_package(modules[imported])
                    and alias.name not in _defined_names(modules[imported])
                ):
                    problem = f"{alias.name} is no module of {base}, nor a name it defines"
                yield node.lineno, imported, problem


def _module(name: str, modules: Mapping[str, Path]) -> tuple[str, str | None]:
    """The module an import of `name` reaches, and a problem if the tree has none."""
    module = PACKAGE_ROOT_MODULE if name == "riverbed" else name
    return module, None if module in modules else f"{name} is no module of the source tree"


def _is_package(path: Path) -> bool:
    return path.name in ("__init__.py", "_package.py")


def _defined_names(path: Path) -> set[str]:
    """Names a module binds at its top level (what `from module import name` can take)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    names = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {
                n.id for target in targets for n in ast.walk(target) if isinstance(n, ast.Name)
            }
    return names


def _absolute(node: ast.ImportFrom, package: str) -> str | None:
    if not node.level:
        return node.module
    parts = package.split(".")
    if node.level - 1 > len(parts):
        return None
    base = ".".join(parts[: len(parts) - node.level + 1])
    return f"{base}.{node.module}" if node.module else base


def _shipped(module: str) -> bool:
    return module.split(".")[0] in SOURCE_ROOTS


def _table_problems(allowed: Mapping[str, frozenset[str]]) -> list[str]:
    """Each layer that can reach itself through allowed imports, and each name that is no
    layer."""
    problems = []
    for start in allowed:
        seen: set[str] = set()
        stack = list(allowed[start])
        while stack:
            layer = stack.pop()
            if layer == start:
                problems.append(f"ALLOWED lets {start} import itself through other layers")
                break
            if layer in seen or layer not in allowed:
                continue
            seen.add(layer)
            stack.extend(allowed[layer])
    unknown = {t for targets in allowed.values() for t in targets} - set(allowed)
    problems += [f"ALLOWED names {name}, which is no layer" for name in sorted(unknown)]
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.layers", description=__doc__)
    parser.add_argument("--diagram", action="store_true", help="print the layer diagram")
    args = parser.parse_args(argv)
    if args.diagram:
        print(diagram())
        return 0
    problems = check()
    for problem in problems:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
