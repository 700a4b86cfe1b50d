"""The store's tables of a server shared by a team (schema migration 4 of
:mod:`trainforge.server.store.database`), read and written by :mod:`trainforge.server.team.users` (users),
:mod:`trainforge.server.team.audit` (audit) and :mod:`trainforge.server.scheduling.accounting` (usage).

- ``jobs`` gains ``owner`` (the user who submitted it; jobs from before users existed were the
  state directory's token holder's, ``admin``), ``preemptible`` (0/1), ``preempted_at`` (when it was
  last asked to give its resources back) and ``preemptions`` (how many times).
- ``users``: ``name`` (unique), ``role`` (admin | member | viewer), the token as ``key_id`` (the
  public part that finds the row) and ``token_hash`` (sha256 of the salt and the secret part, hex;
  ``salt`` per user): the token itself is never stored. ``shares`` (fair-share weight), ``quota``
  (JSON ``{kind: amount}`` or NULL), ``created_at``, ``rotated_at``.
- ``audit``: every state-changing request: ``ts``, ``user`` and ``role`` (who), ``action`` (the rule
  that governed it, e.g. ``job.change``), ``method`` and ``path`` (what), ``job_id`` (the job it
  named, if any), ``status`` (the answer), ``client`` (from where: the peer address) and ``detail``.
- ``usage``: each user's decayed usage (``value``, dominant-share seconds) as of ``at``.

Migration 6 (:data:`ISOLATION_TABLES`), the jobs' sandboxes:

- ``users`` gains ``uid`` (the user's number: their jobs run as OS uid ``uid_base + uid``, see
  :mod:`trainforge.server.isolation.mechanism`; never reused, so a user re-added under a removed one's name
  gets another) and ``os_user`` (an OS account the user's jobs run as instead, or NULL);
- ``counters``: ``name`` -> ``value``, the last number handed out (``user_uid``);
- ``job_tokens``: each running job's credential, as ``token_hash`` (sha256 of its secret, hex),
  for the job ``job_id`` of ``owner``; the row goes when the job ends, and the credential with it.

Statements are separated by ``;`` (the store runs them one by one): none may contain one.
"""

TEAM_TABLES = """
ALTER TABLE jobs ADD COLUMN owner TEXT NOT NULL DEFAULT 'admin';
ALTER TABLE jobs ADD COLUMN preemptible INTEGER NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN preempted_at REAL;
ALTER TABLE jobs ADD COLUMN preemptions INTEGER NOT NULL DEFAULT 0;
CREATE TABLE users (
    name TEXT PRIMARY KEY,
    role TEXT NOT NULL,
    key_id TEXT NOT NULL UNIQUE,
    salt TEXT NOT NULL,
    token_hash TEXT NOT NULL,
    shares REAL NOT NULL DEFAULT 1,
    quota TEXT,
    created_at REAL NOT NULL,
    rotated_at REAL
);
CREATE TABLE audit (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    ts REAL NOT NULL,
    user TEXT NOT NULL,
    role TEXT NOT NULL,
    action TEXT NOT NULL,
    method TEXT NOT NULL,
    path TEXT NOT NULL,
    job_id INTEGER,
    status INTEGER NOT NULL,
    client TEXT,
    detail TEXT
);
CREATE INDEX audit_user ON audit(user, seq);
CREATE INDEX audit_job ON audit(job_id, seq);
CREATE TABLE usage (
    user TEXT PRIMARY KEY,
    value REAL NOT NULL,
    at REAL NOT NULL
)
"""

ISOLATION_TABLES = """
ALTER TABLE users ADD COLUMN uid INTEGER;
ALTER TABLE users ADD COLUMN os_user TEXT;
CREATE TABLE counters (
    name TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
CREATE TABLE job_tokens (
    job_id INTEGER PRIMARY KEY,
    owner TEXT NOT NULL,
    token_hash TEXT NOT NULL,
    created_at REAL NOT NULL
)
"""
