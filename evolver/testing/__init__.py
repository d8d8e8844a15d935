"""The harness the tests and the benchmarks share: a real daemon in a child process (``daemon``), the
kill and power-loss drills (``durability``) and the API fuzzer (``fuzz``).

Not part of the product: nothing outside this package imports it (an import-linter contract), and
``fuzz`` needs the ``test`` extra (hypothesis, schemathesis).
"""
