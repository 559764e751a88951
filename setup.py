"""Build hooks: generate `riverbed/__init__.py` from `platform/_package.py`, compile the record
codec.

`platform/` is the source folder of the `riverbed` package but must not contain an `__init__.py`
(from the repo root, `import platform` would find it instead of the standard library module).

`riverbed.protocol.records_fast` (the client's per-record loops) and
`riverbed.tiering.records_columns` (the tiering's) are Cython with no pure-Python fallback: a
build without Cython or a C compiler fails rather than yield a slow client or broker.
"""

from pathlib import Path

from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_py import build_py

# The compiled record loops; both cimport platform/protocol/kafka_varint.pxd (inline only).
COMPILED = [
    Extension(name, [source], extra_compile_args=["-O2"])
    for name, source in (
        ("riverbed.protocol.records_fast", "platform/protocol/records_fast.pyx"),
        ("riverbed.tiering.records_columns", "platform/tiering/records_columns.pyx"),
    )
]


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
    exclude_package_data={
        "riverbed.protocol": ["*.c", "*.pyx", "*.pxd"],
        "riverbed.tiering": ["*.c", "*.pyx"],
    },
    ext_modules=cythonize(
        COMPILED, include_path=["platform/protocol"], compiler_directives={"language_level": "3"}
    ),
)
