"""Server-side downsampling of a job's metric series (trainforge/server/jobs/series.py): pure properties
with hypothesis, and the per-job cache reading a growing events file."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainforge.server.jobs.series import SeriesCache, downsample

values = st.lists(
    st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True, width=32)), min_size=0, max_size=300
)


@given(values, st.integers(1, 50))
def test_buckets_keep_every_extreme_and_the_last_value(vs, points):
    d = downsample(vs, points)
    assert len(d["i"]) <= points and len(d["i"]) == len(d["min"]) == len(d["max"]) == len(d["last"])
    finite = [v for v in vs if v is not None and math.isfinite(v)]
    kept = [v for v in d["max"] if v is not None]
    if finite:
        assert max(kept) == max(finite) and min(v for v in d["min"] if v is not None) == min(finite)  # spikes stay
        assert [v for v in d["last"] if v is not None][-1] == finite[-1]
    else:
        assert kept == []
    for lo, last, hi in zip(d["min"], d["last"], d["max"], strict=True):
        assert (lo is None) == (last is None) == (hi is None)
        assert lo is None or lo <= last <= hi
    if vs:
        assert d["i"][-1] == len(vs) - 1 and d["i"] == sorted(set(d["i"]))  # in order, the last report last


def test_a_short_series_is_returned_whole():
    assert downsample([1.0, None, 3.0], 10) == {"i": [0, 1, 2], "min": [1.0, None, 3.0], "max": [1.0, None, 3.0],
                                               "last": [1.0, None, 3.0]}  # fmt: skip
    with pytest.raises(ValueError, match="points"):
        downsample([1.0], 0)


def test_the_cache_reads_only_what_is_new_and_only_complete_lines(tmp_path):
    path = tmp_path / "events.jsonl"

    def report(step, **metrics):
        return json.dumps({"type": "report", "t": 100.0 + step, "metrics": {"step": step, **metrics}}) + "\n"

    path.write_text(json.dumps({"type": "run_start"}) + "\n" + report(0, loss=2.0) + report(1, loss=float("nan")))
    cache = SeriesCache()
    first = cache.series(1, str(path), 100)
    assert first["n"] == 2 and first["series"]["loss"]["last"] == [2.0, None]
    with open(path, "a") as f:
        f.write(report(2, loss=0.5, acc=0.9))
        f.write('{"type": "report", "t": 1')  # a line still being written: not read yet
    second = cache.series(1, str(path), 100)
    assert second["n"] == 3 and second["next_offset"] < path.stat().st_size
    assert second["series"]["acc"]["last"] == [None, None, 0.9]  # a key that appears later is padded
    assert second["series"]["step"]["t"] == [100.0, 101.0, 102.0]
    assert cache.series(1, str(path), 1)["series"]["loss"] == {"i": [2], "min": [0.5], "max": [2.0], "last": [0.5],
                                                              "t": [102.0], "segment": [0]}  # fmt: skip
    assert cache.series(2, str(tmp_path / "missing.jsonl"), 10)["n"] == 0


def _reference(values, points, first=0):
    """The rule, written plainly: consecutive buckets of ceil(n / points) reports."""
    size = max(1, math.ceil(len(values) / points))
    out = {"i": [], "min": [], "max": [], "last": []}
    for start in range(0, len(values), size):
        chunk = [v for v in values[start : start + size] if v is not None and math.isfinite(v)]
        out["i"].append(first + min(start + size, len(values)) - 1)
        out["min"].append(min(chunk) if chunk else None)
        out["max"].append(max(chunk) if chunk else None)
        out["last"].append(chunk[-1] if chunk else None)
    return out


@given(values, st.integers(1, 50), st.integers(0, 10**6))
def test_the_numpy_buckets_equal_the_plain_rule(vs, points, first):
    assert downsample(vs, points, first=first) == _reference(vs, points, first)


@given(st.integers(1, 400), st.integers(0, 450), st.integers(0, 450), st.integers(1, 60))
def test_a_range_is_the_same_rule_over_those_reports(tmp_path_factory, n, start, end, points):
    path = tmp_path_factory.mktemp("range") / "events.jsonl"
    vs = [float((i * 7919) % 101) for i in range(n)]
    path.write_text("".join(json.dumps({"type": "report", "t": float(i), "metrics": {"v": v}}) + "\n"
                            for i, v in enumerate(vs)))  # fmt: skip
    got = SeriesCache().series(1, str(path), points, start=start, end=end)
    lo, hi = min(start, n), min(end, n - 1)
    want = _reference(vs[lo : hi + 1], points, first=lo)
    assert {k: got["series"]["v"][k] for k in want} == want
    assert got["series"]["v"]["t"] == [float(i) for i in want["i"]]


def _attempts_file(path, lengths):
    """An events file of runs whose lengths are ``lengths``: each a run_start of the next job attempt
    (a lost runner replaced), or, for a negative length, a restart of the run (a worker failure);
    each counts its steps from 0 again (no checkpoint)."""
    lines, attempt, restarts, t = [], 0, 0, 0.0
    for length in lengths:
        if length > 0:
            attempt, restarts = attempt + 1, 0
            lines.append({"type": "run_start", "name": "run", "job_attempt": attempt, "t": t})
        else:
            restarts += 1
            lines.append({"type": "restart", "attempt": restarts, "reason": "worker died", "t": t})
        for step in range(abs(length)):
            t += 1
            lines.append({"type": "report", "index": step, "attempt": restarts, "t": t,
                          "metrics": {"step": step, "loss": 1.0 / (step + 1)}})  # fmt: skip
    path.write_text("".join(json.dumps(e) + "\n" for e in lines))


def test_buckets_never_mix_two_attempts_and_say_which_one_they_are(tmp_path):
    path = tmp_path / "events.jsonl"
    _attempts_file(path, [5, 5, -3])  # attempt 1: steps 0-4, lost; attempt 2: 0-4 again, a restart: 0-2
    cache = SeriesCache()
    whole = cache.series(1, str(path), 100)
    assert whole["segments"] == [
        {"start": 0, "end": 4, "run": "run", "job_attempt": 1, "attempt": 0},
        {"start": 5, "end": 9, "run": "run", "job_attempt": 2, "attempt": 0},
        {"start": 10, "end": 12, "run": "run", "job_attempt": 2, "attempt": 1},
    ]
    step = whole["series"]["step"]
    assert step["last"] == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1, 2] and step["segment"] == [0] * 5 + [1] * 5 + [2] * 3
    coarse = cache.series(1, str(path), 2)["series"]["step"]  # buckets of 7 would join attempts: cut at each
    assert coarse == {"i": [4, 9, 12], "min": [0, 0, 0], "max": [4, 4, 2], "last": [4, 4, 2],
                      "t": [5.0, 10.0, 13.0], "segment": [0, 1, 2]}  # fmt: skip
    part = cache.series(1, str(path), 100, start=3, end=6)["series"]["step"]
    assert part["i"] == [3, 4, 5, 6] and part["segment"] == [0, 0, 1, 1]


@given(st.lists(st.integers(-40, 40).filter(bool), min_size=1, max_size=8), st.integers(1, 30),
       st.integers(0, 200), st.integers(0, 200))  # fmt: skip
def test_no_bucket_spans_two_segments(tmp_path_factory, lengths, points, start, end):
    path = tmp_path_factory.mktemp("segments") / "events.jsonl"
    _attempts_file(path, lengths)
    got = SeriesCache().series(1, str(path), points, start=start, end=end)
    segments, d = got["segments"], got["series"].get("step", {"i": [], "segment": []})
    assert len(segments) == len(lengths)
    first = got["start"]
    for i, seg in zip(d["i"], d["segment"], strict=True):
        assert segments[seg]["start"] <= i <= segments[seg]["end"]
        assert segments[seg]["start"] <= first  # the bucket's first report is in its segment too
        first = i + 1
    assert len(d["i"]) <= points + len(segments) - 1
    assert d["i"] == sorted(d["i"]) and (not d["i"] or d["i"][-1] == got["end"])


def test_a_run_start_says_the_jobs_attempt_and_the_events_file_is_the_owners_alone(tmp_path, monkeypatch):
    import os
    import stat
    import types

    from trainforge._internal.job_events import JobEventsCallback, read_events

    path = tmp_path / "events.jsonl"
    done = types.SimpleNamespace(error=None, metrics={}, checkpoint=None)
    umask = os.umask(0)
    try:
        for attempt in ("2", None):
            if attempt is None:
                monkeypatch.delenv("TRAINFORGE_JOB_ATTEMPT")
            else:
                monkeypatch.setenv("TRAINFORGE_JOB_ATTEMPT", attempt)
            events = JobEventsCallback(str(path))
            events.on_run_start(str(tmp_path / "runs" / "r"), 1)
            events.on_run_end(done)
    finally:
        os.umask(umask)
    got, offset = read_events(str(path))
    assert [(e["type"], e.get("job_attempt")) for e in got] == [("run_start", 2), ("run_end", None),
                                                                 ("run_start", None), ("run_end", None)]  # fmt: skip
    assert offset == path.stat().st_size and stat.S_IMODE(path.stat().st_mode) == 0o600
