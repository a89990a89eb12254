"""WHERE it runs: cluster graphs (:mod:`topologies.digraph`), GPU and link specs, rank placement.

Pure: nothing in this package imports SimPy or matplotlib.
"""
