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
