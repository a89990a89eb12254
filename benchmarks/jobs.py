"""Cost of simulating several jobs together against simulating them one by one.

    python benchmarks/jobs.py [--repeat 3]

For the bundled two-job example (contention on a 4:1 fat-tree) and two disjoint copies of
its first job, it prints the wall time of one run of both jobs together, of each job alone
on the same cluster, their ratio (issue 23 asks for at most 1.2) and the engine's events.
Not a timed test (``tests/test_jobs.py`` bounds it loosely); it prints a table.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sim.config import read_yaml  # noqa: E402
from sim.jobs import JobSet, build_jobs, simulate_jobs  # noqa: E402

EXAMPLE = ROOT / "workloads" / "examples" / "two-jobs-shared-fabric.yaml"


def _best_s(run, repeat: int) -> float:
    """Best wall time of ``repeat`` runs after one untimed run (routes are cached on the
    cluster: the first run on it pays for them, whichever it is)."""
    run()
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def _cases() -> dict[str, JobSet]:
    data = read_yaml(EXAMPLE)
    twins = {**data, "jobs": [{**data["jobs"][0], "name": "a"},
                              {**data["jobs"][0], "name": "b", "gpus": data["jobs"][1]["gpus"]}]}
    return {"two-jobs-shared-fabric": build_jobs(data), "two copies of gpt-1.3b": build_jobs(twins)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per timing (best kept)")
    args = parser.parse_args()
    print(f"{'case':<26} {'together s':>11} {'apart s':>9} {'ratio':>6} {'events':>8} "
          f"{'apart events':>13}")
    for name, jobs in _cases().items():
        names = [job.name for job in jobs.jobs]
        together = _best_s(lambda: simulate_jobs(jobs), args.repeat)  # noqa: B023
        apart = _best_s(lambda: [simulate_jobs(jobs.only(n)) for n in names],  # noqa: B023
                        args.repeat)
        events = simulate_jobs(jobs).counters.events
        apart_events = sum(simulate_jobs(jobs.only(n)).counters.events for n in names)
        print(f"{name:<26} {together:>11.3f} {apart:>9.3f} {together / apart:>6.2f} "
              f"{events:>8} {apart_events:>13}")


if __name__ == "__main__":
    main()
