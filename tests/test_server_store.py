"""The train server's JobStore (SQLite): WAL, one writer, events with a monotonic seq, atomic
changes, idempotent submission, migrations."""

from __future__ import annotations

import ast
import os
import pathlib
import re
import sqlite3
import threading

import pytest

from trainforge.client._states import JobEvent, JobState
from trainforge.server.store import database as st
from trainforge.server.store.migrations import SCHEMA_VERSION


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
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    conn.close()


def test_a_database_from_a_newer_version_is_refused_with_what_to_do(tmp_path):
    path = str(tmp_path / "state.db")
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(RuntimeError, match="newer trainforge.*--state-dir"):
        st.JobStore(path)


def test_every_change_is_one_event_with_a_monotonic_seq(store):
    a, b = _add(store, "a"), _add(store, "b", held=True)
    assert (a.state, b.state) == (JobState.QUEUED, JobState.HELD)
    store.update(a.id, "starting", {"workers": 2}, state=JobState.STARTING, workers=2, grant={"CPU": 2.0})
    events = store.events_after(0)
    assert [e.type for e in events] == ["submitted", "submitted", "starting"]
    assert [e.seq for e in events] == sorted({e.seq for e in events})
    assert events[-1].payload == {"workers": 2, "state": JobState.STARTING}
    assert store.get(a.id).grant == {"CPU": 2.0}
    assert [e.type for e in store.events_after(events[0].seq, job_id=a.id)] == ["starting"]
    assert store.last_seq == events[-1].seq


def test_an_event_type_outside_job_event_is_refused_and_rolls_back(store):
    job = _add(store)
    before = store.events_after(0)
    with pytest.raises(ValueError, match="'resize to 3 workers' is not a valid JobEvent"):
        store.update_many([(job.id, JobEvent.RUNNING, None, {"state": JobState.RUNNING}),
                           (job.id, "resize to 3 workers", None, {})])  # fmt: skip
    assert store.get(job.id).state == JobState.QUEUED and store.events_after(0) == before
    store.update(job.id, "running", None, state=JobState.RUNNING)  # a name is its member
    assert store.events_after(0)[-1].type == "running"


def test_a_failed_change_rolls_back_all_of_it(store):
    job = _add(store)
    before = store.events_after(0)
    with pytest.raises(ValueError, match="unknown field"):
        store.update_many([(job.id, JobEvent.RUNNING, None, {"state": JobState.RUNNING}),
                           (job.id, JobEvent.ENDED, None, {"no_such_column": 1})])
    assert store.get(job.id).state == JobState.QUEUED
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
                store.update(job.id, "stopped", None, state=JobState.STOPPED)
        except Exception as exc:  # any error fails the test below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert store.count([JobState.STOPPED]) == 800
    assert len(store.events_after(0, limit=10_000)) == 1600


def test_last_seq_follows_committed_events_only(store):
    seq = store.last_seq
    job = _add(store)
    assert store.last_seq > seq
    assert [e.seq for e in store.events_after(seq)] == [store.last_seq]
    before = store.last_seq
    with pytest.raises(ValueError):  # rolled back: its event never existed
        store.update_many([(job.id, JobEvent.RUNNING, None, {}), (job.id, JobEvent.ENDED, None, {"no_such_column": 1})])
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


def _db_fds(path: str) -> int:
    """This process's open descriptors of the database file (each SQLite connection holds one)."""
    target, n = os.path.realpath(path), 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}") == target
        except OSError:  # closed since the listing
            continue
    return n


def _read_in_threads(store: st.JobStore, n_threads: int) -> tuple[list[Exception], threading.Event, list[threading.Thread]]:
    """``n_threads`` threads that start together, read the store, and stay alive (so that whatever
    connection each made would still be open) until the returned event is set."""
    start, done = threading.Barrier(n_threads), threading.Barrier(n_threads + 1)
    release = threading.Event()
    errors: list[Exception] = []

    def read() -> None:
        try:
            start.wait(timeout=30)
            for _ in range(20):
                assert len(store.jobs(limit=50)) == 50
                assert store.get(1) is not None and store.count() == 60 and store.events_after(0, limit=5)
        except Exception as exc:  # any error fails the test
            errors.append(exc)
        done.wait(timeout=30)
        release.wait(timeout=30)

    threads = [threading.Thread(target=read) for _ in range(n_threads)]
    for t in threads:
        t.start()
    done.wait(timeout=30)
    return errors, release, threads


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc")
def test_however_many_threads_read_the_store_has_a_bounded_pool_of_connections(store):
    for i in range(60):
        _add(store, f"j{i}")
    errors, release, threads = _read_in_threads(store, 16)
    try:
        assert errors == []
        assert _db_fds(store.path) <= st.READERS + 1  # the readers and the writer, not one per thread
        assert 1 <= store.readers.peak <= st.READERS and store.readers.opened <= st.READERS
    finally:
        release.set()
        for t in threads:
            t.join()


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc")
def test_close_closes_every_connection_and_later_reads_raise(tmp_path):
    store = st.JobStore(str(tmp_path / "state.db"))
    for i in range(60):
        _add(store, f"j{i}")
    errors, release, threads = _read_in_threads(store, 4)
    try:
        assert errors == [] and store.count() == 60  # this thread read too
        store.close()
        assert _db_fds(store.path) == 0  # while every thread that read is still alive
        assert store.readers.opened == 0
    finally:
        release.set()
        for t in threads:
            t.join()
    with pytest.raises(sqlite3.ProgrammingError):
        store.jobs()


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc")
def test_a_reader_lent_when_the_store_closes_is_closed_when_given_back(store):
    _add(store)
    with store.readers.lend() as conn:
        store.close()
        assert store.readers.opened == 1  # the lent one: its read may finish
        assert conn.execute("SELECT COUNT(*) FROM jobs").fetchone()[0] == 1
    # (SQLite keeps a closed connection's descriptor while another one of the process has the file open.)
    assert _db_fds(store.path) == 0 and store.readers.opened == 0


def test_a_reader_that_fails_to_connect_frees_its_place_in_the_pool(tmp_path):
    made: list[sqlite3.Connection] = []

    def connect() -> sqlite3.Connection:
        if not made:
            made.append(sqlite3.connect(":memory:", check_same_thread=False))
            raise sqlite3.OperationalError("unable to open database file")
        conn = sqlite3.connect(":memory:", check_same_thread=False)
        made.append(conn)
        return conn

    pool = st._ReaderPool(connect, 1)
    with pytest.raises(sqlite3.OperationalError):
        with pool.lend():
            pass
    assert pool.opened == 0
    with pool.lend() as conn:  # the one place is free again: no wait forever
        assert conn is made[-1]
    pool.close()
    made[0].close()


def test_the_pages_take_the_event_types_from_the_server_and_the_scripts_copy_none():
    import pathlib
    import re

    from trainforge.server.pages.dashboard import states_json

    assert states_json()["events"] == [e.value for e in JobEvent]
    static = pathlib.Path(st.__file__).parent.parent / "pages" / "static"
    for script in ("dashboard.js", "experiments.js", "page.js"):
        text = (static / script).read_text()
        for call in re.findall(r"jobEvents\(([^)]*)\)", text):  # names the script picks: each one the server's
            for name in re.findall(r'"([^"]*)"', call):
                assert name in states_json()["events"], f"{script}: jobEvents({name!r}) is no JobEvent"
        rest = re.sub(r"jobEvents\([^)]*\)", "", text)
        events = {e.value for e in JobEvent}
        for listed in re.findall(r"\[([^\[\]]*)\]", rest):  # no list of event names of its own
            names = set(re.findall(r'"([^"]*)"', listed)) & events
            assert len(names) < 2, f"{script} lists job events itself: [{listed}]"


# -- a database of an earlier release --------------------------------------------------------------------
FIXTURE = os.path.join(os.path.dirname(__file__), "data", "state_v6.sql")


def _schema(path: str) -> list[tuple]:
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY type, name").fetchall()
        return [*rows, ("user_version", conn.execute("PRAGMA user_version").fetchone()[0])]
    finally:
        conn.close()


def _from_dump(path: str) -> None:
    """The fixture's database at ``path``: its statements, and the schema version its first line names."""
    text = open(FIXTURE).read()
    version = int(text.split("-- user_version ", 1)[1].split()[0])
    conn = sqlite3.connect(path)
    conn.executescript(text)
    conn.execute(f"PRAGMA user_version={version}")
    conn.commit()
    conn.close()


def test_a_database_made_by_main_before_the_store_move_opens_with_every_row(tmp_path):
    """tests/data/state_v6.sql was written by the code of main before the SQL moved into the store (at
    schema 6): the migrations make its schema to the letter, it opens, and every table's rows read back."""
    from trainforge.server.store.migrations import MIGRATIONS

    old, at_6, fresh = str(tmp_path / "old.db"), str(tmp_path / "at_6.db"), str(tmp_path / "fresh.db")
    _from_dump(old)
    conn = sqlite3.connect(at_6)
    for n in range(1, 7):
        conn.executescript(MIGRATIONS[n])
    conn.execute("PRAGMA user_version=6")
    conn.close()
    assert _schema(at_6) == _schema(old)  # the migrations up to 6 make main's schema, to the letter
    st.JobStore(fresh).close()
    store = st.JobStore(old)
    assert _schema(old) == _schema(fresh)  # and the newer ones take it to a fresh database's
    try:
        a, b = store.get(1), store.get(2)
        assert (a.name, a.state, a.priority, a.grant, a.gpu_ids, a.last_metrics, a.submission_id, a.submission_digest) == (
            "old-a", JobState.SUCCEEDED, 3, {"CPU": 2.0}, ["0"], {"loss": 0.5}, "sub-1", "d1")
        assert (b.owner, b.preemptible, b.spec["experiment"]["trial_id"]) == ("ann", True, "t1")
        assert store.counts() == {("admin", "SUCCEEDED"): 1, ("ann", "QUEUED"): 1}
        assert [e.type for e in store.events_after(0)] == ["submitted", "submitted", "starting", "running", "ended"]
        users = {u["name"]: u for u in store.users.all()}
        assert (users["ann"]["role"], users["ann"]["shares"], users["ann"]["uid"], users["bob"]["uid"]) == ("member", 2.0, 1, 2)
        assert store.users.add("cid", role="viewer", key_id="k" * 16, salt="00", token_hash="0" * 64, shares=1.0,
                               quota=None, created_at=1.0, os_user=None)["uid"] == 3  # numbers go on from the counter
        assert [(r["user"], r["action"], r["job_id"]) for r in store.audit.newest()] == [("ann", "job.submit", 2)]
        assert list(store.job_tokens.all()) == [2]
        assert store.usage_rows() == {"ann": (12.5, 100.0)}
        assert store.experiments.trial_job_ids() == {2}
        assert [r["kind"] for r in store.experiments.decisions(1)] == ["pruned"]
        job, created = store.add_job(name="new", kind="script", spec={})
        assert created and job.id == 3 and store.last_seq == 6  # ids and seqs go on after the old ones
    finally:
        store.close()


def test_each_migration_from_an_older_schema_leads_to_the_same_schema(tmp_path):
    """A database left at any earlier schema version migrates to the schema a fresh one gets."""
    from trainforge.server.store.migrations import MIGRATIONS, SCHEMA_VERSION

    fresh = str(tmp_path / "fresh.db")
    st.JobStore(fresh).close()
    for version in range(0, SCHEMA_VERSION):
        path = str(tmp_path / f"v{version}.db")
        conn = sqlite3.connect(path)
        for n in range(1, version + 1):
            conn.executescript(MIGRATIONS[n])
        conn.execute(f"PRAGMA user_version={version}")
        conn.commit()
        conn.close()
        st.JobStore(path).close()
        assert _schema(path) == _schema(fresh), f"from schema {version}"


# -- the store tells what it committed -----------------------------------------------------------------
def test_watchers_hear_of_added_and_moved_jobs_after_the_commit_only(store):
    heard: list[st.JobsChanged] = []

    def listener(changed: st.JobsChanged) -> None:
        assert store.get(next(iter(changed.added or changed.moved))) is not None  # committed: readable
        heard.append(changed)

    store.watch(listener)
    job = _add(store)
    assert heard[-1].added == {job.id: {"kind": "script", "path": "/x.py"}} and heard[-1].moved == frozenset()
    store.update(job.id, priority=5)  # neither its state nor its events offset: nobody is told
    assert len(heard) == 1
    store.update(job.id, JobEvent.RUNNING, None, state=JobState.RUNNING)
    store.update(job.id, events_offset=10)
    assert [h.moved for h in heard[1:]] == [frozenset({job.id}), frozenset({job.id})]
    with pytest.raises(ValueError, match="unknown field"):
        store.update_many([(job.id, None, None, {"state": JobState.STOPPED}), (job.id, None, None, {"bad": 1})])
    assert len(heard) == 3  # rolled back: nothing to tell


def test_a_failing_watcher_neither_undoes_nor_fails_the_change_and_a_watcher_may_write(store, caplog):
    wrote: list[int] = []

    def failing(changed: st.JobsChanged) -> None:
        raise RuntimeError("boom")

    def writing(changed: st.JobsChanged) -> None:
        if changed.added:  # its own write is a transaction of its own (and adds no job: no recursion)
            wrote.append(store.experiments.change(lambda w: w.add_experiment(
                path=f"/runs/{len(wrote)}", name="x", source="server", created_at=1.0)))

    store.watch(failing)
    store.watch(writing)
    job = _add(store)
    assert store.get(job.id).state == JobState.QUEUED and wrote == [1]
    assert "listener of the store's job changes failed" in caplog.text


# -- no SQL outside the store ---------------------------------------------------------------------------
_SQL = re.compile(r"\bSELECT\b[\s\S]*\bFROM\b|\bINSERT\s+INTO\b|\bUPDATE\s+\w+\s+SET\b|\bDELETE\s+FROM\b"
                  r"|\bCREATE\s+(?:UNIQUE\s+)?(?:TABLE|INDEX)\b|\bALTER\s+TABLE\b|\bPRAGMA\s+\w+")
_DB_CALLS = frozenset({"execute", "executemany", "executescript", "cursor"})


def _text(node: ast.AST) -> str | None:
    """A string literal's text (an f-string's, its parts joined by ``{}``), or None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "{}".join(v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str))
    return None


def sql_spoken(source: str) -> list[str]:
    """Where ``source`` speaks SQL: it imports ``sqlite3``, has SQL in a string literal (SELECT ... FROM,
    INSERT INTO, UPDATE ... SET, DELETE FROM, CREATE TABLE/INDEX, ALTER TABLE, PRAGMA), calls
    ``executemany``, ``executescript`` or ``cursor``, or ``execute`` with a string (a worker group's
    ``execute(fn)`` is no SQL)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Import) and any(a.name.split(".")[0] == "sqlite3" for a in node.names)
                or isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "sqlite3"):  # fmt: skip
            found.append(f"line {node.lineno}: imports sqlite3")
        elif isinstance(node, (ast.Constant, ast.JoinedStr)) and _SQL.search(_text(node) or ""):
            found.append(f"line {node.lineno}: SQL in a string: {(_text(node) or '')[:60]!r}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _DB_CALLS:
            if node.func.attr != "execute" or (node.args and _text(node.args[0]) is not None):
                found.append(f"line {node.lineno}: calls .{node.func.attr}()")
    return found


@pytest.mark.parametrize("snippet", [
    "import sqlite3",
    "from sqlite3 import Row",
    'rows = store.query("SELECT owner FROM jobs WHERE id=?", (1,))',
    'sql = ("SELECT a "\n       "FROM t")',
    'q = f"SELECT {cols} FROM trials WHERE experiment_id = ?"',
    'conn.execute(f"UPDATE users SET {sets} WHERE name=?")',
    "conn.execute('DELETE FROM job_tokens WHERE job_id=?', (1,))",
    'conn.executemany(sql, rows)',
    'cur = conn.cursor()',
    'STATEMENT = "INSERT INTO usage(user) VALUES (?)"',
    'X = "CREATE TABLE t (a)"',
    'X = "ALTER TABLE jobs ADD COLUMN x"',
    'X = "PRAGMA user_version"',
])  # fmt: skip
def test_the_sql_finder_finds_each_way_of_speaking_sql(snippet):
    assert sql_spoken(snippet), snippet


@pytest.mark.parametrize("snippet", [
    "worker_group.execute(_find_port, local)",
    'print("Select a file from the list")',
    '"""DELETE /models/{name}/aliases/{alias}   remove it"""',
    'url = "sqlite:///mlflow.db"',
    'header = ["NAME", "UPDATED"]',
])  # fmt: skip
def test_the_sql_finder_leaves_what_is_no_sql(snippet):
    assert sql_spoken(snippet) == []


def test_no_module_outside_the_store_speaks_sql():
    """Only trainforge/server/store/ speaks SQL (its package docstring says where to add a query or a
    migration); everything else calls its methods. Nothing outside the server uses SQLite itself (MLflow's
    and Optuna's storage URLs name their own databases): no allow-list."""
    root = pathlib.Path(st.__file__).parents[3]
    store = pathlib.Path(st.__file__).parent
    spoken = {str(p.relative_to(root)): found for p in sorted((root / "trainforge").rglob("*.py"))
              if store not in p.parents and (found := sql_spoken(p.read_text()))}  # fmt: skip
    assert spoken == {}
