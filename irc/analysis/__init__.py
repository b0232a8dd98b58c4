"""Whole-module checks: the verifier run after every pass, and the interval proof
that every load and store stays inside its buffer."""
