"""Fuzzing the sans-IO Kafka codec: the frame reader, every request decoder, the record batches.

- `targets`: the oracles. Each takes bytes (or a stream of chunks) and fails only if the code
  under test does something hostile input must never make it do: raise anything but the
  documented errors, hand out an event of the wrong type, or accept what it cannot re-encode.
- `corpus`: valid encodings of every request version we advertise (seeds and mutation bases).
- `wire_map`: an independent encoder that also says where each length, count and tag lies, so
  mutations can lie about exactly those.
- `__main__`: the coverage-guided driver (atheris / libFuzzer): `make fuzz`.

The hypothesis tests in tests/protocol/test_fuzz_*.py drive the same targets.
"""
