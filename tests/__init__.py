"""kvtier's test suite (a package, so that ``tests.support`` imports the same way from the tests,
from their child processes and from the benchmarks)."""
