"""The cyclic collector's work in a 2-worker ``sim search``: collections per generation in the
parent and in each worker (from each worker's first item to its last), and their CPU.

    PYTHONPATH=$PWD python benchmarks/search_gc.py [--root EXPORT]

Runs the default-space search of ``workloads/examples/search-gpt3-175b-1024.yaml`` on two
local workers with the code of ``--root`` (default: this checkout), as the tree's own
``sim.search.search`` sets the collector up. Each worker writes its counts to a file after
every item (a pool's workers cannot report otherwise); the last one is read at the end.
"""

from __future__ import annotations

import argparse
import gc
import glob
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=str(ROOT))
    args = ap.parse_args()
    root = Path(args.root).resolve()
    sys.path.insert(0, str(root))
    os.chdir(root)
    import sim.search.execution as execution
    from sim.config import read_yaml
    from sim.executors import LocalExecutor
    from sim.search import search

    out = tempfile.mkdtemp(prefix="search-gc-")
    call = execution.SearchWorker.__call__
    first: dict[str, object] = {}

    def counted(self, item):  # type: ignore[no-untyped-def]
        if not first:
            first["n"] = [s["collections"] for s in gc.get_stats()]
            first["t"] = time.process_time()
        answer = call(self, item)
        now = [s["collections"] for s in gc.get_stats()]
        with open(f"{out}/{os.getpid()}", "w") as fh:
            json.dump({"collections": [a - b for a, b in zip(now, first["n"], strict=True)],
                       "cpu_s": round(time.process_time() - first["t"], 2),
                       "threshold": gc.get_threshold()}, fh)
        return answer

    execution.SearchWorker.__call__ = counted
    path = "workloads/examples/search-gpt3-175b-1024.yaml"
    before = [s["collections"] for s in gc.get_stats()]
    cpu = time.process_time()
    with LocalExecutor(2) as ex:
        result = search(read_yaml(path), base_dir=Path(path).parent, executor=ex)
    after = [s["collections"] for s in gc.get_stats()]
    print(f"{root}: {result.simulated} simulated, best {result.best.layout.label()}")
    spent = [a - b for a, b in zip(after, before, strict=True)]
    print(f"parent: collections by generation {spent}, "
          f"CPU {time.process_time() - cpu:.2f} s (all its threads)")
    for f in sorted(glob.glob(f"{out}/*")):
        with open(f) as fh:
            print("worker:", fh.read())


if __name__ == "__main__":
    main()
