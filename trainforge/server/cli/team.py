"""The ``trainforge`` commands of a server a team shares (added by :mod:`trainforge.server.cli.commands`):

    trainforge server users add NAME --role admin|member|viewer [--shares S] [--quota CPU=8,GPU=1]
    trainforge server users list | remove NAME | rotate NAME | set NAME [--role R] [--shares S] [--quota Q | --no-quota]
    trainforge events [--user NAME] [--job ID] [--limit N]      # the audit log: who did what, when, from where
    trainforge whoami

and the options of ``trainforge server start`` for TLS, the scrape token and the team's rules.

``users`` talks to the running server with the state directory's token (the admin's); with no server
running it changes the state directory's store itself. A new or rotated token is printed once: only
its hash is kept.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from trainforge._internal.amounts import fmt_number
from trainforge._internal.constants import default_state_dir
from trainforge._internal.key_values import RESOURCES_METAVAR, argument_type, resources_arg
from trainforge.server.isolation.config import MODES, PIDS_MAX, UID_BASE, IsolationConfig
from trainforge.server.scheduling.policies import DEFAULT_POLICIES, REGISTRY
from trainforge.server.scheduling.team_policy import TeamPolicy, parse_duration

duration_arg = argument_type(parse_duration)


def add_start_options(start: argparse.ArgumentParser) -> None:
    """``server start``'s options for TLS, the scrape token and the team's rules."""
    start.add_argument("--tls-cert", help="serve HTTPS with this certificate chain (PEM; with --tls-key)")
    start.add_argument("--tls-key", help="the certificate's private key (PEM)")
    start.add_argument("--scrape-token-file", help="the token that may read /metrics (default: random, in "
                       "<state-dir>/scrape_token)")  # fmt: skip
    start.add_argument("--half-life", type=duration_arg, default=None,
                       help="fair share: usage halves every this long (default 7d; e.g. 12h, inf)")  # fmt: skip
    start.add_argument("--no-fair-share", dest="fair_share", action="store_false",
                       help="order equal-priority jobs by submission only")  # fmt: skip
    start.add_argument("--no-preemption", dest="preemption", action="store_false",
                       help="never preempt --preemptible jobs for higher-priority ones")  # fmt: skip
    start.add_argument("--preempt-exempt", type=duration_arg, default=None,
                       help="a job runs at least this long before it may be preempted (default 60s)")  # fmt: skip
    start.add_argument("--preempt-cooldown", type=duration_arg, default=None,
                       help="a job is preempted at most once in this long (default 10m)")  # fmt: skip
    start.add_argument("--member-max-priority", type=int, default=None,
                       help="the highest priority a member may give a job (default 0; admins: any)")  # fmt: skip
    start.add_argument("--default-quota", type=resources_arg, metavar=RESOURCES_METAVAR, default=None,
                       help="the quota of users without one of their own, e.g. GPU=2,CPU=16")  # fmt: skip
    start.add_argument("--metrics-per-job", action="store_true", help="/metrics also has one series per running job")
    start.add_argument("--policy", action="append", default=None, metavar="NAME[:ARGS]",
                       help="a scheduling policy beside the default ones (" + ", ".join(DEFAULT_POLICIES) + "), or "
                            "one of them with other settings; repeatable. The policies: " + ", ".join(sorted(REGISTRY))
                            + " (e.g. max_running:2: a user runs at most 2 jobs at once; preemption:EXEMPT_S,COOLDOWN_S)")  # fmt: skip
    start.add_argument("--job-isolation", choices=MODES, default="auto",
                       help="how the jobs of a server with users are kept apart: uid (root: each user's jobs run "
                            "as a uid of their own, in a mount namespace), userns (bubblewrap), auto (default: "
                            "uid as root, else userns), off (trusted users only)")  # fmt: skip
    start.add_argument("--no-job-isolation", dest="job_isolation", action="store_const", const="off",
                       help="run every job as the server's user, seeing its files: for users who trust each other")  # fmt: skip
    start.add_argument("--job-uid-base", type=int, default=UID_BASE,
                       help=f"a user's jobs run as uid BASE+n (n: the user's number; default {UID_BASE})")  # fmt: skip
    start.add_argument("--job-pids-max", type=int, default=PIDS_MAX,
                       help=f"the most tasks (processes and threads) a job may have at once (default {PIDS_MAX})")  # fmt: skip


def start_config(args: Any) -> dict[str, Any]:
    """The ``ServerConfig`` fields these options give."""
    defaults = TeamPolicy()
    team = TeamPolicy(
        half_life_s=args.half_life if args.half_life is not None else defaults.half_life_s,
        fair_share=args.fair_share, preemption=args.preemption,
        preempt_exempt_s=args.preempt_exempt if args.preempt_exempt is not None else defaults.preempt_exempt_s,
        preempt_cooldown_s=args.preempt_cooldown if args.preempt_cooldown is not None else defaults.preempt_cooldown_s,
        member_max_priority=args.member_max_priority if args.member_max_priority is not None else 0,
        default_quota=args.default_quota, metrics_per_job=args.metrics_per_job,
        policies=with_policies(DEFAULT_POLICIES, args.policy or []),
    )  # fmt: skip
    scrape = None
    if args.scrape_token_file:
        with open(args.scrape_token_file) as f:
            scrape = f.read().strip()
    isolation = IsolationConfig(mode=args.job_isolation, uid_base=args.job_uid_base, pids_max=args.job_pids_max)
    secrets = tuple(p for p in (args.scrape_token_file, getattr(args, "token_file", None)) if p)
    return {"tls_cert": args.tls_cert, "tls_key": args.tls_key, "scrape_token": scrape, "team": team,
            "isolation": isolation, "secret_files": secrets}  # fmt: skip


def with_policies(policies: tuple[str, ...], extra: list[str]) -> tuple[str, ...]:
    """``policies`` with each of ``extra`` (``NAME[:ARGS]``) added, or replacing the one of its name."""
    out = list(policies)
    for spec in extra:
        name = spec.partition(":")[0]
        names = [p.partition(":")[0] for p in out]
        if name in names:
            out[names.index(name)] = spec
        else:
            out.append(spec)
    return tuple(out)


def forward(args: Any) -> list[str]:
    """The same options again, for the background server ``--detach`` starts."""
    out: list[str] = []
    for flag, value in (("--tls-cert", args.tls_cert), ("--tls-key", args.tls_key),
                        ("--scrape-token-file", args.scrape_token_file)):  # fmt: skip
        if value:
            out += [flag, os.path.abspath(value)]
    for flag, value in (("--half-life", args.half_life), ("--preempt-exempt", args.preempt_exempt),
                        ("--preempt-cooldown", args.preempt_cooldown)):  # fmt: skip
        if value is not None:
            out += [flag, repr(float(value)) if value != float("inf") else "inf"]
    if args.member_max_priority is not None:
        out += ["--member-max-priority", str(args.member_max_priority)]
    if args.default_quota:
        out += ["--default-quota", ",".join(f"{k}={v}" for k, v in args.default_quota.items())]
    for spec in args.policy or []:
        out += ["--policy", spec]
    out += [flag for flag, on in (("--no-fair-share", not args.fair_share), ("--no-preemption", not args.preemption),
                                  ("--metrics-per-job", args.metrics_per_job)) if on]  # fmt: skip
    out += ["--job-isolation", args.job_isolation, "--job-uid-base", str(args.job_uid_base),
            "--job-pids-max", str(args.job_pids_max)]  # fmt: skip
    return out


def add_commands(sub: Any, server_sub: Any, address: Any) -> None:
    """``server users ...``, ``events`` and ``whoami``; ``address(parser)`` adds --address/--state-dir."""
    users = server_sub.add_parser("users", help="who may use the server, as which role (admin, member, viewer)")
    usub = users.add_subparsers(dest="users_command", required=True)
    add = usub.add_parser("add", help="add a user and print their token (once)")
    add.add_argument("name")
    add.add_argument("--role", required=True, choices=("admin", "member", "viewer"))
    change = usub.add_parser("set", help="change a user's role, fair-share weight or quota")
    change.add_argument("name")
    change.add_argument("--role", choices=("admin", "member", "viewer"))
    for p in (add, change):
        p.add_argument("--shares", type=float, help="weight in fair share (default 1)")
        p.add_argument("--quota", type=resources_arg, metavar=RESOURCES_METAVAR, help="what their jobs may hold at once, e.g. GPU=2,CPU=16")
        p.add_argument("--os-user", help="an account of this machine their jobs run as (a server running as root; "
                       "default: a uid of their own, with a home in the state directory)")  # fmt: skip
    change.add_argument("--no-quota", action="store_true", help="remove their quota")
    change.add_argument("--no-os-user", action="store_true", help="their jobs run as a uid of their own again")
    listing = usub.add_parser("list", help="the users, their roles, shares and quotas")
    listing.add_argument("--json", action="store_true", help="print JSON")
    remove = usub.add_parser("remove", help="remove a user (their token stops working; their jobs stay, under a "
                                            "name no user can have)")
    remove.add_argument("name")
    rotate = usub.add_parser("rotate", help="give a user a new token (printed once; the old one stops working)")
    rotate.add_argument("name")
    for p in (add, change, listing, remove, rotate):
        address(p)
        p.set_defaults(func=_users)
    events = sub.add_parser("events", help="the audit log: who changed what, when, from where")
    events.add_argument("--user", help="only this user's requests")
    events.add_argument("--job", type=int, help="only requests on this job")
    events.add_argument("--limit", type=int, default=50, help="the newest N (default 50)")
    events.add_argument("--json", action="store_true", help="print JSON")
    address(events)
    events.set_defaults(func=_events)
    whoami = sub.add_parser("whoami", help="who your token signs in as, your quota and what your jobs hold")
    address(whoami)
    whoami.set_defaults(func=_whoami)


# -- the users: through the running server, or the state directory's store when none runs ------------
class _Direct:
    """``users`` without a server: the state directory's store and its UserBook."""

    def __init__(self, state_dir: str):
        from trainforge.server.store.database import JobStore
        from trainforge.server.team.users import UserBook

        os.makedirs(state_dir, mode=0o700, exist_ok=True)
        self.store = JobStore(os.path.join(state_dir, "state.db"))
        self.book = UserBook(self.store)

    def request(self, method: str, path: str, *, json: Any = None, params: Any = None) -> Any:
        book, parts = self.book, path.strip("/").split("/")
        body = json or {}
        if method == "GET":
            return [u.public() for u in book.list()]
        if method == "POST" and len(parts) == 1:
            user, token = book.add(body["name"], body["role"], shares=body.get("shares", 1.0), quota=body.get("quota"),
                                   os_user=body.get("os_user"))  # fmt: skip
            return {"user": user.public(), "token": token}
        if method == "POST":
            user, token = book.rotate(parts[1])
            return {"user": user.public(), "token": token}
        if method == "PATCH":
            quota = body.get("quota")
            os_user = body.get("os_user")
            return book.update(parts[1], role=body.get("role"), shares=body.get("shares"), quota=quota or None,
                               clear_quota=quota == {}, os_user=os_user or None,
                               clear_os_user=os_user == "").public()  # fmt: skip
        owner, jobs = book.remove(parts[1])
        return {"name": parts[1], "jobs_owner": owner, "jobs": jobs}

    def close(self) -> None:
        self.store.close()


def _connect(args: Any) -> Any:
    """The running server's client, or (none runs on this machine's state directory) the store."""
    from trainforge.client import Client, ServerNotFoundError
    from trainforge.server._main import check_not_running

    try:
        client = Client(args.address, state_dir=args.state_dir)
        client.request("GET", "/whoami")
        return client
    except ServerNotFoundError:
        if args.address:
            raise
    state_dir = os.path.abspath(os.path.expanduser(args.state_dir or default_state_dir()))
    check_not_running(state_dir)  # one answers nothing but holds the directory: say so
    return _Direct(state_dir)


def _users(args: Any) -> int:
    target = _connect(args)
    try:
        return _users_with(target, args)
    finally:
        if isinstance(target, _Direct):
            target.close()


def _users_with(target: Any, args: Any) -> int:
    verb = args.users_command
    if verb == "list":
        users = target.request("GET", "/users")
        if args.json:
            print(json.dumps(users, indent=2))
            return 0
        print(f"{'NAME':<20} {'ROLE':<7} {'SHARES':>6}  QUOTA")
        print(f"{'admin':<20} {'admin':<7} {1:>6g}  -   (built in: the state directory's token)")
        for u in users:
            quota = ",".join(f"{k}={fmt_number(v)}" for k, v in (u["quota"] or {}).items()) or "-"
            print(f"{u['name']:<20} {u['role']:<7} {u['shares']:>6g}  {quota}")
        return 0
    if verb == "add":
        body = {"name": args.name, "role": args.role, "shares": args.shares or 1.0, "quota": args.quota,
                "os_user": args.os_user}
        reply = target.request("POST", "/users", json=body)
        _print_token(target, reply, f"added {args.name} ({args.role})")
        return 0
    if verb == "rotate":
        reply = target.request("POST", f"/users/{args.name}/rotate")
        _print_token(target, reply, f"rotated {args.name}'s token (the old one no longer works)")
        return 0
    if verb == "set":
        body = {"role": args.role, "shares": args.shares, "quota": {} if args.no_quota else args.quota,
                "os_user": "" if args.no_os_user else args.os_user}
        user = target.request("PATCH", f"/users/{args.name}", json={k: v for k, v in body.items() if v is not None})
        quota = ",".join(f"{k}={fmt_number(v)}" for k, v in (user["quota"] or {}).items()) or "none"
        print(f"{user['name']}: {user['role']}, shares {fmt_number(user['shares'])}, quota {quota}")
        return 0
    gone = target.request("DELETE", f"/users/{args.name}")
    print(f"removed {args.name}: their token no longer works; their {gone['jobs']} job(s) stay, owned by "
          f"{gone['jobs_owner']!r}, a name no user can have (only admins may change them)")  # fmt: skip
    return 0


def _print_token(target: Any, reply: dict[str, Any], what: str) -> None:
    token = reply["token"]
    where = getattr(target, "address", None)
    print(f"{what}. Their token, shown this once (only its hash is kept):\n\n    {token}\n")
    print(f"They use it as `export TRAINFORGE_TOKEN={token}`" + (f" (with TRAINFORGE_ADDRESS={where})" if where else ""))
    if where:
        print(f"and open the dashboard at {where}/?token={token}")


# -- the audit log, and who am I -----------------------------------------------------------------------
def _events(args: Any) -> int:
    from trainforge.client import Client

    rows = Client(args.address, state_dir=args.state_dir).request(
        "GET", "/audit", params={"user": args.user, "job": args.job, "limit": args.limit})  # fmt: skip
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'SEQ':>6}  {'WHEN':<19}  {'USER':<14} {'ACTION':<16} {'STATUS':>6}  {'FROM':<15} REQUEST")
    for r in reversed(rows):  # oldest first, like a log
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["ts"]))
        line = (f"{r['seq']:>6}  {when:<19}  {r['user'][:14]:<14} {r['action'][:16]:<16} {r['status']:>6}  "
                f"{(r['client'] or '-')[:15]:<15} {r['method']} {r['path']}")  # fmt: skip
        if r.get("detail") and r["status"] >= 400:
            line += f"  ({r['detail'][:120]})"
        print(line)
    if not rows:
        print("(nothing yet)", file=sys.stderr)
    return 0


def _whoami(args: Any) -> int:
    from trainforge.client import Client

    me = Client(args.address, state_dir=args.state_dir).request("GET", "/whoami")
    quota = ",".join(f"{k}={fmt_number(v)}" for k, v in (me.get("quota") or {}).items()) or "none"
    holds = ",".join(f"{k}={fmt_number(v)}" for k, v in (me.get("holds") or {}).items()) or "nothing"
    print(f"{me['name']} ({me['role']}); quota {quota}; your running jobs hold {holds}")
    return 0
