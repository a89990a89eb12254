"""WHAT runs: model specs, layouts, pipeline schedules, lowering to per-rank programs.

Pure: nothing in this package imports SimPy or matplotlib.
"""
