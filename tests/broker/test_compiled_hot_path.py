"""The installed broker runs its hot path compiled (setup.py's HOT_PATH_MODULES, built with
mypyc): a build that quietly shipped those modules as Python would still pass every other test,
only slower."""

from __future__ import annotations

import ast
import importlib
import importlib.machinery
from pathlib import Path

import pytest

SETUP_PY = Path(__file__).resolve().parents[2] / "setup.py"


def hot_path_modules() -> list[str]:
    """The module names setup.py compiles, read from its HOT_PATH_MODULES list."""
    for node in ast.parse(SETUP_PY.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "HOT_PATH_MODULES"
            for target in node.targets
        ):
            paths: list[str] = ast.literal_eval(node.value)
            return ["riverbed." + path.removesuffix(".py").replace("/", ".") for path in paths]
    raise AssertionError("setup.py has no HOT_PATH_MODULES list")


def test_setup_compiles_the_modules_every_produce_and_fetch_runs_through() -> None:
    names = hot_path_modules()
    for name in (
        "riverbed.broker.network.server",
        "riverbed.broker.handlers.produce",
        "riverbed.broker.handlers.fetch",
        "riverbed.hot.storage.log",
        "riverbed.hot.replication.replica_fetcher",
    ):
        assert name in names


@pytest.mark.parametrize("name", hot_path_modules())
def test_the_installed_module_is_a_compiled_extension(name: str) -> None:
    module = importlib.import_module(name)
    assert module.__file__ is not None
    assert module.__file__.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)), module.__file__


def _awaits_in_handlers(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, block) of every await, async with and async for inside an except or finally."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Try | ast.TryStar):
            continue
        blocks = [("except", handler.body) for handler in node.handlers]
        blocks.append(("finally", node.finalbody))
        for block, body in blocks:
            for statement in body:
                for inner in ast.walk(statement):
                    if isinstance(inner, ast.Await | ast.AsyncWith | ast.AsyncFor):
                        found.append((inner.lineno, block))
    return found


def test_the_compiled_modules_never_await_inside_except_or_finally() -> None:
    """mypyc (checked with 2.4.1) leaves the exception a compiled coroutine is handling in every
    other task's sys.exc_info() while that coroutine is suspended in an except or finally block;
    compiled code in another task then raised it again. In CI a broker's client connection died
    of a replica fetcher's ConnectionRefusedError this way. So in these modules the awaits of
    error handling come after the block, never in it."""
    offenders = [
        f"{path}:{line} ({block})"
        for path in _hot_path_sources()
        for line, block in _awaits_in_handlers(ast.parse(path.read_text()))
    ]
    assert offenders == []


def test_the_await_check_finds_what_it_looks_for() -> None:
    source = (
        "async def f():\n"
        "    try:\n"
        "        await g()\n"
        "    except OSError:\n"
        "        await h()\n"
        "    finally:\n"
        "        async with lock:\n"
        "            pass\n"
    )
    assert _awaits_in_handlers(ast.parse(source)) == [(5, "except"), (7, "finally")]


def _hot_path_sources() -> list[Path]:
    platform = SETUP_PY.parent / "platform"
    names = hot_path_modules()
    sources = [
        platform / (name.removeprefix("riverbed.").replace(".", "/") + ".py") for name in names
    ]
    assert all(source.is_file() for source in sources), sources
    return sources
