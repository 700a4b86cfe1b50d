-- A train server's state.db at schema 6, made by the code of main before issue 35 moved the SQL into
-- trainforge/server/store/ (jobs, events, users, audit, usage, job credentials, an experiment with a trial
-- and a decision), as sqlite3's iterdump() writes it. tests/test_server_store.py loads it and opens it.
-- user_version 6
BEGIN TRANSACTION;
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
INSERT INTO "audit" VALUES(1,1.0,'ann','member','job.submit','POST','/api/v1/jobs',2,201,'127.0.0.1',NULL);
CREATE TABLE counters (
    name TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
INSERT INTO "counters" VALUES('user_uid',2);
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
INSERT INTO "decisions" VALUES(1,1,'t1',2,2.0,'pruned',1,'{"kind": "pruned"}',2);
CREATE TABLE events (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        job_id INTEGER NOT NULL,
        ts REAL NOT NULL,
        type TEXT NOT NULL,
        payload TEXT NOT NULL
    );
INSERT INTO "events" VALUES(1,1,1.79591224837699437138e+09,'submitted','{"state": "QUEUED", "name": "old-a", "priority": 3}');
INSERT INTO "events" VALUES(2,2,1.79591224837772202487e+09,'submitted','{"state": "QUEUED", "name": "asha/objective_t1", "priority": 0}');
INSERT INTO "events" VALUES(3,1,1.79591224837797713278e+09,'starting','{"workers": 2, "state": "STARTING"}');
INSERT INTO "events" VALUES(4,1,1.79591224837808084487e+09,'running','{"pid": 123, "state": "RUNNING"}');
INSERT INTO "events" VALUES(5,1,1.79591224837823081016e+09,'ended','{"state": "SUCCEEDED"}');
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
, owner TEXT NOT NULL DEFAULT 'admin');
INSERT INTO "experiments" VALUES(1,'/runs/asha','asha','tid','server','Basic','ASHA','loss','min','{}',1.0,NULL,'ann');
CREATE TABLE job_tokens (
    job_id INTEGER PRIMARY KEY,
    owner TEXT NOT NULL,
    token_hash TEXT NOT NULL,
    created_at REAL NOT NULL
);
INSERT INTO "job_tokens" VALUES(2,'ann','4dbbe2af48a950324dbe913dc67f579824d79a8dd38ee2c40c7fa9853289338d',1.79591224837950825688e+09);
CREATE TABLE jobs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        name TEXT NOT NULL,
        submission_id TEXT UNIQUE,
        kind TEXT NOT NULL,
        state TEXT NOT NULL,
        priority INTEGER NOT NULL DEFAULT 0,
        spec TEXT NOT NULL,
        submitted_at REAL NOT NULL,
        started_at REAL,
        ended_at REAL,
        attempt INTEGER NOT NULL DEFAULT 0,
        max_retries INTEGER NOT NULL DEFAULT 1,
        grant_json TEXT,
        workers INTEGER,
        gpu_ids TEXT,
        pid INTEGER,
        pid_start_time REAL,
        run_path TEXT,
        exit_code INTEGER,
        failure_class TEXT,
        error TEXT,
        events_offset INTEGER NOT NULL DEFAULT 0,
        last_metrics TEXT,
        reports INTEGER NOT NULL DEFAULT 0
    , submission_digest TEXT, owner TEXT NOT NULL DEFAULT 'admin', preemptible INTEGER NOT NULL DEFAULT 0, preempted_at REAL, preemptions INTEGER NOT NULL DEFAULT 0);
INSERT INTO "jobs" VALUES(1,'old-a','sub-1','script','SUCCEEDED',3,'{"kind": "script", "path": "/x.py"}',1.79591224837694120406e+09,NULL,5.0,0,1,'{"CPU": 2.0}',2,'["0"]',123,NULL,'/runs/x',0,NULL,NULL,0,'{"loss": 0.5}',2,'d1','admin',0,NULL,0);
INSERT INTO "jobs" VALUES(2,'asha/objective_t1',NULL,'script','QUEUED',0,'{"kind": "script", "path": "/t.py", "config": {"x": 0.5}, "experiment": {"path": "/runs/asha", "name": "asha", "trial_id": "t1", "metric": "loss", "mode": "min", "space": {}}}',1.79591224837769722942e+09,NULL,NULL,0,1,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,0,NULL,0,NULL,'ann',1,NULL,0);
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
INSERT INTO "trials" VALUES(1,'t1','objective_t1','{"x": 0.5}','[{"job": 2, "cut": null, "base": 0}]',2,'QUEUED',0,'queued',NULL,1,0.5,0.5,1,NULL,NULL,NULL,NULL,NULL,2);
CREATE TABLE usage (
    user TEXT PRIMARY KEY,
    value REAL NOT NULL,
    at REAL NOT NULL
);
INSERT INTO "usage" VALUES('ann',12.5,100.0);
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
, uid INTEGER, os_user TEXT);
INSERT INTO "users" VALUES('ann','member','2429128d143de2ad','ee14c72ff8df2623c7482a5e2a56b73d','cde117afa64abbe1860b028890d5750d766c06bcf6bbd8565b79017e9552cef4',2.0,'{"CPU": 4.0}',1.79591224837862944605e+09,NULL,1,NULL);
INSERT INTO "users" VALUES('bob','viewer','9ef79c4281678a88','d4e55cf336331d1d0d0b590c3bc46130','bb855556df73ff46ae30f84b5ebcf1f3112c08fc2ec70dd98b3a63a7769e4e39',1.0,NULL,1.79591224837881660459e+09,NULL,2,NULL);
CREATE INDEX jobs_state ON jobs(state, id);
CREATE INDEX events_job ON events(job_id, seq);
CREATE INDEX trials_job ON trials(job_id);
CREATE INDEX trials_rev ON trials(experiment_id, rev);
CREATE INDEX decisions_experiment ON decisions(experiment_id, seq)
;
CREATE INDEX audit_user ON audit(user, seq);
CREATE INDEX audit_job ON audit(job_id, seq);
DELETE FROM "sqlite_sequence";
INSERT INTO "sqlite_sequence" VALUES('jobs',2);
INSERT INTO "sqlite_sequence" VALUES('events',5);
INSERT INTO "sqlite_sequence" VALUES('audit',1);
INSERT INTO "sqlite_sequence" VALUES('experiments',1);
INSERT INTO "sqlite_sequence" VALUES('decisions',1);
COMMIT;
