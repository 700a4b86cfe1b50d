"""The train server CLI's listings (added by :mod:`trainforge.server.cli.commands`): ``jobs``, ``queue``,
``resources`` and ``logs``. Names are shown whole, or cut in the middle where longer than a column
(:mod:`trainforge._internal.display`); ``jobs`` says how many it left out."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from trainforge._internal.amounts import fmt_resources
from trainforge._internal.display import column_width, cut_middle
from trainforge._internal.trainer_job import NUM_WORKERS


def client(args: Any) -> Any:
    from trainforge.client import Client

    return Client(args.address, state_dir=args.state_dir)


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, default=str))


def _ago(t: float | None) -> str:
    if t is None:
        return "-"
    s = time.time() - t
    return f"{s:.0f}s" if s < 120 else f"{s / 60:.0f}m" if s < 7200 else f"{s / 3600:.1f}h"


NAME_WIDTH = 48  # longer names are cut in the middle (Tune trials differ at their ends)


def _list_jobs(api: Any, states: list[str] | None, limit: int | None) -> tuple[list[Any], int | None]:
    """The newest ``limit`` jobs (every one for None) in ``states``, and how many more there are
    (None: more, but the server does not count them)."""
    from trainforge.client import JobStatus

    jobs: list[Any] = []
    before: int | None = None
    total: int | None = None
    while True:
        params: dict[str, Any] = {"limit": 1000 if limit is None else min(1000, limit - len(jobs))}
        if states:
            params["state"] = states
        if before is not None:
            params["before"] = before
        else:
            params["total"] = True  # counted once, with the first page
        page = api.request("GET", "/jobs", params=params)
        total = page.get("total") if before is None else total
        jobs += [JobStatus.from_json(j) for j in page["jobs"]]
        before = page["next_before"]
        if before is None or (limit is not None and len(jobs) >= limit):
            break
    if before is None:
        return jobs, 0
    return jobs, (total - len(jobs) if total is not None else None)


def _name_column(names: list[str]) -> tuple[int, Any]:
    """The NAME column's width (its widest name, at most NAME_WIDTH) and how a name fills it."""
    width = column_width(names, "NAME", NAME_WIDTH)
    return width, lambda name: f"{cut_middle(name, width):<{width}}"


def jobs_command(args: Any) -> int:
    if args.limit < 1 and not args.all:
        raise SystemExit(f"trainforge jobs: --limit {args.limit}: give N >= 1 (or --all for every job)")
    jobs, more = _list_jobs(client(args), args.state, None if args.all else args.limit)
    if args.json:
        print_json([j.raw for j in jobs])
    else:
        width, name = _name_column([j.name for j in jobs])
        print(f"{'ID':>5}  {'STATE':<10} {'PRIO':>4}  {'WORKERS':>7}  {'SUBMITTED':>9}  {'OWNER':<12} "
              f"{'NAME':<{width}} REASON / ERROR")  # fmt: skip
        for j in jobs:
            workers = j.raw.get("workers") or j.raw["request"][NUM_WORKERS]
            note = j.pending or j.reason or ""
            print(f"{j.id:>5}  {j.state:<10} {j.priority:>4}  {workers:>7}  {_ago(j.raw['submitted_at']):>9}  "
                  f"{j.raw.get('owner', '')[:12]:<12} {name(j.name)} {note}".rstrip())  # fmt: skip
    if more != 0:  # on stderr: the table (or JSON) on stdout stays whole for a pipe
        sys.stdout.flush()  # (and before it, where both go to one terminal or file)
        count = "more jobs" if more is None else f"{more} more job{'s' if more != 1 else ''}"
        print(f"... {count} not shown: use --limit N or --all", file=sys.stderr)
    return 0


def queue_command(args: Any) -> int:
    entries = client(args).queue()
    if args.json:
        print_json(entries)
        return 0
    width, name = _name_column([e["name"] for e in entries])
    print(f"{'POS':>4}  {'ID':>5}  {'PRIO':>4}  {'NAME':<{width}} REASON")
    for e in entries:
        pos = e["pending"]["position"]
        print(f"{pos if pos is not None else '-':>4}  {e['job_id']:>5}  {e['priority']:>4}  {name(e['name'])} "
              f"{e['pending']['text']}")  # fmt: skip
    return 0


def resources_command(args: Any) -> int:
    res = client(args).resources()
    if args.json:
        print_json(res)
        return 0
    print(f"capacity: {fmt_resources(res['capacity'], '-')}")
    print(f"granted:  {fmt_resources(res['granted'], '-')}")
    print(f"free:     {fmt_resources(res['free'], '-')}")
    for job_id, g in sorted(res["jobs"].items(), key=lambda kv: int(kv[0])):
        gpus = f" GPUs {','.join(g['gpu_ids'])}" if g["gpu_ids"] else ""
        print(f"  job {job_id}: {fmt_resources(g['grant'])}{gpus}")
    if res.get("policies"):
        print("scheduling policies:")
        for policy in res["policies"]:
            print(f"  {policy['name']}: {policy['description']}")
    return 0


def logs_command(args: Any) -> int:
    job = client(args).job(args.job_id)
    shown = False
    try:
        for text in job.logs(follow=args.follow, tail=args.tail, rank=args.rank):
            sys.stdout.write(text)
            sys.stdout.flush()
            shown = shown or bool(text)
    except KeyboardInterrupt:
        return 130
    if args.rank is not None and not shown:
        print(f"trainforge: {_no_rank_log(job, args.rank)}", file=sys.stderr)
        return 1
    return 0


def _no_rank_log(job: Any, rank: int) -> str:
    """Why ``logs --rank N`` showed nothing, which ranks have logs, and what to do."""
    status = job.status()
    whole = f"`trainforge logs {job.id}` shows the job's output, every rank's lines in it"
    run_path = status.raw.get("run_path")
    if not run_path:
        why = "it ran no fit() (each rank logs into its run's directory)" if status.ended else "no run of it has started yet"
        return f"job {job.id} ({status.state}) has no rank logs: {why}; {whole}"
    workers = status.raw.get("workers") or (status.raw.get("request") or {}).get(NUM_WORKERS) or 1
    logged = []
    for r in range(min(max(int(workers), rank + 1), 256)):
        chunk = job.client.request("GET", f"/jobs/{job.id}/logs", params={"rank": r, "tail": 0})
        if chunk["size"]:
            logged.append(r)
    if not logged:
        return f"job {job.id} has no rank logs in {run_path}/logs (nothing printed by its workers there); {whole}"
    ranks = ", ".join(map(str, logged))
    return (f"job {job.id} has no rank-{rank} log (ranks with logs: {ranks}): try `trainforge logs {job.id} "
            f"--rank {logged[0]}`; {whole}")  # fmt: skip
