"""WHERE it runs: cluster graphs (networkx), GPU and link specs, rank placement.

Pure: nothing in this package imports SimPy or matplotlib.
"""
