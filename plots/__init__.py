"""HOW it is seen: the only package that imports matplotlib."""

from plots.timeline import plot_timeline

__all__ = ["plot_timeline"]
