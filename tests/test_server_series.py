"""Server-side downsampling of a job's metric series (trainforge/server/_series.py): pure properties
with hypothesis, and the per-job cache reading a growing events file."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainforge.server._series import SeriesCache, downsample

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
                                                              "t": [102.0]}  # fmt: skip
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
