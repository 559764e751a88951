"""Build hook: generate `riverbed/__init__.py` from `platform/_package.py`.

`platform/` is the source folder of the `riverbed` package but must not contain an `__init__.py`
(from the repo root, `import platform` would find it instead of the standard library module).
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyWithPackageInit(build_py):
    def run(self) -> None:
        super().run()
        source = Path(__file__).parent / "platform" / "_package.py"
        target = Path(self.build_lib) / "riverbed" / "__init__.py"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(source.read_text())


setup(cmdclass={"build_py": BuildPyWithPackageInit})
