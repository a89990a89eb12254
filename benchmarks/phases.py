"""Instructions by phase of the ``175b distinct`` layouts (:mod:`benchmarks.single_run`), under
callgrind.

``python benchmarks/phases.py`` runs ``single_run``'s in-process sequence (the example's
layout twice, the six sweep points, then :data:`single_run.DISTINCT_175B`) under
``valgrind --tool=callgrind --instr-atstart=no``, instrumentation on only while the chosen
layout runs (``--only TP,PP,MBS``, default the median one, ``4,16,2``; ``--only all``: each of
them), and prints its instructions split by phase: parsing and building the experiment,
``api.simulate`` with each wrapped function inside it, the stats' JSON. A wrapped function
(``--wrap module:attr@patched.module,...``, or ``module:Class.method@``; the defaults are the
top-level phases of :func:`sim.api.simulate`) is replaced, in its module and in each
``patched`` module that imported it by name, by a wrapper that dumps callgrind's counters as
it enters and leaves: a client request (a small C helper compiled on first use with ``cc``
against ``valgrind/callgrind.h``, loaded through ``ctypes``), synchronous, a few thousand
instructions a dump. Nested wraps are reported under their callers (inclusive counts).

The interpreter is named in full (``sys.executable`` resolved: through a pyenv shim,
callgrind would follow the shim's shell and never dump), ``PYTHONHASHSEED=0`` and the
bytecode cache on, so that two runs of one checkout give the same counts to ~0.1 %. The last
line lists the SHA-256 of each distinct layout's stats JSON (the same in every checkout that
computes the same results). Needs valgrind and a C compiler; writes only into a temporary
directory. Not a test.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import importlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HELPER = """#include <valgrind/callgrind.h>
void cg_dump(const char *tag) { CALLGRIND_DUMP_STATS_AT(tag); }
void cg_start(void) { CALLGRIND_START_INSTRUMENTATION; }
void cg_stop(void) { CALLGRIND_STOP_INSTRUMENTATION; }
void cg_zero(void) { CALLGRIND_ZERO_STATS; }
"""

PHASES = (
    "sim.budget:estimate@",
    "sim.tpoverlap:lowering_costs@sim.api",
    "workloads.lowering:lower@sim.api",
    "workloads.lowering.columnar:lower_collapsed@workloads.lowering",
    "sim.api:_facts@",
    "sim.engine:simulate_program@sim.api",
    "sim.stats:compute_stats@sim.api",
    "sim.idle:idle_breakdown@sim.api",
    "sim.idle:summarize@sim.api",
    "sim.experiment:built_schedule@",
)
"""The default wraps: :func:`sim.api.simulate`'s phases (and the schedule's build in the
experiment's)."""


def _measure(helper: str, out: str, only: str, wraps: list[str]) -> None:
    """The sequence, run under callgrind (this process)."""
    import ctypes

    sys.path.insert(0, os.getcwd())
    sys.path.insert(0, str(Path(os.getcwd()) / "benchmarks"))
    import single_run as sr
    import yaml

    from sim import api
    from sim.experiment import Experiment

    cg = ctypes.CDLL(helper)
    tags: list[str] = []
    active = [False]

    def dump(tag: str) -> None:
        if active[0]:
            tags.append(tag)
            cg.cg_dump(tag.encode())

    def wrap(spec: str) -> None:
        target, where = spec.split("@")
        mod, attr = target.split(":")
        owner = importlib.import_module(mod)
        holder = owner
        if "." in attr:
            cname, attr = attr.split(".")
            holder = getattr(owner, cname)
        f = holder.__dict__[attr] if isinstance(holder, type) else getattr(holder, attr)

        def wrapped(*a, **k):
            dump("enter " + attr)
            try:
                return f(*a, **k)
            finally:
                dump("exit " + attr)
        setattr(holder, attr, wrapped)
        for name in filter(None, where.split(",")):
            setattr(importlib.import_module(name), attr, wrapped)

    for spec in wraps:
        wrap(spec)
    data = yaml.safe_load((Path(os.getcwd()) / sr.EXAMPLE_175B).read_text(encoding="utf-8"))
    data["parallel"].update(sr.LAYOUT_175B)

    def run(d: dict) -> str:
        dump("enter experiment")
        exp = Experiment.from_dict(d)
        dump("exit experiment")
        dump("enter simulate")
        result = api.simulate(exp, fidelity="collapsed")
        dump("exit simulate")
        dump("enter stats_json")
        text = result.stats_json()
        dump("exit stats_json")
        return text

    run(data)
    run(data)
    for seq in sr.SWEEP_SEQ:
        for preset in sr.SWEEP_CLUSTERS:
            run({**data, "model": {**data["model"], "seq_length": seq},
                 "cluster": {**data["cluster"], "preset": preset}})
    hashes = []
    for tp, pp, mbs in sr.DISTINCT_175B:
        other = {**data, "parallel": {**data["parallel"], "tp": tp, "pp": pp,
                                      "dp": data["cluster"]["num_gpus"] // (tp * pp)},
                 "training": {**data["training"], "micro_batch_size": mbs}}
        on = only in ("all", f"{tp},{pp},{mbs}")
        if on:
            cg.cg_start()
            cg.cg_zero()
            active[0] = True
            dump(f"start {tp},{pp},{mbs}")
        text = run(other)
        if on:
            dump(f"end {tp},{pp},{mbs}")
            active[0] = False
            cg.cg_stop()
        hashes.append(hashlib.sha256(text.encode()).hexdigest())
    Path(out + ".json").write_text(json.dumps({"tags": tags, "hashes": hashes}),
                                   encoding="utf-8")


def _total(path: str) -> int:
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    raise ValueError(f"{path}: no totals")


def report(out: str) -> str:
    """The table of a measured run's dumps (``out``: callgrind's output file prefix)."""
    meta = json.loads(Path(out + ".json").read_text(encoding="utf-8"))
    dumps = sorted((p for p in glob.glob(out + ".*") if p.rsplit(".", 1)[1].isdigit()),
                   key=lambda p: int(p.rsplit(".", 1)[1]))
    # dump i's counts: the instructions since dump i - 1 (each dump zeroes them)
    segments = [_total(p) for p in dumps][:len(meta["tags"])]
    lines = []
    layout, stack, inside, total = None, [], {}, 0
    for tag, count in zip(meta["tags"], segments, strict=True):
        what, name = tag.split(" ", 1)
        if what == "start":
            layout, stack, inside, total = name, [], {}, 0
            continue
        total += count
        for frame in stack:
            frame[1] += count
        if what == "enter":
            stack.append([name, 0, "/".join([f[0] for f in stack] + [name])])
        elif what == "exit":
            _, spent, path = stack.pop()
            got = inside.setdefault(path, [0, 0])
            got[0] += spent
            got[1] += 1
        elif what == "end":
            lines.append(f"{layout}: {total / 1e6:.2f} M instructions")
            for path, (spent, calls) in sorted(inside.items()):
                lines.append(f"  {path:<64} {spent / 1e6:8.2f} M  x{calls}")
    lines.append("stats JSON sha256: " + " ".join(h[:8] for h in meta["hashes"]))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="4,16,2",
                        help="TP,PP,MBS of the distinct layout to measure, or 'all'")
    parser.add_argument("--wrap", nargs="*", default=list(PHASES),
                        help="module:attr@patched,modules to split out (default: the phases)")
    parser.add_argument("--measure", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        _measure(args.measure[0], args.measure[1], args.only, args.wrap)
        return
    with tempfile.TemporaryDirectory() as tmp:
        helper = str(Path(tmp) / "libcg.so")
        source = Path(tmp) / "cg.c"
        source.write_text(HELPER, encoding="utf-8")
        subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", helper, str(source)], check=True)
        out = str(Path(tmp) / "run.cg")
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        python = os.path.realpath(sys.executable)
        subprocess.run(["valgrind", "--tool=callgrind", "--instr-atstart=no",
                        f"--callgrind-out-file={out}", python, __file__, "--only", args.only,
                        "--measure", helper, out, "--wrap", *args.wrap],
                       env=env, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        print(report(out))


if __name__ == "__main__":
    main()
