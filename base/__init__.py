"""The base layer: errors and small helpers that every other package may use.

It imports nothing of the project, so ``topologies`` (the bottom of the stack:
topologies <- workloads <- sim <- plots <- sim.cli) can use it without reaching up.
"""
