"""Harnesses through the adapter contract (``docs/adapters.md``): ``lnk-<harness>`` on PATH.

:mod:`contract` parses each answer once into a frozen dataclass, :mod:`adapter` asks the
program with bounded time and size, :mod:`setup` runs a start's commands in order, and
:mod:`builtin` is Link's own harness answering the same questions in-process.
"""
