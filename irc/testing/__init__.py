"""Validation against torch: reference semantics, the `--check` verdict, the
random-graph and random-torch-program generators and the loop/tile-level fuzzer."""
