"""Validation against torch: reference semantics, the `--check` verdict, the
random-graph generator and the loop/tile-level fuzzer."""
