"""Each job's sandbox on this server (:mod:`trainforge.server.isolation.mechanism` chose the mechanism): who
it runs as, what it sees, its cgroup, and the environment it starts with.

What a sandboxed job sees (its :class:`~trainforge._internal.sandbox.Plan`):

- read-only: the system (``/usr``, ``/etc``, ``/opt``, ``/sys``, ...), this Python and its
  packages, trainforge; the job's code (the script's directory, its ``sys_path``);
- writable: its own directory (``<state>/jobs/<id>``), its user's home (``<state>/homes/<user>-<n>``,
  ``$HOME``: runs go to ``~/trainforge_results`` by default), its working directory and the storage
  paths it names (``storage``, which ``trainer.submit()`` fills from ``RunConfig.storage_path``);
- private: ``/tmp``, ``/dev/shm`` (in memory), ``/proc`` (its own processes only);
- nothing else of the state directory (masked; its own directory bound again inside), nor the
  files the server read secrets from (``--token-file``, the TLS key).

As root (``uid``), what it may read or write there is what its uid may (the job directory and home
are given to it); in a user namespace (``userns``, the server's own uid) a path a member names is
lent only if every user of the machine may read it (write it, for a writable one), so a member
cannot name the server's own files.

Its environment is built, not inherited: the server's locale, ``PATH``, Python's start-up variables
and trainforge's settings, then ``HOME``, ``USER``, the server's address and the job's own
credential (:mod:`trainforge.server.team.job_tokens`), then what the submission set.
"""

from __future__ import annotations

import dataclasses
import os
import pwd
import site
import stat
import sys
import sysconfig

from trainforge._internal import sandbox
from trainforge._internal.sandbox import Bind, JobCgroup, Plan
from trainforge._internal.zygote import STARTUP_VARS
from trainforge.client import ACTIVE_STATES
from trainforge.server.isolation.mechanism import Isolation
from trainforge.server.jobs.runner import (
    EVENTS_FILE,
    GRANT_FILE,
    OUTPUT_FILE,
    RESULT_FILE,
    SPEC_FILE,
    TRAINER_FILE,
)
from trainforge.server.store.database import JobRow
from trainforge.server.team.users import UserBook

SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt", "/sys",
               "/run/systemd/resolve")  # fmt: skip
# The server's own environment a job keeps: the locale, where programs are, Python's start-up
# variables (a process forked from the warm pool must match them), thread counts, CUDA and NCCL.
KEPT_VARS = frozenset({"PATH", "LANG", "LANGUAGE", "TZ", "TERM", "PYTHONPATH", *STARTUP_VARS})
KEPT_PREFIXES = ("LC_", "OMP_", "MKL_", "OPENBLAS_", "CUDA_", "NCCL_", "NVIDIA_", "TRAINFORGE_")
# trainforge's variables that are the server's, not a job's: its credentials and where its files are.
DROPPED_VARS = frozenset({
    "TRAINFORGE_TOKEN", "TRAINFORGE_SERVE_TOKEN", "TRAINFORGE_SERVER_DIR", "TRAINFORGE_ADDRESS",
    "TRAINFORGE_STORAGE_PATH", "TRAINFORGE_REGISTRY", "TRAINFORGE_CRASH_AT", sandbox.ENV_PLAN,
    "TRAINFORGE_ZYGOTE", "TRAINFORGE_ZYGOTE_MARK",
})  # fmt: skip
SERVER_FILES = (SPEC_FILE, TRAINER_FILE, GRANT_FILE, OUTPUT_FILE)  # what the server writes in a job's directory
HOMES_DIR = "homes"
ROOT_DIR = "sandbox-root"


@dataclasses.dataclass(frozen=True)
class Identity:
    """Who a user's jobs run as: ``uid``/``gid``/``groups`` (None in a user namespace: the
    server's), ``home`` (their ``$HOME``) and ``user`` (the team user's name, their ``$USER``)."""

    user: str
    home: str
    uid: int | None = None
    gid: int | None = None
    groups: tuple[int, ...] = ()


class JobSandboxes:
    """The sandboxes of the jobs of the server in ``state_dir``: ``isolation`` (the mechanism),
    ``users`` (whose numbers give the uids), ``secret_files`` (masked in every view)."""

    def __init__(self, state_dir: str, isolation: Isolation, users: UserBook, server_id: str,
                 secret_files: tuple[str, ...] = ()):  # fmt: skip
        self.state_dir = state_dir
        self.isolation = isolation
        self.users = users
        self.server_id = server_id
        self.secret_files = tuple(os.path.abspath(p) for p in secret_files)
        self.homes = os.path.join(state_dir, HOMES_DIR)
        self.root = os.path.join(state_dir, ROOT_DIR)
        self._python = python_paths()

    def active(self) -> bool:
        """Jobs start sandboxed now: the server can, and has users (a single-user server does not)."""
        return self.isolation.sandboxes and bool(self.users.list())

    def cgroup(self, job_id: int) -> JobCgroup | None:
        """The job's cgroup (whether or not it exists yet), or None without cgroups."""
        host = self.isolation.cgroups
        return host.group(f"trainforge-{self.server_id}/job-{job_id}") if host is not None else None

    def sweep_cgroups(self) -> int:
        """At start: remove the cgroups of this server's jobs that are not running (a server that
        stopped while they ran, whose jobs then ended without it, left them), killing what is left
        in them. Returns how many."""
        running = {job.id for job in self.users.store.jobs(ACTIVE_STATES)}
        host = self.isolation.cgroups
        names = host.children(f"trainforge-{self.server_id}") if host is not None else []
        stale = [int(n[4:]) for n in names if n.startswith("job-") and n[4:].isdigit() and int(n[4:]) not in running]
        for job_id in stale:
            group = self.cgroup(job_id)
            if group is not None and group.kill(timeout=5):
                group.remove()
        return len(stale)

    # -- who ---------------------------------------------------------------------------------------
    def identity(self, owner: str) -> Identity:
        """Who ``owner``'s jobs run as (``uid`` mode: their own uid; ``userns``: the server's). Their
        home is ``<state>/homes/<name>-<number>``: a user re-added under a removed one's name has
        another number, so neither the removed one's uid nor their home."""
        number = self.users.uid(owner)
        home = os.path.join(self.homes, f"{owner}-{number}")
        if self.isolation.mode != "uid":
            return Identity(owner, home)
        os_user = None if owner == "admin" else self.users.get(owner).os_user
        if os_user:
            account = pwd.getpwnam(os_user)
            groups = tuple(os.getgrouplist(os_user, account.pw_gid))
            return Identity(owner, account.pw_dir, account.pw_uid, account.pw_gid, groups)
        uid = self.isolation.config.uid_base + number
        return Identity(owner, home, uid, uid, (uid,))

    # -- the sandbox -------------------------------------------------------------------------------
    def prepare(self, job: JobRow, job_dir: str, *, memory_max: int | None) -> tuple[Plan, Identity]:
        """Everything the job's first process needs to confine itself: its home and directory made
        its own, its cgroup made (with ``memory_max`` and the pids limit), and the plan (whose ``env``
        the caller fills)."""
        who = self.identity(job.owner)
        owner = (who.uid, who.gid) if who.uid is not None and who.gid is not None else None
        if who.home.startswith(self.homes + os.sep):
            _own_dir(who.home, owner)
        if owner is not None:
            os.makedirs(self.root, mode=0o700, exist_ok=True)
            _give(job_dir, owner)
        group = self.cgroup(job.id)
        if group is not None:
            group.create(memory_max=memory_max, pids_max=self.isolation.config.pids_max)
        binds = self._binds(job, job_dir, who)
        masks = (self.state_dir, *self.secret_files)
        plan = Plan(binds=tuple(binds), masks=masks, uid=who.uid, gid=who.gid, groups=who.groups,
                    cgroups=group.directories if group is not None else (), root=self.root)  # fmt: skip
        return plan, who

    def _binds(self, job: JobRow, job_dir: str, who: Identity) -> list[Bind]:
        spec = job.spec
        lend = self._lend
        binds = [Bind(p) for p in SYSTEM_DIRS if os.path.lexists(p)]
        binds += [Bind(p) for p in self._python]
        code = [e for e in spec.get("sys_path") or [] if isinstance(e, str)]
        if spec.get("path"):
            code.append(os.path.dirname(os.path.abspath(spec["path"])))
        binds += [Bind(p) for p in code if lend(p, write=False)]
        for path in [spec.get("cwd"), *(spec.get("storage") or [])]:
            if isinstance(path, str) and os.path.isabs(path):
                writable = lend(path, write=True)
                if writable or lend(path, write=False):
                    binds.append(Bind(path, writable=writable))
        binds += [Bind(job_dir, writable=True), Bind(who.home, writable=True)]
        return _unique(binds)

    def _lend(self, path: str, *, write: bool) -> bool:
        """Whether a path the member named goes into the view (``write``: writable): as root, any
        existing path (the job's uid decides what it may do there); in a user namespace (the job
        has the server's uid) only what every user of this machine may read (or write)."""
        if not os.path.isabs(path) or not os.path.exists(path):
            return False
        if self.isolation.mode == "uid":
            return True
        return _open_to_all(path, write=write)

    def base_env(self, who: Identity) -> dict[str, str]:
        """The environment a sandboxed job starts from (see the module docstring)."""
        env = server_start_env()
        env.update({"HOME": who.home, "USER": who.user, "LOGNAME": who.user, "TMPDIR": "/tmp"})
        return env


def server_start_env() -> dict[str, str]:
    """What of the server's environment a process it starts for a sandboxed job may have (a fresh
    runner before it is confined, the warm pool): the kept variables, and the server's ``HOME``.
    Never a credential of the server's, nothing of the job's."""
    env = {k: v for k, v in os.environ.items()
           if (k in KEPT_VARS or k.startswith(KEPT_PREFIXES)) and k not in DROPPED_VARS}  # fmt: skip
    if "HOME" in os.environ:
        env["HOME"] = os.environ["HOME"]
    return env


def python_paths() -> list[str]:
    """What this Python needs to run trainforge: its prefixes, its library directories, every
    ``sys.path`` entry but the current directory, the checkout an editable install points to, and
    ``$PYTHONPATH``."""
    import trainforge

    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))}
    paths.add(os.path.dirname(os.path.dirname(os.path.abspath(trainforge.__file__))))
    paths.update(v for k, v in sysconfig.get_paths().items() if k in ("stdlib", "platstdlib", "purelib", "platlib"))
    paths.update(site.getsitepackages())
    cwd = os.getcwd()
    paths.update(p for p in sys.path[1:] if p and p != cwd)
    paths.update(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)
    for name, module in dict(sys.modules).items():  # (a copy in one step: other threads import) setuptools' editable finders: {package: its directory}
        mapping = getattr(module, "MAPPING", None) if name.startswith("__editable__") else None
        if isinstance(mapping, dict):
            paths.update(os.path.dirname(str(p)) for p in mapping.values())
    return sorted(p for p in paths if os.path.isabs(p) and os.path.exists(p))


def _unique(binds: list[Bind]) -> list[Bind]:
    """One bind per path (writable wins)."""
    out: dict[str, Bind] = {}
    for b in binds:
        path = os.path.normpath(b.path)
        if path not in out or b.writable:
            out[path] = Bind(path, b.writable)
    return list(out.values())


def _own_dir(path: str, owner: tuple[int, int] | None) -> None:
    """``path`` as a directory of ``owner``'s (0700), made if missing (its parent the server's)."""
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    if owner is not None:
        os.chown(path, *owner, follow_symlinks=False)


def _give(job_dir: str, owner: tuple[int, int]) -> None:
    """The job's directory and the files the server wrote in it become ``owner``'s. Never a walk of
    the directory (whose contents the job controls): the directory itself and each server file by
    name, none through a link."""
    os.chown(job_dir, *owner, follow_symlinks=False)
    os.chmod(job_dir, 0o700)  # its parent is the server's: the job cannot have put a link here
    for name in (*SERVER_FILES, EVENTS_FILE, RESULT_FILE):
        path = os.path.join(job_dir, name)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        if stat.S_ISREG(st.st_mode) and (st.st_uid, st.st_gid) != owner:
            os.chown(path, *owner, follow_symlinks=False)


def _open_to_all(path: str, *, write: bool) -> bool:
    """Every user may reach ``path`` (each directory above it searchable by others) and read it
    (``write``: write it), by its mode bits."""
    real = os.path.realpath(path)
    parts = real.split(os.sep)
    for i in range(1, len(parts)):
        parent = os.sep.join(parts[:i]) or os.sep
        try:
            if not os.stat(parent).st_mode & stat.S_IXOTH:
                return False
        except OSError:
            return False
    try:
        mode = os.stat(real).st_mode
    except OSError:
        return False
    need = (stat.S_IROTH | (stat.S_IWOTH if write else 0)) | (stat.S_IXOTH if stat.S_ISDIR(mode) else 0)
    return mode & need == need
