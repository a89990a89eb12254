"""Adaptive global batch sizes over ``sim run --steps N`` (``training.batch_policy``).

Lau et al. 2025 ("Adaptive Batch Size Schedules for Distributed Training of Language
Models with Data and Model Parallelism", CPAL, PMLR 280) grow the batch by the norm
test of Byrd et al. 2012 (Bollapragada et al. 2018): with per-sample gradients ∇ℓ_i
over a batch B of b samples and its mean gradient g, the batch is large enough while

    Var_i(∇ℓ_i) / b <= η² ||g||²,

and when the test fails the next batch is b' = ceil(Var_i(∇ℓ_i) / (η² ||g||²)). A
simulator has no gradients, so the statistic T(step) = Var_i(∇ℓ_i) / ||g||² is an
input curve: a CSV measured on a real run, or a power law (the gradient noise grows as
the loss falls, McCandlish et al. 2018). :func:`policy_schedule` turns it into the
``[[step, global_batch_size], ...]`` that ``training.global_batch_schedule`` would give,
and :func:`sim.faults_run.simulate_run` replays it like one.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from base.errors import ConfigError

KEY = "training.batch_policy"

MAX_CURVE_ROWS = 1_000_000
"""Most rows of a statistic CSV."""
MAX_BATCH = 2.0 ** 53
"""A batch the norm test may ask for without a cap (floats are exact integers below)."""


def load_curve(spec: Any, base_dir: Path | None) -> Callable[[int], float]:
    """The statistic T(step) of ``spec`` (a :class:`~sim.config.StatisticCurve`): the CSV's
    value of the last row at or before the step, or initial·(1 + step)^exponent.
    ConfigError naming the file and row for a bad CSV."""
    if spec.csv is None:
        initial, exponent = spec.initial, spec.exponent
        return lambda step: initial * (1.0 + step) ** exponent
    rows = _read_csv(spec.csv, base_dir)
    steps = [s for s, _ in rows]
    values = [v for _, v in rows]

    def curve(step: int) -> float:
        lo, hi = 0, len(steps)
        while hi - lo > 1:  # the last row at or before step (rows start at 0)
            mid = (lo + hi) // 2
            if steps[mid] <= step:
                lo = mid
            else:
                hi = mid
        return values[lo]

    return curve


def _read_csv(name: str, base_dir: Path | None) -> list[tuple[int, float]]:
    """``step,value`` rows of a CSV with a header line: steps increasing from 0, values
    positive and finite."""
    where = f"{KEY}.statistic.csv={name!r}"
    path = Path(name)
    if base_dir is not None and not path.is_absolute() and not path.exists():
        path = base_dir / path
    try:
        with path.open(encoding="utf-8", newline="") as f:
            lines = list(csv.reader(f))
    except FileNotFoundError:
        raise ConfigError(f"{where}: file does not exist") from None
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise ConfigError(f"{where}: cannot read it: {exc}") from None
    body = [row for row in lines[1:] if row]
    if not body:
        raise ConfigError(f"{where}: needs a header line and at least one row step,value")
    if len(body) > MAX_CURVE_ROWS:
        raise ConfigError(f"{where}: more than {MAX_CURVE_ROWS:,} rows")
    rows: list[tuple[int, float]] = []
    for k, row in enumerate(body, start=2):
        try:
            step, value = int(row[0]), float(row[1])
        except (ValueError, IndexError):
            raise ConfigError(f"{where}: line {k} {','.join(row)!r} is not step,value") from None
        if not math.isfinite(value) or value <= 0:
            raise ConfigError(f"{where}: line {k}: value {value} must be positive and finite")
        if rows and step <= rows[-1][0]:
            raise ConfigError(f"{where}: line {k}: step {step} does not increase "
                              f"(previous {rows[-1][0]})")
        if not rows and step != 0:
            raise ConfigError(f"{where}: line {k}: the first row must be step 0, got {step}")
        rows.append((step, value))
    return rows


def policy_schedule(policy: Any, curve: Callable[[int], float] | None, initial_batch: int,
                    unit: int, steps: int, max_entries: int) -> list[list[int]]:
    """``[[step, global_batch_size], ...]`` over ``steps`` steps under ``policy`` (a
    :class:`~sim.config.BatchPolicyConfig`): ``constant`` keeps ``initial_batch``;
    ``norm_test`` tests at every multiple of ``test_interval`` and grows the batch to
    ceil(T(step) / η²) sequences, rounded up to a multiple of ``unit``
    (micro_batch_size·dp), never shrinking, at most ``max_global_batch_size`` (rounded
    down to a multiple of ``unit``). ConfigError if it would change more than
    ``max_entries`` times (each batch is simulated once)."""
    out = [[0, initial_batch]]
    if policy.rule == "constant":
        return out
    assert curve is not None
    cap = math.inf
    if policy.max_global_batch_size is not None:
        cap = policy.max_global_batch_size // unit * unit
        if cap < initial_batch:
            raise ConfigError(f"{KEY}.max_global_batch_size={policy.max_global_batch_size}: "
                              f"below the initial global batch {initial_batch} (in multiples "
                              f"of micro_batch_size·dp = {unit})")
    batch = initial_batch
    for step in range(0, steps, policy.test_interval):
        try:
            ratio = curve(step) / policy.eta ** 2
        except OverflowError:
            ratio = math.inf
        if not math.isfinite(ratio) or ratio > MAX_BATCH:
            if cap == math.inf:
                raise ConfigError(f"{KEY}: the norm test asks for a batch of {ratio:g} "
                                  f"sequences at step {step}; set max_global_batch_size")
            ratio = cap
        want = math.ceil(ratio - 1e-9)
        grown = min(cap, max(batch, -(-want // unit) * unit))
        if grown != batch:
            batch = int(grown)
            if step == 0:
                out[0][1] = batch
            else:
                out.append([step, batch])
            if len(out) > max_entries:
                raise ConfigError(f"{KEY}: the norm test changes the batch more than "
                                  f"{max_entries} times in {steps} steps; raise test_interval "
                                  "or set max_global_batch_size")
    return out


def steps_to_tokens(schedule: Sequence[Sequence[int]], tokens_per_sequence: int,
                    target_tokens: float, steps: int) -> int:
    """The first step count whose tokens reach ``target_tokens`` under ``schedule``;
    ConfigError if ``steps`` steps do not."""
    done = 0.0
    for k, (start, batch) in enumerate(schedule):
        end = schedule[k + 1][0] if k + 1 < len(schedule) else steps
        end = min(end, steps)
        per_step = batch * tokens_per_sequence
        if end > start and done + (end - start) * per_step >= target_tokens:
            return start + max(1, math.ceil((target_tokens - done) / per_step - 1e-9))
        done += max(0, end - start) * per_step
    raise ConfigError(f"{KEY}.target_tokens={target_tokens:g}: --steps {steps} train only "
                      f"{done:g} tokens; give more steps")
