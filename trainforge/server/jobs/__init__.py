"""Running jobs: the job service (``service``: queue, decide, start, follow, stop, reattach), launching
a runner (``launch``), the runner processes (``processes``) and the runner itself (``runner``), each job's
files (``files``), its events tailer (``tailer``), how a run ended (``outcome``), what it uses
(``usage``), its metric series (``series``) and submissions' idempotency (``idempotency``)."""
