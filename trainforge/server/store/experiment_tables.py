"""The store's tables of Tune experiments (schema migration 3 of :mod:`trainforge.server.store.database`), read
and written by :mod:`trainforge.server.experiments.book`.

- ``experiments``: one per experiment directory (``path``, unique): found from its trials' jobs (their
  spec's ``experiment`` tag, ``source`` "server") or imported from the directory (``source`` "import");
  its searcher, scheduler, metric, mode and search space (``space``, JSON: param -> {kind, low, high,
  log, choices}). ``ended_at``: set for an imported experiment (a snapshot), None while trials may come.
  ``owner`` (migration 5, :data:`EXPERIMENT_OWNER`): the user who imported it, or whose trial job
  made it (experiments from before were the admin's); only they or an admin may import it again.
- ``trials``: one per trial of an experiment. ``jobs`` (JSON ``[{"job": id, "cut": n | null}]``) are
  the jobs that ran it (PBT: one per run), each with ``cut``, the iteration at which a tuner's stop
  decision was taken (its reports after it are not the trial's); ``job_id``/``job_state`` the latest
  job as last seen; ``scanned`` the byte offset of that job's events file counted in so far. ``state``:
  a :class:`~trainforge.client.TrialState` (PENDING | RUNNING | PAUSED | TERMINATED | ERROR; migration
  7, :data:`TRIAL_STATES_OF_TUNE`, renamed the older queued | running | completed | pruned | stopped |
  errored); ``reason`` (JSON) why it ended;
  ``iterations``, ``last``, ``best`` (and ``best_at``) of the experiment's metric, ``metrics`` its last
  reported metrics (JSON), ``history`` (imported trials only, JSON ``{key: [[iteration, t, value]]}``:
  server trials' come from their jobs' events files), ``checkpoint`` its latest (imported trials).
  ``rev``: the experiments' change counter when the row last changed (the live stream's event id).
- ``decisions``: every decision a tuner took on a trial (stop at a rung, exploit, stop criteria, ...):
  its ``kind``, the ``iteration`` it was taken at and its ``detail`` (JSON), with the ``rev`` it was
  recorded at.

Statements are separated by ``;`` (the store runs them one by one): none may contain one.
"""

EXPERIMENT_TABLES = """
CREATE TABLE experiments (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    path TEXT NOT NULL UNIQUE,
    name TEXT NOT NULL,
    tune_id TEXT,
    source TEXT NOT NULL,
    searcher TEXT,
    scheduler TEXT,
    metric TEXT,
    mode TEXT,
    space TEXT NOT NULL DEFAULT '{}',
    created_at REAL NOT NULL,
    ended_at REAL
);
CREATE TABLE trials (
    experiment_id INTEGER NOT NULL,
    trial_id TEXT NOT NULL,
    name TEXT NOT NULL,
    config TEXT NOT NULL,
    jobs TEXT NOT NULL DEFAULT '[]',
    job_id INTEGER,
    job_state TEXT,
    scanned INTEGER NOT NULL DEFAULT 0,
    state TEXT NOT NULL,
    reason TEXT,
    iterations INTEGER NOT NULL DEFAULT 0,
    last REAL,
    best REAL,
    best_at INTEGER,
    metrics TEXT,
    history TEXT,
    checkpoint TEXT,
    started_at REAL,
    ended_at REAL,
    rev INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (experiment_id, trial_id)
);
CREATE INDEX trials_job ON trials(job_id);
CREATE INDEX trials_rev ON trials(experiment_id, rev);
CREATE TABLE decisions (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    experiment_id INTEGER NOT NULL,
    trial_id TEXT NOT NULL,
    job_id INTEGER,
    ts REAL NOT NULL,
    kind TEXT NOT NULL,
    iteration INTEGER,
    detail TEXT NOT NULL,
    rev INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX decisions_experiment ON decisions(experiment_id, seq)
"""

EXPERIMENT_OWNER = "ALTER TABLE experiments ADD COLUMN owner TEXT NOT NULL DEFAULT 'admin'"

# The trials' states in Tune's names (trainforge.client.TrialState), as trial_state derives them: a
# pruned or completed trial is TERMINATED; a stopped one PENDING when the tuner was interrupted
# (Tuner.restore continues it), else ERROR (stopped on the server, not by the tuner).
TRIAL_STATES_OF_TUNE = """
UPDATE trials SET state = CASE state
    WHEN 'queued' THEN 'PENDING'
    WHEN 'running' THEN 'RUNNING'
    WHEN 'completed' THEN 'TERMINATED'
    WHEN 'pruned' THEN 'TERMINATED'
    WHEN 'errored' THEN 'ERROR'
    WHEN 'stopped' THEN CASE WHEN json_extract(reason, '$.kind') = 'interrupted' THEN 'PENDING' ELSE 'ERROR' END
    ELSE state END
"""
