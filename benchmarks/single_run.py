"""Benchmark: one simulation, in process and end to end (issue 22, "a lean single run").

Run ``python benchmarks/single_run.py`` (about a minute), or compare checkouts side by
side with ``--trees /path/to/base,.`` (their measurements interleaved, round by round,
so both see the same load; each number the median over ``--rounds``). CPU time
throughout: the machine is shared, and wall time says more about the neighbours than
about the code. Three measurements per checkout:

- ``175b in process``: GPT-3 175B on 1,024 A100 (``workloads/examples/
  search-gpt3-175b-1024.yaml`` with TP8 PP16 DP8, so m = 192), collapsed: parsing and
  building the experiment (:meth:`sim.experiment.Experiment.from_dict`),
  :func:`sim.api.simulate` and the stats' JSON, ``time.process_time`` in one process;
  the first run, then the median of ``--repeat`` runs after it, in each round. Repeats reuse what
  depends only on their arguments (the cluster and its collective timings, the
  schedule: :func:`topologies.build.build_cluster`,
  :func:`workloads.registry.built_schedule`), as the layouts of a search or a sweep do.
  Target (issue 22): 10 ms. ``175b sweep``: the median of as many runs of the same layout
  with other costs (sequence length 1,024, 2,048 or 4,096 on DGX A100 or DGX H100, in
  turn, after a first run of each), as a sweep over one layout runs them. ``175b distinct``:
  the median of one run each of other layouts of the same model on the same cluster
  (:data:`DISTINCT_175B`: TP 4 or 8, PP 8 or 16, micro-batch size 1 or 2, so DP 8 to 32
  and 24 to 96 micro-batches), none run before in the process, as a search meets them:
  each pays what its layout needs anew (its costs and their segments, the collective
  timings of its groups and sizes, its schedule where no earlier point had its (p, m),
  the passes' plans of its structure).
- ``imports``: ``python -c "import sim.api, sim.cli.run"``, the child's CPU time.
- ``1t end to end``: ``python -m sim run FILE --json`` on Megatron 1T / 3,072 A100
  (:mod:`benchmarks.scale`'s case ``1t``, written to a temporary file), the child's
  CPU time (``resource.getrusage(RUSAGE_CHILDREN)``): start-up, imports, build,
  simulation, JSON, exit. Target (issue 22): 1 s.

Children run with the bytecode cache on (in a temporary directory: nothing is
written into the checkouts) after one warm-up run each, as a user's installed copy
would; ``PYTHONDONTWRITEBYTECODE`` would add the compilation of every module (about
0.15 s) to each run. Not a timed test: it prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_175B = Path("workloads") / "examples" / "search-gpt3-175b-1024.yaml"
LAYOUT_175B = {"tp": 8, "pp": 16, "dp": 8}
"""TP8 PP16 DP8 of 1,024 GPUs: 1,536 sequences / (micro-batch 1 x DP 8) = 192 micro-batches."""
SWEEP_SEQ = (1024, 2048, 4096)
SWEEP_CLUSTERS = ("dgx-a100-80g", "dgx-h100")
"""``175b sweep``: the 175B layout with these sequence lengths on these clusters, in turn."""
DISTINCT_175B = tuple((tp, pp, mbs) for tp in (4, 8) for pp in (8, 16) for mbs in (1, 2)
                      if (tp, pp, mbs) != (8, 16, 1))
"""``175b distinct``: (TP, PP, micro-batch size) of the 175B layouts run once each, DP the
rest of the 1,024 GPUs (the example's TP8 PP16 with micro-batch 1 left out: it ran
before)."""


def in_process(repeat: int) -> dict[str, float]:
    """The 175B row, run in this process (the checkout is the current directory)."""
    sys.path.insert(0, os.getcwd())
    import yaml

    from sim import api
    from sim.experiment import Experiment

    data = yaml.safe_load(EXAMPLE_175B.read_text(encoding="utf-8"))
    data["parallel"].update(LAYOUT_175B)

    def once() -> tuple[float, float]:
        start = time.process_time()
        result = api.simulate(Experiment.from_dict(data), fidelity="collapsed")
        result.stats_json()
        return time.process_time() - start, result.stats["step_time_s"]

    first, step_s = once()
    runs = [once()[0] for _ in range(repeat)]
    # a sweep over the same layout: sequence lengths x GPU types, one after the other
    sweep = []
    for seq in SWEEP_SEQ:
        for preset in SWEEP_CLUSTERS:
            other = {**data, "model": {**data["model"], "seq_length": seq},
                     "cluster": {**data["cluster"], "preset": preset}}
            sweep.append(Experiment.from_dict(other))
    for exp in sweep:  # their first runs (clusters, folds)
        api.simulate(exp, fidelity="collapsed").stats_json()

    def timed(exp: Experiment) -> float:
        start = time.process_time()
        api.simulate(exp, fidelity="collapsed").stats_json()
        return time.process_time() - start

    swept = [timed(sweep[k % len(sweep)]) for k in range(max(repeat, len(sweep)))]

    def distinct(tp: int, pp: int, mbs: int) -> float:
        """One run of another layout, parsing and building included (as ``once``)."""
        other = {**data, "parallel": {**data["parallel"], "tp": tp, "pp": pp,
                                      "dp": data["cluster"]["num_gpus"] // (tp * pp)},
                 "training": {**data["training"], "micro_batch_size": mbs}}
        start = time.process_time()
        api.simulate(Experiment.from_dict(other), fidelity="collapsed").stats_json()
        return time.process_time() - start

    distinct_s = [distinct(*point) for point in DISTINCT_175B]
    return {"first_s": first, "median_s": statistics.median(runs), "step_s": step_s,
            "sweep_s": statistics.median(swept), "distinct_s": statistics.median(distinct_s)}


def child_cpu_s(argv: list[str], cwd: Path, env: dict[str, str]) -> float:
    """CPU seconds (user + system) of running ``argv`` in ``cwd`` to its end."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def megatron_1t_file(folder: Path) -> Path:
    """Megatron 1T on 3,072 A100 (``benchmarks/scale.py``'s case ``1t``) as an experiment
    file in ``folder``."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import scale

    case = {c.name: c for c in scale.CASES}["1t"]
    path = folder / "megatron-1t-3072.yaml"
    path.write_text(json.dumps(case.experiment(), indent=1), encoding="utf-8")  # JSON is YAML
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", default=str(ROOT),
                        help="comma-separated checkouts to measure, interleaved")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds over the checkouts (each row: the median over rounds)")
    parser.add_argument("--repeat", type=int, default=10,
                        help="in-process runs after the first, per round (their median)")
    parser.add_argument("--in-process", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.in_process is not None:
        print(json.dumps(in_process(args.in_process)))
        return
    trees = [Path(t).resolve() for t in args.trees.split(",")]
    rows: dict[tuple[Path, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        yaml_1t = megatron_1t_file(folder)
        envs = {}
        for k, tree in enumerate(trees):
            env = {**os.environ, "PYTHONPYCACHEPREFIX": str(folder / f"pycache{k}")}
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            envs[tree] = env
        imports = [sys.executable, "-c", "import sim.api, sim.cli.run"]
        run_1t = [sys.executable, "-m", "sim", "run", str(yaml_1t), "--json"]
        for tree in trees:  # warm-up: the bytecode cache
            child_cpu_s(run_1t, tree, envs[tree])
        for _ in range(args.rounds):
            for tree in trees:
                out = subprocess.run([sys.executable, __file__, "--in-process", str(args.repeat)],
                                     cwd=tree, env=envs[tree], capture_output=True, text=True,
                                     check=True)
                found = json.loads(out.stdout.strip().splitlines()[-1])
                rows.setdefault((tree, "first"), []).append(found["first_s"])
                rows.setdefault((tree, "median"), []).append(found["median_s"])
                rows.setdefault((tree, "sweep"), []).append(found.get("sweep_s", float("nan")))
                rows.setdefault((tree, "distinct"), []).append(found.get("distinct_s",
                                                                         float("nan")))
                rows.setdefault((tree, "imports"), []).append(child_cpu_s(imports, tree,
                                                                          envs[tree]))
                rows.setdefault((tree, "1t"), []).append(child_cpu_s(run_1t, tree, envs[tree]))
    print(f"{'checkout':<28} {'175b first ms':>13} {'175b median ms':>14} "
          f"{'175b sweep ms':>13} {'175b distinct ms':>16} {'imports s':>9} {'1t e2e s':>9}  "
          "(CPU, medians over rounds; 1t: each round)")
    for tree in trees:
        med = {key: statistics.median(rows[(tree, key)])
               for key in ("first", "median", "sweep", "distinct", "imports", "1t")}
        each = ", ".join(f"{x:.2f}" for x in rows[(tree, "1t")])
        print(f"{str(tree)[-28:]:<28} {1e3 * med['first']:>13.1f} {1e3 * med['median']:>14.1f} "
              f"{1e3 * med['sweep']:>13.1f} {1e3 * med['distinct']:>16.1f} "
              f"{med['imports']:>9.2f} {med['1t']:>9.2f}  ({each})")
    print("targets (issue 22): 175b in process <= 10 ms; 1t end to end <= 1 s")


if __name__ == "__main__":
    main()
