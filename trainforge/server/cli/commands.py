"""The train server's commands of the ``trainforge`` CLI, in the style of ``ray job`` and Slurm:

    trainforge server start [--detach] [--port P] [--state-dir D] [--capacity CPU=8,GPU=2] [--registry URI]
    trainforge server status | stop
    trainforge submit [--no-wait] [--workers N] [--cpus C] [--gpus G] ... (script.py [ARGS] | pkg.mod:fn)
    trainforge jobs | status ID | logs ID [-f] [--rank N] [--tail N] | stop ID [--force]
    trainforge queue | resources | hold ID | release ID | priority ID N | retry ID
    trainforge server users add|list|remove|rotate|set ... | events [--user NAME] | whoami   (_cli_team)

Listing commands take ``--json``. A blocking ``submit`` streams the job's output and exits with the
job's exit code; Ctrl-C detaches (the job goes on) and exits 130.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Any

from trainforge._internal.amounts import fmt_number, fmt_resources
from trainforge._internal.constants import default_state_dir
from trainforge._internal.display import ordered_metrics
from trainforge._internal.http import DEFAULT_MAX_BODY
from trainforge._internal.key_values import (
    RESOURCES_METAVAR,
    parse_key_values,
    parse_resources,
    resources_arg,
    size_arg,
)
from trainforge._internal.resources import MIN_CPU_PER_WORKER
from trainforge._internal.trainer_job import NUM_WORKERS
from trainforge.client import ACTIVE_STATES, InvalidJobError, JobState
from trainforge.server._config import DEFAULT_PORT, ServerConfig
from trainforge.server.cli.listing import (
    client,
    jobs_command,
    logs_command,
    print_json,
    queue_command,
    resources_command,
)
from trainforge.server.cli.stopping import stop_saying
from trainforge.server.cli.team import add_commands as add_team_commands
from trainforge.server.cli.team import add_start_options, start_config
from trainforge.server.cli.team import forward as team_forward


def user_errors() -> tuple[type[Exception], ...]:
    """The errors of the server's commands a user can cause (with a message saying what to do):
    ``trainforge`` prints them as one line, without a traceback."""
    from trainforge.client import ClientError
    from trainforge.server._main import ServerRunningError, ServerStartError

    return ClientError, ServerRunningError, ServerStartError


def add_commands(sub: Any) -> None:
    server = sub.add_parser("server", help="start, stop or look at the train server")
    ssub = server.add_subparsers(dest="server_command", required=True)
    start = ssub.add_parser("start", help="run a train server (foreground; --detach for background)")
    start.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    start.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0: any free)")
    _state_dir(start)
    start.add_argument("--capacity", type=resources_arg, metavar=RESOURCES_METAVAR, help="what jobs may use, e.g. CPU=8,GPU=2,memory=32G "
                       "(default: this machine, or the Ray cluster, less --reserve)")  # fmt: skip
    start.add_argument("--reserve", type=resources_arg, metavar=RESOURCES_METAVAR, help="kept back from a measured capacity "
                       "(default CPU=1 on 8+ CPUs, memory=min(2G, 10%%))")  # fmt: skip
    start.add_argument("--stop-grace", type=float, default=10.0, help="seconds a stopped job has to end cleanly")
    start.add_argument("--durable", action="store_true", help="fsync every commit (survives power loss)")
    start.add_argument("--no-warm", dest="warm", action="store_false",
                       help="start every job's processes fresh (no warm fork server; saves its memory)")  # fmt: skip
    start.add_argument("--token-file", help="read the API token from this file (needed for a non-loopback --host)")
    start.add_argument("--detach", action="store_true", help="run in the background; output in <state-dir>/server.log")
    start.add_argument("--registry", help="the model registry of its Models page and /api/v1/models (path or URL; "
                       "default: $TRAINFORGE_REGISTRY, else ~/trainforge/registry)")  # fmt: skip
    start.add_argument("--max-body", type=size_arg, default=DEFAULT_MAX_BODY, metavar="SIZE",
                       help="the largest request body it takes, e.g. 64Mi (the default), 1G, 500M")  # fmt: skip
    add_start_options(start)
    start.set_defaults(func=_server_start)
    _command(ssub, "status", _server_status, "is a server running, where, with which jobs", _state_dir, _json)
    stop = _command(ssub, "stop", _server_stop, "stop the server (running jobs go on unless --stop-jobs)", _state_dir)
    stop.add_argument("--stop-jobs", action="store_true", help="stop every running job first")
    doctor = ssub.add_parser("doctor", help="how this host would keep a team's jobs apart, checked by running one")
    doctor.add_argument("--job-isolation", choices=("auto", "uid", "userns", "off"), default="auto",
                        help="the mode to check (default: what `server start` would choose)")  # fmt: skip
    doctor.set_defaults(func=_server_doctor)
    add_team_commands(sub, ssub, _address)

    submit = sub.add_parser("submit", help="queue a job: a script, or module:function returning a trainer")
    submit.add_argument("target", help="script.py (its fit() calls are the job's runs) or pkg.module:function")
    submit.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script or function")
    submit.add_argument("--workers", default="1", help="workers (N, or MIN-MAX for an elastic job); default 1")
    submit.add_argument("--cpus", type=float, default=1.0,
                        help=f"CPUs per worker (default 1; each worker counts at least {fmt_number(MIN_CPU_PER_WORKER)})")
    submit.add_argument("--gpus", type=float, default=0.0, help="GPUs per worker (default 0)")
    submit.add_argument("--memory", help="memory per worker, e.g. 4G (admission only)")
    submit.add_argument("--resources", type=resources_arg, metavar=RESOURCES_METAVAR, help="other resources per worker, e.g. TPU=1")
    submit.add_argument("--priority", type=int, default=0, help="higher runs first (default 0)")
    submit.add_argument("--name", help="job name (default: the script or function)")
    submit.add_argument("--hold", action="store_true", help="queue it held (start with `trainforge release ID`)")
    submit.add_argument("--preemptible", action="store_true", help="may give its resources back to a higher-priority "
                        "job (it stops as after Ctrl-C, is requeued and resumes from its latest checkpoint)")  # fmt: skip
    submit.add_argument("--max-retries", type=int, default=1, help="times a lost job is requeued (default 1)")
    submit.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="environment for the job")
    submit.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                        help="a configuration value to record with the job (JSON or text; the dashboard's "
                             "compare page groups jobs by it); repeatable")
    submit.add_argument("--storage", action="append", default=[], metavar="DIR",
                        help="a directory the job writes its runs to (writable in its sandbox on a server with "
                             "users; its RunConfig.storage_path); repeatable")  # fmt: skip
    submit.add_argument("--no-wait", action="store_true", help="return once queued")
    _address(submit)
    submit.set_defaults(func=_submit)

    jobs = _command(sub, "jobs", jobs_command, "list jobs, newest first", _address, _json)
    jobs.add_argument("--state", action="append", help="only jobs in this state (repeatable)")
    jobs.add_argument("--limit", type=int, default=50, help="the newest N (default 50)")
    jobs.add_argument("--all", action="store_true", help="every job (however many)")
    for verb, helptext, func in (
        ("status", "one job: state, why it waits, its grant, last metrics", _status),
        ("hold", "keep a queued job from starting", _hold),
        ("release", "let a held job start", _release),
        ("retry", "queue an ended job again (from its latest checkpoint, or --checkpoint PATH)", _retry),
    ):
        p = sub.add_parser(verb, help=helptext)
        p.add_argument("job_id", type=int)
        if verb == "retry":
            p.add_argument("--checkpoint", help="start a new run from this checkpoint (see the job page)")
        _address(p)
        if verb == "status":
            _json(p)
        p.set_defaults(func=func)
    prio = _command(sub, "priority", _priority, "change a queued job's priority", _address)
    prio.add_argument("job_id", type=int)
    prio.add_argument("priority", type=int)
    logs = _command(sub, "logs", logs_command, "a job's output", _address)
    logs.add_argument("job_id", type=int)
    logs.add_argument("-f", "--follow", action="store_true", help="follow until the job ends")
    logs.add_argument("--rank", type=int, help="that rank's own log")
    logs.add_argument("--tail", type=int, help="only the last N lines")
    stop_job = _command(sub, "stop", _stop, "stop a job (as Ctrl-C, then kill what is left)", _address)
    stop_job.add_argument("job_id", type=int)
    stop_job.add_argument("--force", action="store_true", help="kill at once")
    stop_job.add_argument("--grace", type=float, help="seconds to end cleanly before the kill")
    _command(sub, "queue", queue_command, "waiting jobs in the order they will start, with their reasons", _address,
             _json)  # fmt: skip
    _command(sub, "resources", resources_command, "capacity, granted and free resources; who holds which GPU",
             _address, _json)  # fmt: skip
    _command(sub, "dashboard", _dashboard, "print the dashboard's URL (with the token that opens it)", _address)


def _command(sub: Any, name: str, run: Any, summary: str, *options: Any) -> Any:
    """Subcommand ``name`` run by ``run(args)``, with the common ``options`` (``_address``, ``_json``,
    ``_state_dir``: each adds its arguments)."""
    p = sub.add_parser(name, help=summary)
    for add in options:
        add(p)
    p.set_defaults(func=run)
    return p


def _state_dir(p: Any) -> None:
    p.add_argument("--state-dir", default=None, help=f"server state (default {default_state_dir()})")


def _address(p: Any) -> None:
    p.add_argument("--address", help="server URL (default: $TRAINFORGE_ADDRESS or the local server)")
    _state_dir(p)


def _json(p: Any) -> None:
    p.add_argument("--json", action="store_true", help="print JSON")


# -- server ---------------------------------------------------------------------------------------
def _server_start(args: Any) -> int:
    state_dir = args.state_dir or default_state_dir()
    token = None
    if args.token_file:
        with open(args.token_file) as f:
            token = f.read().strip()
    config = ServerConfig(
        state_dir=state_dir, host=args.host, port=args.port, capacity=args.capacity, reserve=args.reserve,
        stop_grace_s=args.stop_grace, durable=args.durable, token=token, warm=args.warm, registry=args.registry,
        max_body=args.max_body, **start_config(args),
    )  # fmt: skip
    if args.detach:
        from trainforge.server._main import (
            check_not_running,
            dashboard_url,
            own_terminal,
            read_token,
            start_background_server,
        )

        forward = ["--host", args.host, "--port", str(args.port), "--stop-grace", str(args.stop_grace),
                   "--max-body", str(args.max_body)]
        if args.capacity:
            forward += ["--capacity", ",".join(f"{k}={v}" for k, v in args.capacity.items())]
        if args.reserve:
            forward += ["--reserve", ",".join(f"{k}={v}" for k, v in args.reserve.items())]
        if args.durable:
            forward.append("--durable")
        if not args.warm:
            forward.append("--no-warm")
        if args.token_file:
            forward += ["--token-file", os.path.abspath(args.token_file)]
        if args.registry:
            forward += ["--registry", args.registry]
        forward += team_forward(args)
        check_not_running(config.state_dir)  # before saying it starts (start_background_server checks again)
        print(f"trainforge server: starting in the background (output in {config.state_dir}/server.log) ...", flush=True)
        url = start_background_server(config.state_dir, extra_args=forward)
        print(f"trainforge server: serving {url}\n  token: {config.state_dir}/token   state: {config.state_dir}")
        shown = read_token(config.state_dir) if own_terminal() else None  # never into a log or a pipe
        print(f"  dashboard: {dashboard_url(url, shown)}")
        return 0
    from trainforge.server._main import serve

    serve(config)
    return 0


def _server_doctor(args: Any) -> int:
    from trainforge.server.cli.doctor import doctor

    return doctor(args.job_isolation)


def _server_info(args: Any) -> tuple[str, dict[str, Any] | None]:
    """The state directory of ``--state-dir`` (or the default) and its running server's info."""
    from trainforge.server._main import read_server_info

    state_dir = os.path.abspath(os.path.expanduser(args.state_dir or default_state_dir()))
    return state_dir, read_server_info(state_dir)


def _server_status(args: Any) -> int:
    from trainforge.client import Client, ClientError

    state_dir, info = _server_info(args)
    if info is None:
        print(f"no train server running (state directory {state_dir})")
        return 3
    try:
        with Client(info["url"], state_dir=state_dir) as client:
            health = client.health()
            res = client.resources()
    except ClientError as exc:  # the client's own words: the cause (a certificate, a timeout) and what to do
        if _server_process(info) is None:
            print(f"no train server answers at {info['url']} (pid {info.get('pid')} is gone: it was killed); "
                  "`trainforge server start` reattaches its jobs")  # fmt: skip
            return 3
        print(f"the train server runs (pid {info.get('pid')}), but this command cannot talk to it: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print_json({"url": info["url"], "state_dir": state_dir, **health, "resources": res})
        return 0
    jobs = health["jobs"]
    print(f"train server at {info['url']} (pid {health['pid']}, up {health['uptime_s']:.0f} s, state {state_dir})")
    print(f"  jobs: {jobs[JobState.RUNNING] + jobs[JobState.STARTING]} running, {jobs[JobState.STOPPING]} stopping, "
          f"{jobs[JobState.QUEUED]} queued, {jobs[JobState.HELD]} held")  # fmt: skip
    print(f"  free: {_fmt_resources(res['free'])} of {_fmt_resources(res['capacity'])}")
    return 0


def _server_stop(args: Any) -> int:
    import signal

    import psutil

    state_dir, info = _server_info(args)
    if info is None:
        print(f"no train server running (state directory {state_dir})")
        return 0
    if args.stop_jobs:
        from trainforge.client import Client

        with Client(info["url"], state_dir=state_dir) as client:
            for job in client.jobs(list(ACTIVE_STATES), limit=1000):
                stop_saying(client.job(job.id), f"stopping job {job.id} ...")
    proc = _server_process(info)
    try:
        if proc is None:
            raise psutil.NoSuchProcess(info["pid"])
        proc.send_signal(signal.SIGTERM)
    except psutil.NoSuchProcess:
        print(f"the server (pid {info['pid']}) was already gone")
        return 0
    print(f"stopping the train server at {info['url']} (pid {info['pid']}) ...", flush=True)
    deadline = time.monotonic() + 30
    while _running(proc):  # not a child of ours: nothing to block on but its exit
        if time.monotonic() > deadline:
            print(f"trainforge: the server (pid {info['pid']}) did not exit within 30 s of SIGTERM; "
                  f"kill it with `kill -9 {info['pid']}` (its jobs keep running)", file=sys.stderr)  # fmt: skip
            return 1
        time.sleep(0.05)
    print(f"stopped the train server at {info['url']}")
    return 0


def _server_process(info: dict[str, Any]) -> Any:
    """The server process ``server.json`` names (a ``psutil.Process``), or None when it is gone (a
    pid reused since by another process does not count: its start time differs)."""
    import psutil

    try:
        proc = psutil.Process(info["pid"])
        if abs(proc.create_time() - info.get("create_time", 0)) > 0.01:
            return None
        return proc if _running(proc) else None
    except (psutil.Error, KeyError, TypeError):  # gone, or not ours to look at
        return None


def _running(proc: Any) -> bool:
    import psutil

    try:
        return proc.status() != psutil.STATUS_ZOMBIE  # exited, not yet reaped by its parent: stopped
    except psutil.NoSuchProcess:
        return False


# -- jobs -----------------------------------------------------------------------------------------
def _worker_range(text: str) -> tuple[int, int | None]:
    lo, sep, hi = text.partition("-")
    try:
        low, high = int(lo), (int(hi) if sep else None)
    except ValueError:
        raise SystemExit(f"trainforge submit: --workers={text}: give N or MIN-MAX (e.g. 2 or 2-4)") from None
    if low < 1 or (high is not None and high < low):
        raise SystemExit(f"trainforge submit: --workers={text}: give a number >= 1, or MIN-MAX with 1 <= MIN <= MAX "
                         "(e.g. 2 or 2-4)")  # fmt: skip
    return low, high


# The job spec's fields (the API's JobSpecIn) as `submit`'s options, to name a field the server refused.
SPEC_OPTIONS = {
    NUM_WORKERS: "--workers", "workers": "--workers", "max_workers": "--workers (its MAX)",
    "per_worker": "--cpus/--gpus/--memory/--resources", "priority": "--priority", "max_retries": "--max-retries",
    "name": "--name", "env": "--env", "config": "--config", "storage": "--storage", "path": "the script",
    "target": "the module:function", "args": "the script's arguments",
}  # fmt: skip


def _refused(exc: InvalidJobError) -> str:
    """The server's 422 for a submission, each field it names said as the option that set it."""
    if not exc.problems:
        return str(exc)
    return "; ".join(
        f"{SPEC_OPTIONS.get(field.split('.')[0], field)}: {msg}" if field else msg for field, msg in exc.problems
    )


def _submit(args: Any) -> int:
    from trainforge.client import Client
    from trainforge.server._job_view import follow
    from trainforge.server._submission import EARLIER_TRY

    target = args.target
    for flag, amount in (("--cpus", args.cpus), ("--gpus", args.gpus)):
        if not (math.isfinite(amount) and amount >= 0):
            raise SystemExit(f"trainforge submit: {flag}={fmt_number(amount)}: give a number >= 0 per worker (e.g. 0.5"
                             + (f"; each worker counts at least {fmt_number(MIN_CPU_PER_WORKER)} CPU)" if flag == "--cpus" else ")"))  # fmt: skip
    if args.max_retries < 0:
        raise SystemExit(f"trainforge submit: --max-retries={args.max_retries}: give a number >= 0")
    per_worker: dict[str, float] = {"CPU": args.cpus}
    if args.gpus:
        per_worker["GPU"] = args.gpus
    if args.memory:
        per_worker["memory"] = parse_resources(f"memory={args.memory}")["memory"]
    per_worker.update(args.resources or {})
    low, high = _worker_range(args.workers)
    env = {}
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"trainforge submit: --env {item!r}: write KEY=VALUE")
        env[key] = value
    try:
        config = parse_key_values(args.config, "config")
    except ValueError as exc:
        raise SystemExit(f"trainforge submit: {exc}, e.g. --config lr=0.01") from None
    for key, value in config.items():
        if isinstance(value, (dict, list)):
            raise SystemExit(f"trainforge submit: --config {key}={json.dumps(value)}: give one number, true/false or text")
    spec: dict[str, Any] = {
        NUM_WORKERS: low, "per_worker": per_worker, "priority": args.priority, "hold": args.hold,
        "max_retries": args.max_retries, "env": env, "cwd": os.getcwd(), "args": list(args.args),
        "sys_path": [os.getcwd()], "config": config, "preemptible": args.preemptible,
    }  # fmt: skip
    if args.storage:
        spec["storage"] = [os.path.abspath(os.path.expanduser(p)) for p in args.storage]
    if high is not None:
        spec["max_workers"] = high
    if target.endswith(".py") or os.path.isfile(target):
        if not os.path.isfile(target):
            raise SystemExit(f"trainforge submit: no such script {target!r}")
        spec.update(kind="script", path=os.path.abspath(target), name=args.name or os.path.basename(target))
    elif ":" in target:
        spec.update(kind="function", target=target, name=args.name or target)
    else:
        raise SystemExit(f"trainforge submit: {target!r} is neither a script (.py) nor pkg.module:function")
    client = Client(args.address, state_dir=args.state_dir)
    try:
        job = client.submit(spec, on_wait=lambda line: print(f"trainforge submit: {line}", file=sys.stderr, flush=True))
    except InvalidJobError as exc:
        raise SystemExit(f"trainforge submit: {_refused(exc)}") from None
    status = job.submitted or job.status()
    print(f"trainforge: submitted job {job.id} ({status.name}): {status.state}"
          + (f", {status.pending}" if status.pending else "") + (EARLIER_TRY if not job.created else ""), flush=True)  # fmt: skip
    if args.no_wait:
        print(f"  follow it with `trainforge logs {job.id} -f`; stop it with `trainforge stop {job.id}`")
        return 0
    try:
        final = follow(job)
    except KeyboardInterrupt:
        return 130
    if final is None or not final.ended:
        return 130  # detached
    if final.state == JobState.SUCCEEDED:
        return 0
    if final.state == JobState.STOPPED:
        return 130
    return final.exit_code if final.exit_code not in (None, 0) else 1


def _fmt_resources(res: dict[str, float]) -> str:
    return fmt_resources(res, "-")


def _status(args: Any) -> int:
    job = client(args).job(args.job_id).status()
    if args.json:
        print_json(job.raw)
        return 0
    r = job.raw
    print(job.describe())
    req = r["request"]
    workers = f"{req[NUM_WORKERS]}" + (f"-{req['max_workers']}" if req.get("max_workers") else "")
    print(f"  request: {workers} worker(s) x {_fmt_resources(req['per_worker'])}; priority {job.priority}")
    if r.get("grant"):
        print(f"  grant:   {_fmt_resources(r['grant'])} ({r['workers']} workers)"
              + (f", GPUs {','.join(r['gpu_ids'])}" if r.get("gpu_ids") else ""))  # fmt: skip
    if r.get("pid"):
        print(f"  runner:  pid {r['pid']} (attempt {r['attempt']})")
    if r.get("run_path"):
        print(f"  run:     {r['run_path']}")
    if job.error and job.error.strip() != job.reason:
        print(f"  error:   the traceback: `trainforge logs {job.id}` or the job's page (or --json's error)")
    if r.get("last_metrics"):
        last = dict(ordered_metrics(r["last_metrics"]))
        print(f"  metrics: {r['reports']} report(s); last {json.dumps(last, default=str)[:200]}")
    return 0


def _stop(args: Any) -> int:
    job = client(args).job(args.job_id)
    how = "killing" if args.force else "stopping"
    status = stop_saying(job, f"{how} job {args.job_id} ...", grace_s=args.grace, force=args.force)
    print(status.describe())
    return 0


def _hold(args: Any) -> int:
    print(client(args).job(args.job_id).hold().describe())
    return 0


def _release(args: Any) -> int:
    print(client(args).job(args.job_id).release().describe())
    return 0


def _retry(args: Any) -> int:
    print(client(args).job(args.job_id).retry(checkpoint=args.checkpoint).describe())
    return 0


def _priority(args: Any) -> int:
    print(client(args).job(args.job_id).set_priority(args.priority).describe())
    return 0


def _dashboard(args: Any) -> int:
    """The URL that opens the dashboard: the server's, with its token (which the page turns into a
    cookie). Anyone with it can run code as the server's user: do not paste it anywhere public."""
    from trainforge.client import discover
    from trainforge.server._main import dashboard_url

    url, token = discover(args.address, None, args.state_dir)
    print(dashboard_url(url, token) if token else f"{url}/")
    return 0
