"""A member's job that tries what a hostile member would (tests/test_job_isolation.py): each attack
prints one ``RESULT {json}`` line saying what it got, and the test judges it.

    python hostile_job.py snoop STATE_DIR OTHER_JOB_DIR   # the token, state.db, the jobs, another job's files
    python hostile_job.py escape GATE                     # a setsid'd double fork without TRAINFORGE_*, then waits
    python hostile_job.py forkbomb                        # forks until the kernel says no
    python hostile_job.py hog MIB                         # allocates and touches MIB mebibytes
    python hostile_job.py credential                      # what $TRAINFORGE_TOKEN may do
"""

from __future__ import annotations

import json
import os
import sys
import time


def result(**fields: object) -> None:
    print("RESULT " + json.dumps(fields), flush=True)


def attempt(action) -> str:  # type: ignore[no-untyped-def]
    try:
        value = action()
    except Exception as exc:  # noqa: BLE001 - the point is what fails
        return f"refused: {type(exc).__name__}"
    return f"got: {str(value)[:80]}"


def snoop(state_dir: str, other_job: str) -> None:
    def read(path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read(64)

    def write(path: str) -> int:
        with open(path, "wb") as f:
            return f.write(b"swapped by another user's job")

    server_pid = None
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            if b"trainforge.server" in read(f"/proc/{pid}/cmdline") and b"start" in read(f"/proc/{pid}/cmdline"):
                server_pid = pid
        except OSError:
            pass
    result(
        uid=os.getuid(),
        token=attempt(lambda: read(os.path.join(state_dir, "token"))),
        scrape_token=attempt(lambda: read(os.path.join(state_dir, "scrape_token"))),
        state_db=attempt(lambda: read(os.path.join(state_dir, "state.db"))),
        jobs=attempt(lambda: sorted(os.listdir(os.path.join(state_dir, "jobs")))),
        other_list=attempt(lambda: os.listdir(other_job)),
        other_result=attempt(lambda: write(os.path.join(other_job, "result.pkl"))),
        other_new_file=attempt(lambda: write(os.path.join(other_job, "planted.py"))),
        server_seen=server_pid is not None,
        processes=len([p for p in os.listdir("/proc") if p.isdigit()]),
        env_token_kind=os.environ.get("TRAINFORGE_TOKEN", "")[:4],
        home=os.environ.get("HOME"),
    )


def escape(gate: str) -> None:
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINFORGE")}
            code = "import time\nwhile True: time.sleep(1)"
            os.execve(sys.executable, [sys.executable, "-c", code, "escapee", gate], env)  # the gate: a name to find it by
        os._exit(0)
    result(escaped=True)
    while not os.path.exists(gate):  # wait to be stopped
        time.sleep(0.05)


def forkbomb() -> None:
    children = []
    error = None
    try:
        while len(children) < 100_000:
            pid = os.fork()
            if pid == 0:
                time.sleep(60)
                os._exit(0)
            children.append(pid)
    except OSError as exc:
        error = exc.strerror
    result(forked=len(children), stopped_by=error)


def hog(mib: int) -> None:
    chunks = []
    for _ in range(mib):
        chunk = bytearray(1 << 20)
        for i in range(0, len(chunk), 4096):
            chunk[i] = 1
        chunks.append(chunk)
    result(allocated_mib=len(chunks))


def credential() -> None:
    import urllib.error
    import urllib.request

    base = os.environ["TRAINFORGE_ADDRESS"] + "/api/v1"
    headers = {"Authorization": f"Bearer {os.environ['TRAINFORGE_TOKEN']}", "Content-Type": "application/json"}

    def call(method: str, path: str, body: object = None) -> int:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(base + path, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=30) as reply:
                return reply.status
        except urllib.error.HTTPError as exc:
            return exc.code

    whoami = json.loads(urllib.request.urlopen(urllib.request.Request(base + "/whoami", headers=headers)).read())
    result(whoami=whoami, make_admin=call("PATCH", f"/users/{whoami['name']}", {"role": "admin"}),
           list_jobs=call("GET", "/jobs"), token=os.environ["TRAINFORGE_TOKEN"])  # fmt: skip


if __name__ == "__main__":
    attack, args = sys.argv[1], sys.argv[2:]
    {"snoop": snoop, "escape": escape, "forkbomb": forkbomb, "hog": lambda mib: hog(int(mib)),
     "credential": credential}[attack](*args)  # fmt: skip
