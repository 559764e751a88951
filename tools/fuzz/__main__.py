"""Coverage-guided fuzzing of the codec with atheris (libFuzzer for Python).

    python -m tools.fuzz stream|request|records [--seconds N] [--workdir DIR] [-libFuzzer_flag=...]
    make fuzz FUZZ_SECONDS=60 [FUZZ_TARGETS="stream request records"]

Each target runs for `--seconds`, from a corpus under `<workdir>/corpus/<target>` that is
seeded with valid encodings (every request version we advertise, record batches under every
codec) and kept between runs. A crash (an uncaught exception, a blown RSS or time limit) stops
the run and leaves its input in `<workdir>/crashes/<target>/`; replay one with
`python -m tools.fuzz <target> <workdir>/crashes/<target>/crash-...`, then turn it into a
regression test (tests/protocol/test_fuzz_regressions.py).

Only Python code is instrumented for coverage (riverbed.*, and the tests' record oracle): the
compiled record decoder (records_fast) is exercised, and its crashes caught, but libFuzzer does
not see its branches; it sees the oracle's, which reads the same format field by field, so the
records target still finds its way into records.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final

import atheris

# Everything of ours is imported inside this block, so that all of it is instrumented.
with atheris.instrument_imports(
    include=["riverbed", "tools.fuzz", "tests.support.reference_decoder"]
):
    from riverbed.protocol.records_header import RECORDS_POSITION

    from tools.fuzz import corpus, targets

# libFuzzer's limits: an input that takes longer, or a process that grows past this much
# memory, is reported as a crash. Our inputs are at most MAX_LEN bytes and every decoder is
# bounded by a small multiple of its input (or, for decompression, by a named limit well below
# this), so either means a bug.
RSS_LIMIT_MB: Final = 2048
INPUT_TIMEOUT_S: Final = 10
MAX_LEN: Final = 1 << 16
TARGETS: Final[dict[str, Callable[[bytes], None]]] = {
    "stream": targets.fuzz_stream,
    "request": targets.fuzz_request,
    "records": targets.fuzz_records,
}


def seeds(target: str) -> Iterator[bytes]:
    frames = [frame for _, _, frame in corpus.seed_frames()]
    pairs = corpus.advertised_versions()
    if target == "stream":
        yield b"\x00" + b"".join(frames[:8])
        for frame in frames:
            yield b"\x03\x00\x07\x3f" + frame
    elif target == "request":
        for api_key, version, frame in corpus.seed_frames():
            # byte 0 picks (api_key, version); the rest follows api_key and api_version.
            yield bytes([pairs.index((api_key, version))]) + frame[8:]
    else:
        batches = corpus.sample_batch()
        yield b"\x00" + batches
        # Modes 1-3 (targets.fuzz_records): a header, then a records section to wrap.
        header, section = batches[:RECORDS_POSITION], batches[RECORDS_POSITION:]
        for codec in range(5):
            for mode in (1, 2, 3):
                yield bytes([mode | codec << 2]) + header + section[:40]


def write_seeds(target: str, directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for seed in seeds(target):
        (directory / hashlib.sha1(seed).hexdigest()).write_bytes(seed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", choices=sorted(TARGETS))
    parser.add_argument("inputs", nargs="*", help="replay these inputs instead of fuzzing")
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--workdir", type=Path, default=Path(".fuzz"))
    # Anything else (-jobs=2, -dict=...) goes to libFuzzer as it is.
    args, extra = parser.parse_known_args()
    crashes = args.workdir / "crashes" / args.target
    crashes.mkdir(parents=True, exist_ok=True)
    flags = [
        f"-rss_limit_mb={RSS_LIMIT_MB}",
        f"-timeout={INPUT_TIMEOUT_S}",
        f"-max_len={MAX_LEN}",
        f"-artifact_prefix={crashes}/",
        "-print_final_stats=1",
    ]
    if args.inputs:
        argv = [sys.argv[0], *flags, *extra, *args.inputs]
    else:
        corpus_dir = args.workdir / "corpus" / args.target
        write_seeds(args.target, corpus_dir)
        argv = [sys.argv[0], *flags, f"-max_total_time={args.seconds}", *extra, str(corpus_dir)]
    atheris.Setup(argv, TARGETS[args.target])
    atheris.Fuzz()


if __name__ == "__main__":
    main()
