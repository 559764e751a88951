"""The layer contract of tools/layers.py holds for the shipped packages, the architecture page
shows it as written, and the checker finds each kind of violation."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools import layers

REPO = Path(__file__).resolve().parents[2]


def test_the_shipped_packages_keep_their_layers() -> None:
    problems = layers.check(REPO)
    assert problems == [], "\n".join(str(p) for p in problems)


def test_the_architecture_page_shows_the_layers_as_written() -> None:
    page = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert layers.diagram() in page, "regenerate it: python -m tools.layers --diagram"


def test_every_top_level_package_is_a_layer() -> None:
    named = {layer.split(".")[1] for layer in layers.ALLOWED if layer.startswith("riverbed.")}
    folders = {p.name for p in (REPO / "platform").iterdir() if p.is_dir() and p.name[0] != "_"}
    modules = {p.stem for p in (REPO / "platform").glob("*.py") if not p.stem.startswith("_")}
    assert folders | modules <= named


# A small tree and table for the checker's own tests: c at the bottom, b above it, a on top.
TABLE = {
    "riverbed.a": frozenset({"riverbed.b", "riverbed.c"}),
    "riverbed.b": frozenset({"riverbed.c"}),
    "riverbed.c": frozenset(),
}


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    (tmp_path / "spark" / "riverbed_spark").mkdir(parents=True)
    sources = {
        "_package.py": "",
        "a/__init__.py": "",
        "a/top.py": "from riverbed.b.middle import f\n",
        "b/__init__.py": "",
        "b/middle.py": "from riverbed.c import bottom\n\ndef f() -> None: ...\n",
        "c/__init__.py": "NAME = 1\n",
        "c/bottom.py": "",
        **files,
    }
    for name, text in sources.items():
        path = tmp_path / "platform" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def _messages(repo: Path, table: dict[str, frozenset[str]] = TABLE) -> list[str]:
    return [p.message for p in layers.check(repo, table)]


def test_a_tree_that_keeps_its_layers_has_no_problem(tmp_path: Path) -> None:
    assert _messages(_tree(tmp_path, {"c/more.py": "from riverbed.c import NAME\n"})) == []


@pytest.mark.parametrize(
    "source",
    [
        "from riverbed.a.top import x\n",
        "import riverbed.a.top\n",
        "from riverbed.a import top\n",
        "from ..a import top\n",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from riverbed.a.top import x\n",
        "def later() -> None:\n    from riverbed.a.top import x\n",
    ],
)
def test_an_import_of_a_higher_layer_is_found_however_it_is_written(
    tmp_path: Path, source: str
) -> None:
    repo = _tree(tmp_path, {"c/up.py": source})
    assert _messages(repo) == ["riverbed.c may not import riverbed.a (riverbed.a.top)"]


def test_an_import_the_source_tree_cannot_satisfy_is_found(tmp_path: Path) -> None:
    repo = _tree(
        tmp_path,
        {"a/gone.py": "from riverbed.b import removed\nimport riverbed.c.removed\n"},
    )
    assert _messages(repo) == [
        "removed is no module of riverbed.b, nor a name it defines",
        "riverbed.c.removed is no module of the source tree",
    ]


def test_a_module_outside_every_layer_is_found(tmp_path: Path) -> None:
    repo = _tree(tmp_path, {"d/new.py": "from riverbed.c import bottom\n"})
    assert _messages(repo) == ["riverbed.d.new belongs to no layer of ALLOWED"]


def test_a_table_with_a_cycle_is_refused(tmp_path: Path) -> None:
    table = {**TABLE, "riverbed.c": frozenset({"riverbed.a"})}
    assert "ALLOWED lets riverbed.c import itself through other layers" in _messages(
        _tree(tmp_path, {}), table
    )
