"""A progress bar on stderr for the long commands (``sim search``, ``sim validate``)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any


def progress_bar(enabled: bool, unit: str, desc: str
                 ) -> tuple[Callable[[int, int], None] | None, Any]:
    """(callback ``update(done, total)``, bar) for a tqdm bar on stderr; (None, None) when
    disabled. Close the bar when done."""
    if not enabled:
        return None, None
    from tqdm import tqdm

    bar = tqdm(total=0, unit=unit, desc=desc, file=sys.stderr, dynamic_ncols=True,
               smoothing=0.1)

    def update(done: int, total: int) -> None:
        if bar.total != total:
            bar.total = total
            bar.refresh()
        bar.update(done - bar.n)

    return update, bar


def shows_progress(args: Any) -> bool:
    """Whether a command shows its bar: not with ``--json`` or ``--no-progress``, and only
    when stderr is a terminal."""
    return not args.json and not args.no_progress and sys.stderr.isatty()
