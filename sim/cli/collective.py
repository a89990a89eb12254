"""Command line: ``sim collective CLUSTER.yaml --op OP --algo A[,B...] --sizes 1KiB:4GiB``.

Times one collective at a range of sizes on the flow-level network of the
cluster described by the file's ``cluster:`` mapping (the same keys as an
experiment file; other top-level keys are ignored), like nccl-tests'
``all_reduce_perf -b 1K -e 4G -f 2``: sizes double from the first to the last
(``--sizes 1K:4G``, or ``1K:4G:4`` for ``-f 4``), or a comma list (``64MiB,1GiB``).
It prints a table of size, time, algbw and busbw (GB/s, 1 GB = 1e9 B; busbw =
algbw × the nccl-tests factor of the op); ``--json`` prints a JSON array of
objects with keys ``op``, ``algo``, ``protocol`` (NCCL's LL, LL128 or Simple, as
:mod:`sim.protocols` picks it per size), ``num_gpus``, ``size_bytes``, ``time_s``,
``algbw_GBps``, ``busbw_GBps``; ``--plot PATH`` draws busbw against size.

The collective runs over GPUs 0..N−1 (``--gpus N``, default all), in rank
order; ``send`` goes from GPU 0 to GPU N−1; broadcast and reduce are rooted at
GPU 0. ``--algo auto`` takes the file's ``collectives:`` override for the op,
else the NCCL-like default; the ``algo`` column names the algorithm that ran.
An explicit ``--algo`` wins over the file. Times include the cluster's
per-collective launch latency. Errors: exit status 2 and one ``error:`` line.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

from base.errors import ConfigError
from base.outputs import output_file, outputs
from sim.collectives import ALGORITHMS_BY_OP, AUTO, OPS, bus_bandwidth, check

__all__ = ["parse_size", "parse_sizes", "register", "run_sweep"]

_UNITS = {"": 1, "b": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
          "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
"""Size suffixes: K/M/G/T and KiB/MiB/GiB/TiB are binary (nccl-tests' -b/-e), KB/MB/GB decimal."""
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
MAX_SIZES = 64


def parse_size(text: str) -> int:
    """Bytes of ``text`` such as ``4096``, ``1KiB``, ``64M``, ``1.5GB``."""
    m = _SIZE.match(text)
    unit = m.group(2).lower() if m else ""
    if m is None or unit not in _UNITS:
        raise ConfigError(f"--sizes: cannot read size {text!r}; use a byte count with an "
                          "optional unit: K, M, G, KiB, MiB, GiB (binary) or KB, MB, GB")
    value = round(float(m.group(1)) * _UNITS[unit])
    if value < 1:
        raise ConfigError(f"--sizes: size {text!r} must be at least 1 byte")
    return value


def parse_sizes(text: str) -> list[int]:
    """``A:B`` doubles from A up to B; ``A:B:F`` multiplies by F; ``A`` is one size;
    ``A,B,...`` lists sizes (each a size or a range), run in the order given."""
    if "," in text:
        items = [t for t in text.split(",") if t.strip()]
        if not items:
            raise ConfigError(f"--sizes={text!r}: give at least one size, e.g. 64MiB,1GiB")
        sizes = [s for item in items for s in parse_sizes(item)]
        if len(sizes) > MAX_SIZES:
            raise ConfigError(f"--sizes={text!r}: more than {MAX_SIZES} sizes")
        return sizes
    parts = text.split(":")
    if len(parts) > 3:
        raise ConfigError(f"--sizes={text!r}: use START:END or START:END:FACTOR, e.g. 1KiB:4GiB")
    start = parse_size(parts[0])
    end = parse_size(parts[1]) if len(parts) > 1 else start
    try:
        factor = float(parts[2]) if len(parts) > 2 else 2.0
    except ValueError:
        factor = 0.0
    if end < start:
        raise ConfigError(f"--sizes={text!r}: the end {end} B is below the start {start} B")
    if not factor > 1:
        raise ConfigError(f"--sizes={text!r}: the factor must be a number > 1")
    sizes, s = [], float(start)
    while round(s) <= end:
        sizes.append(round(s))
        s *= factor
        if len(sizes) > MAX_SIZES:
            raise ConfigError(f"--sizes={text!r}: more than {MAX_SIZES} sizes")
    return sizes


def register(subparsers: Any) -> None:
    """Add the ``collective`` command to ``sim``'s sub-command parsers."""
    cmd = subparsers.add_parser(
        "collective", help="time a collective across a range of sizes (nccl-tests style)")
    cmd.add_argument("file", help="YAML file with a 'cluster:' mapping")
    cmd.add_argument("--op", default="all_reduce", choices=OPS, help="collective operation")
    cmd.add_argument("--algo", default=AUTO, metavar="A[,B...]",
                     help="algorithm(s), comma-separated, or 'auto' (default): " +
                          "; ".join(f"{op}: {', '.join(a)}" for op, a in ALGORITHMS_BY_OP.items()))
    cmd.add_argument("--sizes", default="1KiB:4GiB", metavar="START:END|A,B,...",
                     help="sizes, doubling from START to END (START:END:F multiplies by F), "
                          "or a comma list such as 64MiB,1GiB (default 1KiB:4GiB)")
    cmd.add_argument("--gpus", type=int, metavar="N", help="run over GPUs 0..N-1 (default: all)")
    cmd.add_argument("--json", action="store_true", help="print a JSON array of rows")
    cmd.add_argument("--plot", metavar="PATH", help="save busbw against size (PNG or SVG)")
    cmd.set_defaults(func=_cmd_collective)


def _algorithms(op: str, text: str) -> list[str]:
    algos = [a.strip() for a in text.split(",") if a.strip()]
    if not algos:
        raise ConfigError(f"--algo={text!r}: give at least one algorithm")
    for algo in algos:
        if algo != AUTO:
            try:
                check(op, algo)
            except ConfigError as exc:
                raise ConfigError(f"--algo={algo!r}: {exc}") from None
    return algos


def _cluster_mapping(path: str, op: str, algos: list[str]) -> dict:
    from sim.config import read_yaml

    data = read_yaml(path)
    if not isinstance(data, dict) or not isinstance(data.get("cluster"), dict):
        raise ConfigError(f"file {path!r}: needs a 'cluster:' mapping (as in an experiment file)")
    cluster = dict(data["cluster"])
    if algos != [AUTO] and isinstance(cluster.get("collectives"), dict):
        cluster["collectives"] = {k: v for k, v in cluster["collectives"].items() if k != op}
    return cluster


def run_sweep(cluster_data: dict, op: str, algos: list[str], sizes: list[int],
              gpus: int | None = None) -> list[dict]:
    """Simulate ``op`` for each algorithm and size; rows as ``--json`` prints them plus
    ``series`` (the requested algorithm, e.g. ``auto``) and ``link_GBps`` (the smallest
    bottleneck bandwidth between ring neighbours of the group)."""
    from sim.config import parse_config
    from sim.engine import simulate_program
    from sim.selection import collective_plan, group_profile, resolve_algorithm
    from topologies.build import build_cluster
    from workloads.program import Program, ProgramBuilder
    from workloads.schedules import gpipe

    cfg = parse_config({"model": {"synthetic": {"forward_ms": 0.0, "backward_ms": 0.0}},
                        "cluster": cluster_data})
    cluster = build_cluster(cfg.cluster)
    n = cluster.num_gpus if gpus is None else gpus
    if not 2 <= n <= cluster.num_gpus:
        raise ConfigError(f"--gpus={n}: must be between 2 and the cluster's "
                          f"num_gpus={cluster.num_gpus}")
    group = (0, n - 1) if op == "send" else tuple(range(n))
    profile = group_profile(cluster, group)
    link_GBps = profile.bandwidth_Bps / 1e9
    rows = []
    for series in algos:
        for size in sizes:
            requested = cluster.collective_algos.get(op, series)
            algo = resolve_algorithm(op, requested, size, profile)
            protocol = collective_plan(cluster, op, algo, group, float(size),
                                       {group: profile}).protocol
            b = ProgramBuilder()
            b.collective(group, {}, kind="dp", name=op, op=op, nbytes=float(size), algo=algo)
            prog = Program(cluster.num_gpus, b.build(), (0.0,) * cluster.num_gpus, gpipe(1, 1))
            t = simulate_program(prog, cluster, lambda _op: 0.0).end_s
            algbw, busbw = bus_bandwidth(op, n, size, t)
            rows.append({"op": op, "algo": algo, "protocol": protocol, "num_gpus": n,
                         "size_bytes": size,
                         "time_s": t, "algbw_GBps": algbw / 1e9, "busbw_GBps": busbw / 1e9,
                         "series": series, "link_GBps": link_GBps})
    return rows


def table(rows: list[dict], title: str) -> str:
    """nccl-tests-like text table."""
    lines = [f"# {title}",
             f"# {'size(B)':>13}  {'algo':<16} {'proto':<6} {'time(us)':>12} "
             f"{'algbw(GB/s)':>12} {'busbw(GB/s)':>12}"]
    for r in rows:
        algo = r["algo"] if r["series"] == r["algo"] else f"{r['series']}:{r['algo']}"
        lines.append(f"  {r['size_bytes']:>13}  {algo:<16} {r['protocol']:<6} "
                     f"{r['time_s'] * 1e6:>12.2f} "
                     f"{r['algbw_GBps']:>12.2f} {r['busbw_GBps']:>12.2f}")
    return "\n".join(lines)


def _cmd_collective(args: argparse.Namespace) -> int:
    algos = _algorithms(args.op, args.algo)
    sizes = parse_sizes(args.sizes)
    plot = output_file(args.plot, "--plot", (".png", ".svg")) if args.plot else None
    data = _cluster_mapping(args.file, args.op, algos)
    rows = run_sweep(data, args.op, algos, sizes, args.gpus)
    n = rows[0]["num_gpus"]
    name = data.get("preset") or data.get("topology")
    title = f"{args.op} over {n} GPUs of {name} ({data.get('num_gpus')} GPUs in the cluster)"
    if plot is not None:
        from plots.collectives import plot_busbw  # matplotlib only when plotting

        with outputs() as files:
            plot_busbw(rows, files.temp(plot), title=f"{args.op}, {n} GPUs, {name}",
                       reference_GBps=rows[0]["link_GBps"],
                       reference_label="slowest link of one ring")
            files.commit()
    if args.json:
        keys = ("op", "algo", "protocol", "num_gpus", "size_bytes", "time_s", "algbw_GBps",
                "busbw_GBps")
        sys.stdout.write(json.dumps([{k: r[k] for k in keys} for r in rows], indent=1) + "\n")
    else:
        print(table(rows, title))
        if args.plot:
            print(f"wrote {args.plot}")
    return 0
