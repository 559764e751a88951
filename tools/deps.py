"""Print the dependencies listed in pyproject.toml, one per line (for `pip install`).

`python -m tools.deps runtime` prints [project].dependencies, `test` prints the `test` extra.
"""

import sys
import tomllib
from pathlib import Path


def main() -> None:
    project = tomllib.loads(Path("pyproject.toml").read_text())["project"]
    which = sys.argv[1] if len(sys.argv) > 1 else "runtime"
    deps = (
        project["dependencies"] if which == "runtime" else project["optional-dependencies"][which]
    )
    print("\n".join(deps))


if __name__ == "__main__":
    main()
