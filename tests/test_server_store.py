"""The train server's JobStore (SQLite): WAL, one writer, events with a monotonic seq, atomic
changes, idempotent submission, migrations."""

from __future__ import annotations

import sqlite3
import threading

import pytest

from trainforge.server import _store as st


@pytest.fixture
def store(tmp_path):
    s = st.JobStore(str(tmp_path / "state.db"))
    yield s
    s.close()


def _add(store, name="j", **kw):
    job, created = store.add_job(name=name, kind="script", spec={"kind": "script", "path": "/x.py"}, **kw)
    assert created
    return job


def test_database_is_in_wal_mode_with_the_schema_version(store, tmp_path):
    conn = sqlite3.connect(str(tmp_path / "state.db"))
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA user_version").fetchone()[0] == st._SCHEMA_VERSION
    conn.close()


def test_a_database_from_a_newer_version_is_refused_with_what_to_do(tmp_path):
    path = str(tmp_path / "state.db")
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version={st._SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(RuntimeError, match="newer trainforge.*--state-dir"):
        st.JobStore(path)


def test_every_change_is_one_event_with_a_monotonic_seq(store):
    a, b = _add(store, "a"), _add(store, "b", held=True)
    assert (a.state, b.state) == (st.QUEUED, st.HELD)
    store.update(a.id, "starting", {"workers": 2}, state=st.STARTING, workers=2, grant={"CPU": 2.0})
    events = store.events_after(0)
    assert [e.type for e in events] == ["submitted", "submitted", "starting"]
    assert [e.seq for e in events] == sorted({e.seq for e in events})
    assert events[-1].payload == {"workers": 2, "state": st.STARTING}
    assert store.get(a.id).grant == {"CPU": 2.0}
    assert [e.type for e in store.events_after(events[0].seq, job_id=a.id)] == ["starting"]
    assert store.last_seq == events[-1].seq


def test_a_failed_change_rolls_back_all_of_it(store):
    job = _add(store)
    before = store.events_after(0)
    with pytest.raises(ValueError, match="unknown field"):
        store.update_many([(job.id, "a", None, {"state": st.RUNNING}), (job.id, "b", None, {"no_such_column": 1})])
    assert store.get(job.id).state == st.QUEUED
    assert store.events_after(0) == before


def test_submission_id_makes_a_submission_idempotent(store):
    first, created = store.add_job(name="x", kind="script", spec={}, submission_id="abc")
    again, created_again = store.add_job(name="y", kind="script", spec={}, submission_id="abc")
    assert created and not created_again and again.id == first.id and again.name == "x"
    assert store.count() == 1


def test_keyset_pages_cover_every_job_once(store):
    ids = [_add(store, f"j{i}").id for i in range(25)]
    seen, before = [], None
    while True:
        page = store.jobs(before=before, limit=10)
        if not page:
            break
        seen += [j.id for j in page]
        before = page[-1].id
    assert seen == sorted(ids, reverse=True)


def test_concurrent_writers_never_see_a_locked_database(store):
    errors = []

    def work(k):
        try:
            for i in range(100):
                job = _add(store, f"{k}-{i}")
                store.update(job.id, "stopped", None, state=st.STOPPED)
        except Exception as exc:  # any error fails the test below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert store.count([st.STOPPED]) == 800
    assert len(store.events_after(0, limit=10_000)) == 1600


def test_last_seq_follows_committed_events_only(store):
    seq = store.last_seq
    job = _add(store)
    assert store.last_seq > seq
    assert [e.seq for e in store.events_after(seq)] == [store.last_seq]
    before = store.last_seq
    with pytest.raises(ValueError):  # rolled back: its event never existed
        store.update_many([(job.id, "a", None, {}), (job.id, "b", None, {"no_such_column": 1})])
    assert store.last_seq == before and store.events_after(before) == []
    reopened = st.JobStore(store.path)
    assert reopened.last_seq == before
    reopened.close()


def test_jobs_running_since_are_those_that_held_resources_in_the_window(store):
    never = _add(store, "never started")
    old = _add(store, "ended before")
    late = _add(store, "ended inside")
    running = _add(store, "still running")
    store.update(old.id, None, None, started_at=100.0, ended_at=200.0)
    store.update(late.id, None, None, started_at=150.0, ended_at=400.0)
    store.update(running.id, None, None, started_at=500.0)
    assert [j.id for j in store.jobs_running_since(300.0)] == [running.id, late.id]  # latest start first
    assert [j.id for j in store.jobs_running_since(300.0, limit=1)] == [running.id]
    assert never.id not in [j.id for j in store.jobs_running_since(0.0)]
