"""Build hooks: generate `riverbed/__init__.py` from `platform/_package.py`, compile the record
codec.

`platform/` is the source folder of the `riverbed` package but must not contain an `__init__.py`
(from the repo root, `import platform` would find it instead of the standard library module).

`riverbed.protocol.records_fast` is Cython (the consumer's per-record loop) and has no pure-Python
fallback: a build without Cython or a C compiler fails rather than yield a slow client.
"""

from pathlib import Path

from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_py import build_py

RECORDS_FAST = Extension(
    "riverbed.protocol.records_fast",
    ["platform/protocol/records_fast.pyx"],
    extra_compile_args=["-O2"],
)


class BuildPyWithPackageInit(build_py):
    def run(self) -> None:
        super().run()
        source = Path(__file__).parent / "platform" / "_package.py"
        target = Path(self.build_lib) / "riverbed" / "__init__.py"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(source.read_text())


setup(
    cmdclass={"build_py": BuildPyWithPackageInit},
    # Cython's generated C is a build product: the wheel carries the compiled module only.
    exclude_package_data={"riverbed.protocol": ["*.c", "*.pyx"]},
    ext_modules=cythonize([RECORDS_FAST], compiler_directives={"language_level": "3"}),
)
