"""The README's client example runs as printed (only the bootstrap address is changed)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.support.broker import BrokerProcess

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_client_example_runs(broker: BrokerProcess, tmp_path: Path) -> None:
    section = README.read_text().split("## The asyncio client", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match is not None, "the README lost its client example"
    script = tmp_path / "example.py"
    script.write_text(match.group(1).replace("127.0.0.1:9092", broker.bootstrap))
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "retention.ms" in result.stdout
    assert "2 records" in result.stdout
    assert "0 b'value'" in result.stdout
