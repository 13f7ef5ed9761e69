"""The one error type of the benchmark: a message that says what, where, and how to fix it."""

from __future__ import annotations


class BenchError(Exception):
    """A problem with the inputs or the server; the CLI prints it and exits 2."""
