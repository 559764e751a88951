"""Regenerate the protocol's generated modules in the source tree: `python -m tools.codegen`
(`make codegen`) after editing a spec file; `--check` only verifies, and fails on a stale file.

The specs, the generator and the output are all the source tree's (platform/protocol/), never
the installed package's: the package is installed non-editable, so a generator run from it
would read the installed specs and write into site-packages. The generator is imported from a
throwaway `riverbed` package whose only member is a link to the protocol folder: the codec is
sans-IO and imports nothing outside it, and the real package root (platform/_package.py) would
pull in the client and its compiled modules.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROTOCOL_DIR = REPO / "platform" / "protocol"


def generated(protocol_dir: Path) -> dict[Path, str]:
    """Each generated file of `protocol_dir` with the text its specs give."""
    if "riverbed" in sys.modules:
        raise RuntimeError("tools.codegen runs in a process of its own (riverbed is imported)")
    with tempfile.TemporaryDirectory(prefix="riverbed-codegen-") as scratch:
        package = Path(scratch) / "riverbed"
        package.mkdir()
        (package / "__init__.py").write_text('"""The protocol folder alone."""\n')
        (package / "protocol").symlink_to(protocol_dir.resolve())
        sys.path.insert(0, scratch)
        try:
            codegen = importlib.import_module("riverbed.protocol.codegen")
            schema = importlib.import_module("riverbed.protocol.schema")
            specs_dir = protocol_dir / "specs"
            return {
                protocol_dir / codegen.MESSAGES_FILE: codegen.render_messages(
                    schema.load_api_specs(specs_dir)
                ),
                protocol_dir / codegen.DATA_MESSAGES_FILE: codegen.render_data_messages(
                    schema.load_data_specs(specs_dir / "data")
                ),
            }
        finally:
            sys.path.remove(scratch)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.codegen", description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if a generated file is stale")
    parser.add_argument(
        "--protocol-dir", type=Path, default=PROTOCOL_DIR, help="default: platform/protocol"
    )
    args = parser.parse_args(argv)
    outputs = generated(args.protocol_dir)
    stale = [path for path, text in outputs.items() if _read(path) != text]
    if args.check:
        for path in stale:
            print(f"{path} is stale: run python -m tools.codegen")
        return 1 if stale else 0
    for path in stale:
        path.write_text(outputs[path], encoding="utf-8")
        print(f"wrote {path}")
    return 0


def _read(path: Path) -> str | None:
    return path.read_text(encoding="utf-8") if path.exists() else None


if __name__ == "__main__":
    sys.exit(main())
