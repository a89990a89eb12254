"""Tests of sim.export: Chrome/Perfetto trace export and the structural checker."""

from __future__ import annotations

import copy
import gzip
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import EXAMPLE
from hypothesis import given, settings
from hypothesis import strategies as st

from sim import load_experiment, simulate
from sim.cli import main
from sim.export import (
    check_trace,
    chrome_trace,
    dumps_trace,
    flow_bindings,
    load_trace,
    write_chrome_trace,
)
from sim.timeline import FlowArrow, MemorySample, Span, Timeline, stream_sort_key

MS = 1e-3


def small_timeline() -> Timeline:
    """Two pipeline stages, one micro-batch: F, send/recv, TP, B back, memory."""
    spans = (
        Span(0, "compute", "F", "0F0", 0.0, 1 * MS, 0, 0),  # 0
        Span(0, "tp", "tp", "allreduce", 0.4 * MS, 0.5 * MS, 0, 0),  # 1
        Span(0, "send>1", "pp", "0F0", 1 * MS, 1.2 * MS, 0, 0),  # 2
        Span(1, "recv<0", "pp", "0F0", 1 * MS, 1.2 * MS, 1, 0),  # 3
        Span(1, "compute", "F", "1F0", 1.2 * MS, 2.2 * MS, 1, 0),  # 4
        Span(1, "tp", "tp", "allreduce", 1.6 * MS, 1.7 * MS, 1, 0),  # 5
        Span(1, "compute", "B", "1B0", 2.2 * MS, 4.2 * MS, 1, 0),  # 6
        Span(1, "send>0", "pp", "1B0", 4.2 * MS, 4.3 * MS, 1, 0),  # 7
        Span(0, "recv<1", "pp", "1B0", 4.2 * MS, 4.3 * MS, 0, 0),  # 8
        Span(0, "compute", "B", "0B0", 4.3 * MS, 6.3 * MS, 0, 0),  # 9
        Span(0, "dp", "dp", "allreduce", 6.3 * MS, 7.0 * MS),  # 10
        Span(1, "dp", "dp", "allreduce", 4.2 * MS, 7.0 * MS),  # 11
        Span(0, "compute", "opt", "opt", 7.0 * MS, 7.5 * MS),  # 12
        Span(1, "compute", "opt", "opt", 7.0 * MS, 7.5 * MS),  # 13
    )
    flows = (FlowArrow(2, 3), FlowArrow(7, 8))
    memory = (
        MemorySample(0, 0.0, 2 * 2**30),
        MemorySample(0, 1 * MS, 3 * 2**30),
        MemorySample(0, 6.3 * MS, 2.5 * 2**30),
        MemorySample(1, 0.0, 2 * 2**30),
        MemorySample(1, 2.2 * MS, 3.25 * 2**30),
    )
    return Timeline(2, spans, flows, memory, ("node0/gpu0 pp0", "node0/gpu1 pp1"))


def events_of(trace: dict[str, Any], ph: str) -> list[dict[str, Any]]:
    return [e for e in trace["traceEvents"] if e["ph"] == ph]


def first_index(trace: dict[str, Any], predicate: Any) -> int:
    return next(n for n, e in enumerate(trace["traceEvents"]) if predicate(e))


# --- the exporter -------------------------------------------------------------------


def test_small_trace_is_valid() -> None:
    trace = chrome_trace(small_timeline(), title="small")
    assert check_trace(trace) == []
    assert trace["displayTimeUnit"] == "ms"
    assert trace["otherData"]["title"] == "small"
    json.loads(dumps_trace(trace))  # serialisable, strict JSON


def test_processes_threads_and_order() -> None:
    tl = small_timeline()
    trace = chrome_trace(tl)
    names = {
        e["pid"]: e["args"]["name"] for e in events_of(trace, "M") if e["name"] == "process_name"
    }
    assert names == {1: "node0/gpu0 pp0", 2: "node0/gpu1 pp1"}  # pid = gpu + 1, never 0
    threads = [
        (e["pid"], e["tid"], e["args"]["name"])
        for e in events_of(trace, "M")
        if e["name"] == "thread_name"
    ]
    assert [t[2] for t in threads if t[0] == 1] == ["compute", "tp", "dp", "recv<1", "send>1"]
    assert [t[2] for t in threads if t[0] == 2] == ["compute", "tp", "dp", "recv<0", "send>0"]
    tids = [t[1] for t in threads]
    assert len(set(tids)) == len(tids) and not set(tids) & {1, 2}
    sort_index = {
        (e["pid"], e["tid"]): e["args"]["sort_index"]
        for e in events_of(trace, "M")
        if e["name"] == "thread_sort_index"
    }
    assert [sort_index[(t[0], t[1])] for t in threads if t[0] == 1] == [0, 1, 2, 3, 4]


def test_complete_events_carry_span_fields() -> None:
    tl = small_timeline()
    trace = chrome_trace(tl)
    complete = events_of(trace, "X")
    assert len(complete) == len(tl.spans)
    b = next(e for e in complete if e["name"] == "1B0" and e["cat"] == "B")
    assert b["ts"] == 2200.0 and b["dur"] == 2000.0 and b["pid"] == 2
    assert b["args"] == {"stage": 1, "mb": 0, "kind": "B", "stream": "compute"}
    assert {e["cat"] for e in complete} == {"F", "B", "opt", "tp", "pp", "dp"}
    times = [e["ts"] for e in trace["traceEvents"] if e["ph"] in "Xsf"]
    assert times == sorted(times)


def test_times_are_rounded_to_nanoseconds() -> None:
    span = Span(0, "compute", "F", "0F0", 1.234567891e-3, 2.0000004e-3, 0, 0)
    trace = chrome_trace(Timeline(1, (span,), (), ()))
    (event,) = events_of(trace, "X")
    assert event["ts"] == 1234.568
    assert event["dur"] == 765.432


def test_flows_bind_to_their_send_and_recv_spans() -> None:
    tl = small_timeline()
    trace = chrome_trace(tl)
    starts, ends = events_of(trace, "s"), events_of(trace, "f")
    assert len(starts) == len(ends) == len(tl.flows)
    assert all(e["bp"] == "e" for e in ends)
    events = trace["traceEvents"]
    for flow_id, (s_at, f_at) in flow_bindings(trace).items():
        flow = tl.flows[flow_id - 1]
        send, recv = tl.spans[flow.send], tl.spans[flow.recv]
        assert s_at is not None and f_at is not None
        assert events[s_at]["args"]["stream"] == send.stream
        assert events[f_at]["args"]["stream"] == recv.stream
        assert events[s_at]["ts"] == pytest.approx(send.start_s * 1e6)
        assert events[f_at]["ts"] == pytest.approx(recv.start_s * 1e6)


def test_memory_counters() -> None:
    trace = chrome_trace(small_timeline())
    counters = events_of(trace, "C")
    assert [(c["pid"], c["ts"], c["args"]["GiB"]) for c in counters] == [
        (1, 0.0, 2.0),
        (1, 1000.0, 3.0),
        (1, 6300.0, 2.5),
        (2, 0.0, 2.0),
        (2, 2200.0, 3.25),
    ]
    assert all(c["name"] == "memory" for c in counters)


def test_write_is_byte_identical(tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "sub" / "b.json"
    write_chrome_trace(small_timeline(), a, title="t")
    write_chrome_trace(small_timeline(), b, title="t")
    assert a.read_bytes() == b.read_bytes()
    assert json.loads(a.read_text()) == chrome_trace(small_timeline(), title="t")


def test_gzip_trace_is_deterministic_and_checkable(tmp_path: Path) -> None:
    """``.gz``: the same bytes every time (mtime 0, no file name in the header), the
    plain trace inside, and check_trace reads either file."""
    plain, a, b = tmp_path / "t.json", tmp_path / "a.json.gz", tmp_path / "sub" / "b.json.gz"
    for path in (plain, a, b):
        write_chrome_trace(small_timeline(), path, title="t")
    packed = a.read_bytes()
    assert packed[:2] == b"\x1f\x8b" and packed[4:8] == b"\0\0\0\0"  # gzip, mtime 0
    assert packed == b.read_bytes()
    assert gzip.decompress(packed) == plain.read_bytes()
    assert load_trace(a) == load_trace(plain) == chrome_trace(small_timeline(), title="t")
    assert check_trace(a) == check_trace(str(plain)) == []


def test_subset_of_gpus() -> None:
    """Only the GPUs asked for: their spans, memory and the flows between them; the
    full trace is unchanged by the option's existence."""
    tl = small_timeline()
    one = chrome_trace(tl, "t", gpus=[1])
    assert check_trace(one) == []
    assert {e["pid"] for e in one["traceEvents"]} == {2}
    assert not events_of(one, "s") and not events_of(one, "f")  # the flows' ends were on 0
    assert len(events_of(one, "X")) == sum(s.gpu == 1 for s in tl.spans)
    assert len(events_of(one, "C")) == 2
    assert one["otherData"]["gpus"] == [1] and one["otherData"]["num_spans"] == 7
    both = chrome_trace(tl, "t", gpus=[1, 0, 1])
    assert both["otherData"].pop("gpus") == [0, 1]
    assert both == chrome_trace(tl, "t") and "gpus" not in chrome_trace(tl)["otherData"]
    with pytest.raises(ValueError, match="cannot export GPUs"):
        chrome_trace(tl, gpus=[2])


def test_collectives_are_chains_of_arrows() -> None:
    """Each multi-GPU collective of a full-fidelity run: one span per member GPU, all with
    its name, kind and start; the trace links them member to member (category
    ``collective``), and a subset of GPUs keeps the links among the GPUs kept."""
    result = simulate(load_experiment(EXAMPLE), fidelity="full")
    tl = result.timeline
    assert tl.collectives
    for group in tl.collectives:
        spans = [tl.spans[i] for i in group]
        assert len({s.gpu for s in spans}) == len(spans) > 1
        assert len({(s.kind, s.name, s.stream, s.start_s) for s in spans}) == 1
    trace = chrome_trace(tl)
    assert check_trace(trace) == []
    links = sum(len(g) - 1 for g in tl.collectives)
    assert sum(e["cat"] == "collective" for e in events_of(trace, "s")) == links
    assert sum(e["cat"] == "p2p" for e in events_of(trace, "s")) == len(tl.flows)
    assert trace["otherData"]["num_collectives"] == len(tl.collectives)
    first = [tl.spans[i].gpu for i in tl.collectives[0]]
    kept = chrome_trace(tl, gpus=first[:2])
    assert check_trace(kept) == []
    assert kept["otherData"]["num_collectives"] >= 1
    assert all(e["pid"] - 1 in first[:2] for e in events_of(kept, "s"))


def test_cli_trace_options(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """``sim run --trace gz --trace-gpus pipeline``: a valid gzip trace of one pipeline,
    replacing the plain one of an earlier run; bad GPU lists are one error line."""
    out = tmp_path / "out"
    assert main(["run", str(EXAMPLE), "--out", str(out), "--no-plot", "--json"]) == 0
    assert main(["run", str(EXAMPLE), "--out", str(out), "--no-plot", "--json",
                 "--trace", "gz", "--trace-gpus", "pipeline"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["stats.json", "trace.json.gz"]
    trace = load_trace(out / "trace.json.gz")
    assert check_trace(trace) == []
    stats = json.loads((out / "stats.json").read_text())
    assert len(trace["otherData"]["gpus"]) == stats["layout"]["pp"]
    assert main(["run", str(EXAMPLE), "--out", str(out), "--no-plot", "--json",
                 "--trace", "none"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["stats.json"]
    capsys.readouterr()
    assert main(["run", str(EXAMPLE), "--out", str(out), "--trace-gpus", "0,99999"]) == 2
    assert "--trace-gpus: GPU 99999" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["run", str(EXAMPLE), "--trace-gpus", "3-1"])


def test_overlapping_spans_on_one_stream_get_extra_lanes() -> None:
    spans = (
        Span(0, "dp", "dp", "bucket0", 0.0, 2 * MS),
        Span(0, "dp", "dp", "bucket1", 1 * MS, 3 * MS),
        Span(0, "dp", "dp", "inner", 0.5 * MS, 1.5 * MS),
    )
    trace = chrome_trace(Timeline(1, spans, (), ()))
    assert check_trace(trace) == []
    names = [e["args"]["name"] for e in events_of(trace, "M") if e["name"] == "thread_name"]
    assert names == ["dp", "dp #2"]


def test_zero_duration_transfers_bind_to_their_own_spans() -> None:
    """Ideal network: back-to-back zero-length sends and recvs at one instant."""
    t = 2 * MS
    spans = (
        Span(0, "send>1", "pp", "0F0", t, t, 0, 0),  # 0
        Span(0, "send>1", "pp", "0F1", t, t, 0, 1),  # 1
        Span(1, "recv<0", "pp", "0F0", 1 * MS, t, 1, 0),  # 2: waited, ends as 0F1 begins
        Span(1, "recv<0", "pp", "0F1", t, t, 1, 1),  # 3
    )
    tl = Timeline(2, spans, (FlowArrow(0, 2), FlowArrow(1, 3)), ())
    trace = chrome_trace(tl)
    assert check_trace(trace) == []
    events = trace["traceEvents"]
    for flow_id, (s_at, f_at) in flow_bindings(trace).items():
        flow = tl.flows[flow_id - 1]
        assert s_at is not None and f_at is not None
        assert events[s_at]["name"] == tl.spans[flow.send].name
        assert events[f_at]["name"] == tl.spans[flow.recv].name


def test_recv_posted_before_send_ends_flow_after_start() -> None:
    spans = (
        Span(0, "send>1", "pp", "0F0", 3 * MS, 4 * MS, 0, 0),
        Span(1, "recv<0", "pp", "0F0", 1 * MS, 4 * MS, 1, 0),
    )
    trace = chrome_trace(Timeline(2, spans, (FlowArrow(0, 1),), ()))
    (start,), (end,) = events_of(trace, "s"), events_of(trace, "f")
    assert start["ts"] == end["ts"] == 3000.0
    assert trace["traceEvents"].index(start) < trace["traceEvents"].index(end)
    assert check_trace(trace) == []


def test_invalid_timelines_are_refused() -> None:
    backwards = Span(0, "compute", "F", "0F0", 2 * MS, 1 * MS, 0, 0)
    with pytest.raises(ValueError, match="before it starts"):
        chrome_trace(Timeline(1, (backwards,), (), ()))
    ok = Span(0, "compute", "F", "0F0", 0.0, 1 * MS, 0, 0)
    with pytest.raises(ValueError, match="flow #0"):
        chrome_trace(Timeline(1, (ok,), (FlowArrow(0, 5),), ()))
    with pytest.raises(ValueError, match="not finite"):
        chrome_trace(Timeline(1, (Span(0, "compute", "F", "x", 0.0, float("nan")),), (), ()))


def test_empty_timeline() -> None:
    trace = chrome_trace(Timeline(0, (), (), ()))
    assert trace["traceEvents"] == []
    assert check_trace(trace) == []


def test_stream_sort_key() -> None:
    streams = ["send>10", "recv<2", "dp", "compute", "zzz", "tp", "send>2", "ep", "cp"]
    assert sorted(streams, key=stream_sort_key) == [
        "compute", "tp", "cp", "ep", "dp", "zzz", "recv<2", "send>2", "send>10",
    ]  # fmt: skip


def test_export_is_pure() -> None:
    code = (
        "import sys, sim.export; "
        "bad = {'matplotlib', 'simpy'} & set(sys.modules); "
        "sys.exit(1 if bad else 0)"
    )
    root = Path(__file__).resolve().parents[1]
    assert subprocess.run([sys.executable, "-c", code], cwd=root).returncode == 0


# --- the checker --------------------------------------------------------------------


@pytest.fixture
def trace() -> dict[str, Any]:
    return chrome_trace(small_timeline())


def test_checker_catches_negative_duration(trace: dict[str, Any]) -> None:
    trace["traceEvents"][first_index(trace, lambda e: e["ph"] == "X")]["dur"] = -1.0
    assert any("negative dur" in p for p in check_trace(trace))


@pytest.mark.parametrize("field", ["name", "ph", "ts", "dur", "pid", "tid"])
def test_checker_catches_missing_field(trace: dict[str, Any], field: str) -> None:
    del trace["traceEvents"][first_index(trace, lambda e: e["ph"] == "X")][field]
    problems = check_trace(trace)
    assert problems, field
    assert any(field in p or "unknown phase" in p for p in problems)


@pytest.mark.parametrize("phase", ["s", "f"])
def test_checker_catches_unmatched_flow(trace: dict[str, Any], phase: str) -> None:
    del trace["traceEvents"][first_index(trace, lambda e: e["ph"] == phase)]
    assert any("expected exactly one of each" in p for p in check_trace(trace))


def test_checker_catches_duplicate_flow_start(trace: dict[str, Any]) -> None:
    n = first_index(trace, lambda e: e["ph"] == "s")
    trace["traceEvents"].insert(n, copy.deepcopy(trace["traceEvents"][n]))
    assert any("2 start(s)" in p for p in check_trace(trace))


def test_checker_catches_mismatched_flow_names(trace: dict[str, Any]) -> None:
    trace["traceEvents"][first_index(trace, lambda e: e["ph"] == "f")]["name"] = "other"
    assert any("will not pair" in p for p in check_trace(trace))


def test_checker_catches_unbound_flow(trace: dict[str, Any]) -> None:
    trace["traceEvents"][first_index(trace, lambda e: e["ph"] == "s")]["ts"] = 9e9
    assert any("binds to no slice" in p for p in check_trace(trace))


def test_checker_catches_flow_end_before_start(trace: dict[str, Any]) -> None:
    """An end read before its start is dropped by Perfetto."""
    events = trace["traceEvents"]
    start = events[first_index(trace, lambda e: e["ph"] == "s")]
    recv_x = next(e for e in events if e["ph"] == "X" and e["args"]["stream"] == "recv<0")
    recv_x["ts"] -= 100.0
    recv_x["dur"] += 100.0
    end = next(e for e in events if e["ph"] == "f" and e["id"] == start["id"])
    end["ts"] = recv_x["ts"]
    assert any("read before its start" in p for p in check_trace(trace))


def test_checker_catches_partial_overlap(trace: dict[str, Any]) -> None:
    events = trace["traceEvents"]
    x = copy.deepcopy(events[first_index(trace, lambda e: e["name"] == "0F0" and e["ph"] == "X")])
    x["ts"], x["dur"] = 500.0, 1000.0  # [500, 1500] crosses 0F0 [0, 1000]
    events.append(x)
    assert any("overlap without nesting" in p for p in check_trace(trace))


def test_checker_accepts_nesting_and_touching(trace: dict[str, Any]) -> None:
    events = trace["traceEvents"]
    parent = events[first_index(trace, lambda e: e["name"] == "0F0" and e["ph"] == "X")]
    for ts, dur in ((0.0, 1000.0), (0.0, 500.0), (500.0, 500.0 + 1e-7), (1000.0, 0.0)):
        child = copy.deepcopy(parent)
        child["ts"], child["dur"] = ts, dur
        events.append(child)
    assert check_trace(trace) == []


def test_checker_catches_bad_metadata(trace: dict[str, Any]) -> None:
    events = trace["traceEvents"]
    events[first_index(trace, lambda e: e.get("name") == "thread_name")]["args"] = {}
    events[first_index(trace, lambda e: e.get("name") == "process_sort_index")]["args"] = {
        "sort_index": "first"
    }
    events.append({"name": "thread_name", "ph": "M", "pid": 1, "args": {"name": "x"}})
    events.append({"name": "frobnicate", "ph": "M", "pid": 1, "args": {}})
    problems = check_trace(trace)
    assert any("needs args.name" in p for p in problems)
    assert any("integer sort_index" in p for p in problems)
    assert any("lacks field(s) tid" in p for p in problems)
    assert any("metadata name must be one of" in p for p in problems)


def test_checker_catches_bad_counter_and_phase(trace: dict[str, Any]) -> None:
    trace["traceEvents"][first_index(trace, lambda e: e["ph"] == "C")]["args"] = {"GiB": "lots"}
    trace["traceEvents"].append({"name": "x", "ph": "Q", "ts": 0, "pid": 1, "tid": 1})
    problems = check_trace(trace)
    assert any("non-numeric counter" in p for p in problems)
    assert any("unknown phase" in p for p in problems)


def test_checker_on_garbage() -> None:
    assert check_trace({}) == ["trace has no 'traceEvents' list"]
    assert check_trace({"traceEvents": [1]}) == ["event #0 is not a JSON object"]


# --- property: any well-formed timeline exports to a valid, correctly bound trace -----


@st.composite
def timelines(draw: st.DrawFn) -> Timeline:
    """Random spans on a few streams (overlaps allowed) and sends matched to receives."""
    num_gpus = draw(st.integers(1, 3))
    grid = st.integers(0, 12).map(lambda k: k * 0.25 * MS)  # coarse grid: many ties
    spans: list[Span] = []
    for _ in range(draw(st.integers(0, 12))):
        gpu = draw(st.integers(0, num_gpus - 1))
        stream = draw(st.sampled_from(["compute", "tp", "dp", "send>0", "recv<0"]))
        kind = {"compute": "F", "send>0": "pp", "recv<0": "pp"}.get(stream, stream)
        start, length = draw(grid), draw(grid)
        spans.append(Span(gpu, stream, kind, "op", start, start + length))
    flows: list[FlowArrow] = []
    for n in range(draw(st.integers(0, 6))):
        src = draw(st.integers(0, num_gpus - 1))
        dst = draw(st.integers(0, num_gpus - 1))
        s0, s_len, r0 = draw(grid), draw(grid), draw(grid)
        r1 = max(r0, s0) + draw(grid)  # a message never arrives before it is sent
        spans.append(Span(src, f"send>{dst}", "pp", f"m{n}", s0, s0 + s_len))
        spans.append(Span(dst, f"recv<{src}", "pp", f"m{n}", r0, r1))
        flows.append(FlowArrow(len(spans) - 2, len(spans) - 1))
    collectives: list[tuple[int, ...]] = []
    for n in range(draw(st.integers(0, 3)) if num_gpus > 1 else 0):
        members = draw(st.permutations(range(num_gpus)))[:draw(st.integers(2, num_gpus))]
        stream, start = draw(st.sampled_from(["tp", "dp"])), draw(grid)
        group = []
        for gpu in members:  # one start, each member its own end
            spans.append(Span(gpu, stream, stream, f"c{n}", start, start + draw(grid)))
            group.append(len(spans) - 1)
        collectives.append(tuple(group))
    return Timeline(num_gpus, tuple(spans), tuple(flows), (), collectives=tuple(collectives))


def arrows_of(tl: Timeline) -> list[FlowArrow]:
    """The arrows a trace draws, in id order: messages, then each collective's chain."""
    chains = [FlowArrow(a, b) for g in tl.collectives for a, b in zip(g, g[1:], strict=False)]
    return [*tl.flows, *chains]


@settings(max_examples=150, deadline=None)
@given(timelines())
def test_property_export_is_valid_and_flows_bind_right(tl: Timeline) -> None:
    trace = chrome_trace(tl)
    assert check_trace(trace) == []
    events = trace["traceEvents"]
    arrows = arrows_of(tl)
    assert len(flow_bindings(trace)) == len(arrows)
    for flow_id, (s_at, f_at) in flow_bindings(trace).items():
        flow = arrows[flow_id - 1]
        for at, index in ((s_at, flow.send), (f_at, flow.recv)):
            span = tl.spans[index]
            assert at is not None
            bound = events[at]
            assert (bound["name"], bound["args"]["stream"]) == (span.name, span.stream)
            assert bound["ts"] == pytest.approx(span.start_s * 1e6)
            assert bound["dur"] == pytest.approx(span.duration_s * 1e6, abs=1e-6)
    assert dumps_trace(trace) == dumps_trace(chrome_trace(tl))
