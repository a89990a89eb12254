"""``sim search`` against Calculon's brute-force search, side by side on this machine.

    python benchmarks/calculon_side_by_side.py [--calculon DIR] [--calculon-python PY]
        [--repeat 2] [--workers 1,2] [--max-batch 1536] [--no-mbs-break] [--offload]
        [--with-logging] [--only ours|calculon]

Issue 22's target: ``sim search`` on the bundled GPT-3 175B / 1,024 A100 example
(``workloads/examples/search-gpt3-175b-1024.yaml``, the default space) at >= 2x the
layouts per second of Calculon's brute force, with Calculon's debug logging off, on the
same machine. Calculon (Isaev et al., SC'23; github.com/calculon-ai/calculon) is not a
dependency: point ``--calculon`` (or ``$CALCULON_DIR``) at a checkout of it (the tree
with ``bin/calculon``, ``models/`` and ``systems/``) and ``--calculon-python`` (or
``$CALCULON_PYTHON``; default ``DIR/venv/bin/python``, else this interpreter) at an
interpreter that imports it (it needs numpy, pandas and psutil). Without one the
benchmark says so and exits 0.

What runs, each as its own process, timed from outside (wall: start to exit; CPU: user +
system of the process and every process it waited for, from ``getrusage(RUSAGE_CHILDREN)``):

- ours: ``python -m sim search workloads/examples/search-gpt3-175b-1024.yaml --workers W
  --json --no-progress`` (in-memory results database; ``--workers 1`` runs in the process,
  more fork worker processes). Layouts: the summary's ``evaluated`` (90,360).
- Calculon: its README's optimal-execution search (the brute force: every execution of
  its space is compiled and run through its analytical model), ``bin/calculon
  llm-optimal-execution models/gpt3-175B.json 512 1536 float16 SYSTEM OUT.json -m -c C``:
  GPT-3 175B on 512 A100-80GB, global batch at most 1,536 (the example's), ``-m`` (its
  README's flag: stop raising the micro-batch size once none fits), ``-c C`` worker
  processes (``multiprocessing.Pool``; C = 1 still runs one worker beside the parent).
  SYSTEM: its example ``systems/a100_80g.json`` (NVLink and InfiniBand networks) without
  its offload memory tier (``--offload`` keeps it: four more binary dimensions that
  ``sim search`` does not have, over a million layouts even with ``-m``). Layouts: its
  own ``Total executions``. Its debug logging: each search worker builds
  ``logging.Logger('sub')``, a logger outside the hierarchy with no level, so every
  ``log.debug`` of the model (about 60 per layer) builds a record that no handler
  prints (2 ms of CPU per layout without it, 15 ms with it, on this machine); the
  command line's ``-v`` sets only the root logger's level and does not reach it.
  Switched off here the one way that reaches it without editing its code:
  ``logging.disable(logging.DEBUG)`` in the process before its command line runs (a
  launcher that then runs ``bin/calculon``; the pool's workers are forked and inherit
  it). ``--with-logging`` also times it as shipped.

Runs are interleaved (ours 1, ours 2, Calculon 1, Calculon 2, then again) so that load
drifts on a shared machine hit each alike; the table gives medians over ``--repeat``
rounds and the ratios of the medians' rates. Not a timed test.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "workloads" / "examples" / "search-gpt3-175b-1024.yaml"

LAUNCHER = (
    "import logging, runpy, sys\n"
    "if sys.argv[1] == 'off':\n"
    "    logging.disable(logging.DEBUG)\n"
    "sys.argv = sys.argv[2:]\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n"
)
"""Runs ``bin/calculon`` with its arguments, first switching debug logging off (``off``)."""


def timed(cmd: list[str], cwd: Path, env: dict[str, str] | None = None
          ) -> tuple[float, float, str]:
    """Wall seconds, CPU seconds (the process and every process it waited for) and stdout
    of ``cmd``; raises if it fails."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc.stdout


def run_ours(workers: int) -> dict[str, float]:
    cmd = [sys.executable, "-m", "sim", "search", str(EXAMPLE), "--workers", str(workers),
           "--json", "--no-progress"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    wall, cpu, out = timed(cmd, ROOT, env)
    summary = json.loads(out)
    return {"wall_s": wall, "cpu_s": cpu, "layouts": summary["evaluated"],
            "own_s": summary["elapsed_s"], "best": summary["best"]["key"]}


def system_file(home: Path, offload: bool, tmp: str) -> str:
    """Calculon's example A100-80GB system (``systems/a100_80g.json``); without ``offload``,
    a copy without its second memory tier (``mem2``: 512 GiB of host memory at 32 GB/s,
    which its search may offload weights, activations and optimizer state to, four more
    binary dimensions that ``sim search`` does not have)."""
    path = home / "systems" / "a100_80g.json"
    if offload:
        return str(path)
    system = json.loads(path.read_text())
    system["mem2"]["GiB"] = 0
    out = Path(tmp) / "a100_80g_no_offload.json"
    out.write_text(json.dumps(system, indent=2))
    return str(out)


def run_calculon(home: Path, python: str, procs: int, max_batch: int, mbs_break: bool,
                 offload: bool, logging_off: bool = True) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [python, "-c", LAUNCHER, "off" if logging_off else "on",
               str(home / "bin" / "calculon"), "llm-optimal-execution",
               "models/gpt3-175B.json", "512", str(max_batch), "float16",
               system_file(home, offload, tmp), str(Path(tmp) / "out.json"), "-c", str(procs)]
        if mbs_break:
            cmd.append("-m")
        wall, cpu, out = timed(cmd, home)
        best = json.loads((Path(tmp) / "out.json").read_text())["0"]["execution"]
    total = re.search(r"Total executions: (\d+)", out)
    rate = re.search(r"Calculation rate: ([\d.]+)", out)
    if total is None or rate is None:
        raise RuntimeError(f"Calculon printed no totals:\n{out[-2000:]}")
    count = int(total.group(1))
    return {"wall_s": wall, "cpu_s": cpu, "layouts": count, "own_s": count / float(rate.group(1)),
            "best": f"tp{best['tensor_par']} pp{best['pipeline_par']} dp{best['data_par']} "
                    f"mbs{best['microbatch_size']} v{best['pipeline_interleaving']} "
                    f"{best['activation_recompute']}"}


def find_calculon(arg: str | None) -> Path | None:
    home = arg or os.environ.get("CALCULON_DIR")
    if not home:
        return None
    path = Path(home).expanduser().resolve()
    return path if (path / "bin" / "calculon").is_file() else None


def calculon_python(arg: str | None, home: Path) -> str:
    given = arg or os.environ.get("CALCULON_PYTHON")
    if given:
        return given
    venv = home / "venv" / "bin" / "python"
    return str(venv) if venv.is_file() else sys.executable


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calculon", metavar="DIR", help="Calculon checkout (default: "
                    "$CALCULON_DIR)")
    ap.add_argument("--calculon-python", metavar="PY", help="interpreter that imports "
                    "calculon (default: $CALCULON_PYTHON, DIR/venv/bin/python, this one)")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--workers", default="1,2", help="worker / process counts, both tools")
    ap.add_argument("--max-batch", type=int, default=1536,
                    help="Calculon's max_batch_size (sequences; default 1,536, the example's)")
    ap.add_argument("--no-mbs-break", action="store_true",
                    help="Calculon without -m: every micro-batch size (about 13 M layouts "
                         "at 512 GPUs and 1,536: hours)")
    ap.add_argument("--offload", action="store_true",
                    help="Calculon's example system as shipped, with its offload memory "
                         "(four more dimensions: over a million layouts with -m)")
    ap.add_argument("--with-logging", action="store_true",
                    help="also time Calculon with its debug logging as shipped")
    ap.add_argument("--only", choices=("ours", "calculon"), help="run one tool only")
    args = ap.parse_args()
    home = find_calculon(args.calculon)
    if home is None and args.only != "ours":
        print("Calculon not found: pass --calculon DIR or set CALCULON_DIR to a checkout of "
              "github.com/calculon-ai/calculon (with bin/calculon); skipped.")
        return 0
    python = calculon_python(args.calculon_python, home) if home else ""
    counts = [int(w) for w in args.workers.split(",")]
    cases: list[tuple[str, int, object]] = []
    for w in counts:
        if args.only != "calculon":
            cases.append(("sim search", w, lambda w=w: run_ours(w)))
    for w in counts:
        if args.only != "ours":
            cases.append(("Calculon, logging off", w, lambda w=w: run_calculon(
                home, python, w, args.max_batch, not args.no_mbs_break, args.offload)))
            if args.with_logging:
                cases.append(("Calculon, logging on", w, lambda w=w: run_calculon(
                    home, python, w, args.max_batch, not args.no_mbs_break, args.offload,
                    False)))
    runs: dict[tuple[str, int], list[dict[str, float]]] = {(n, w): [] for n, w, _ in cases}
    for r in range(args.repeat):
        for name, w, fn in cases:
            got = fn()  # type: ignore[operator]
            runs[name, w].append(got)
            print(f"round {r + 1}: {name}, {w} worker(s): wall {got['wall_s']:.1f} s, CPU "
                  f"{got['cpu_s']:.1f} s, {got['layouts']:,} layouts, "
                  f"{got['layouts'] / got['wall_s']:,.0f}/s (best {got['best']}; load "
                  f"{os.getloadavg()[0]:.1f})", flush=True)
    print(f"\nmedians of {args.repeat} round(s), interleaved; wall and CPU of the whole "
          "process, layouts/s = layouts / wall (own: the tool's own timer, after imports)")
    head = ("tool", "workers", "layouts", "wall s", "CPU s", "layouts/s", "own layouts/s",
            "layouts per CPU s")
    rows, rates = [], {}
    for (name, w), got in runs.items():
        wall = statistics.median(g["wall_s"] for g in got)
        cpu = statistics.median(g["cpu_s"] for g in got)
        n = statistics.median(g["layouts"] for g in got)
        rate = statistics.median(g["layouts"] / g["wall_s"] for g in got)
        own = statistics.median(g["layouts"] / g["own_s"] for g in got)
        per_cpu = statistics.median(g["layouts"] / g["cpu_s"] for g in got)
        rates[name, w] = (rate, per_cpu)
        rows.append((name, str(w), f"{n:,.0f}", f"{wall:.1f}", f"{cpu:.1f}", f"{rate:,.0f}",
                     f"{own:,.0f}", f"{per_cpu:,.0f}"))
    widths = [max(len(r[i]) for r in (head, *rows)) for i in range(len(head))]
    for r in (head, *rows):
        print("  ".join(c.rjust(wd) if i else c.ljust(wd) for i, (c, wd) in
                        enumerate(zip(r, widths, strict=True))))
    for w in counts:
        ours, theirs = rates.get(("sim search", w)), rates.get(("Calculon, logging off", w))
        if ours and theirs:
            print(f"{w} worker(s): sim search / Calculon (logging off): layouts/s "
                  f"{ours[0] / theirs[0]:.2f}x, layouts per CPU s {ours[1] / theirs[1]:.2f}x")
    for name in dict.fromkeys(n for n, _ in runs):
        ws = [w for w in counts if (name, w) in rates]
        if len(ws) > 1:
            first = rates[name, ws[0]][0]
            print(f"{name}: " + ", ".join(f"{w} / {ws[0]} workers {rates[name, w][0] / first:.2f}x"
                                          for w in ws[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
