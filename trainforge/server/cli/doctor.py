"""``trainforge server doctor``: what this host offers a server's jobs, checked by trying.

It says which isolation a server started here would use (and why, or what is missing), which cgroup
hierarchy plays which role, and then runs one sandboxed process the way a job's runner starts
fresh: in a throw-away state directory holding a fake token, it must come up as another user (as
root) with no capability, see its own directory but not the token, and only its own processes.
Exit code 0 when that holds (or when isolation is off by choice), 1 otherwise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

from trainforge._internal import sandbox
from trainforge._internal.sandbox import Bind, Plan
from trainforge.server.isolation.config import IsolationConfig
from trainforge.server.isolation.mechanism import Isolation
from trainforge.server.jobs.sandboxes import SYSTEM_DIRS, python_paths, server_start_env

_PROBE = """
import json, os, sys
from trainforge._internal.sandbox import enter_from_environment
enter_from_environment()
state, job = sys.argv[1], sys.argv[2]
def readable(path):
    try:
        open(path).read()
        return True
    except OSError:
        return False
caps = [l.split()[1] for l in open("/proc/self/status") if l.startswith("CapEff:")][0]
print(json.dumps({"uid": os.getuid(), "caps": int(caps, 16), "token": readable(os.path.join(state, "token")),
                  "own": os.path.isdir(job), "processes": len([p for p in os.listdir("/proc") if p.isdigit()])}))
"""


def check(isolation: Isolation) -> tuple[bool, str]:
    """Run one sandboxed process (see the module docstring): (it held, what it saw)."""
    if not isolation.sandboxes:
        return isolation.config.mode == "off", "no sandbox to check"
    with tempfile.TemporaryDirectory(prefix="tf-doctor-") as state:
        os.chmod(state, 0o700)
        job = os.path.join(state, "jobs", "1")
        os.makedirs(job, mode=0o700)
        with open(os.path.join(state, "token"), "w") as f:
            f.write("not for jobs")
        root = os.path.join(state, "sandbox-root")
        os.mkdir(root, 0o700)
        uid = isolation.config.uid_base + 999_999 if isolation.mode == "uid" else None
        if uid is not None:
            os.chown(job, uid, uid)
        binds = [Bind(p) for p in (*SYSTEM_DIRS, *python_paths()) if os.path.lexists(p)] + [Bind(job, True)]
        plan = Plan(binds=tuple(binds), masks=(state,), uid=uid, gid=uid, groups=(uid,) if uid else (), root=root,
                    env=server_start_env())  # fmt: skip
        argv = [sys.executable, "-P", "-s", "-c", _PROBE, state, job]
        if uid is None:
            argv = sandbox.bwrap_command(plan, argv, chdir=job)
        t0 = time.perf_counter()
        proc = subprocess.run(argv, env={**server_start_env(), sandbox.ENV_PLAN: plan.to_json()}, cwd="/",
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        took = (time.perf_counter() - t0) * 1e3
    if proc.returncode != 0:
        return False, f"the sandboxed process failed (exit {proc.returncode}): {proc.stderr.strip()[-500:]}"
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    held = not seen["token"] and seen["own"] and seen["caps"] == 0 and seen["processes"] <= 2
    if uid is not None:
        held = held and seen["uid"] == uid
    what = (f"a sandboxed process started in {took:.0f} ms as uid {seen['uid']} with "
            f"{'no capability' if not seen['caps'] else 'capabilities ' + hex(seen['caps'])}; it "
            f"{'could not' if not seen['token'] else 'COULD'} read the state directory's token, "
            f"{'saw' if seen['own'] else 'did NOT see'} its own directory and {seen['processes']} process(es)")  # fmt: skip
    return held, what


def doctor(mode: str = "auto") -> int:
    isolation = Isolation.choose(IsolationConfig(mode=mode))
    for line in isolation.lines():
        print(line)
    held, what = check(isolation)
    print(f"check: {what}: {'ok' if held else 'FAILED'}")
    return 0 if held else 1
