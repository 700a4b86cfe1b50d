"""Starting a zygote: where its socket goes (:func:`socket_path`) and the process itself
(:func:`launch`, ``python -m trainforge._internal.zygote``)."""

from __future__ import annotations

import os
import subprocess
import sys

from trainforge._internal.state_files import open_append
from trainforge._internal.zygote.mark import MARK_LEN, MARK_VAR

TMP_PREFIX = "tf-zygote-"  # socket_path()'s private directories: the zygote removes its own at exit
_ROOM = 512  # bytes of command line the zygote keeps free for its children's (see child._set_cmdline)


def socket_path(state_dir: str) -> str:
    """Where a server with this state directory puts its zygote's socket: in it if the path fits a
    Unix socket's 107 bytes, else in a private (0700) temporary directory."""
    path = os.path.join(state_dir, f"zygote-{os.getpid()}.sock")
    if len(path.encode()) <= 100:
        return path
    import tempfile

    return os.path.join(tempfile.mkdtemp(prefix=TMP_PREFIX), "z.sock")


def launch(path: str, *, log_path: str, learn_file: str | None = None, preload: tuple[str, ...] = (),
           env: dict[str, str] | None = None) -> tuple[subprocess.Popen[bytes], int]:  # fmt: skip
    """Start a zygote listening at ``path``, in its own session, output to ``log_path``. Returns the
    process and a pipe fd that gets one line (then EOF) once it serves, or EOF if it will not. Keep
    the process object alive: its stdin is the zygote's lifeline (closed: the zygote winds down)."""
    env = dict(os.environ if env is None else env)
    env[MARK_VAR] = "#" * MARK_LEN
    ready_r, ready_w = os.pipe()
    cmd = [sys.executable, "-m", "trainforge._internal.zygote", path, "--ready-fd", str(ready_w),
           "--preload", ",".join(preload), "--room", " " * _ROOM]  # fmt: skip
    if learn_file:
        cmd += ["--learn", learn_file]
    try:
        with open_append(log_path) as log:
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, env=env,
                                    pass_fds=(ready_w,), start_new_session=True)  # fmt: skip
    except BaseException:
        os.close(ready_r)
        raise
    finally:
        os.close(ready_w)
    return proc, ready_r
