"""The documentation (docs/, README.md, mkdocs.yml) as tests: docs that cannot rot.

- Every fenced code block is labelled. A ``python`` or ``bash`` block runs in a test, in page order, unless
  the line before it is ``<!-- skip: next "the reason" -->`` (Sybil's skip directive; the reason is
  required). One test per page runs its blocks (Sybil parses them): Python in one namespace per page, in
  this process (so this suite's fixtures isolate it: storage, registry and server directories in
  ``tmp_path``, no leftover processes), with the current directory a copy of the checkout; shell blocks
  one after another in one ``bash`` session per page, in that copy, with ``.venv/bin`` first on ``PATH``
  (as after ``source .venv/bin/activate``), stopping at the first failing command (``set -e``). A page
  that leaves a process behind fails (every process its shell started carries a marker variable).
- ``scripts/gen_docs.py --check``: the API pages, the benchmark pages and mkdocs.yml's generated nav are
  what the generator writes now (from each ``__all__`` and ``bench/results/*.json``).
- ``mkdocs build --strict``: no broken link, missing anchor or page left out of the nav.
- The README stays short, its links into the docs resolve (page and anchor), and its code blocks are
  docs blocks (so they run there); links to the docs in the CLI's help name pages and anchors that exist.
"""

from __future__ import annotations

import importlib.util
import os
import queue
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import unittest
import uuid
from pathlib import Path
from typing import Any

import pytest

from trainforge._testing.wait import wait_until

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
README = REPO / "README.md"
VENV_BIN = Path(sys.executable).parent

RUNNABLE = ("python", "bash")
# Labels of blocks that are not code to run: output, data, configuration, pictures.
NOT_RUN = {"text", "json", "yaml", "toml", "ini", "csv", "html", "diff"}
FENCE = re.compile(r"^(?P<indent>[ \t]*(?:[-*+]|\d+[.)])?[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
SKIP = re.compile(r"<!--\s*skip:\s*(?P<action>\w+)(?P<rest>.*?)-->", re.DOTALL)
BLOCK_TIMEOUT_S = 240  # one block (the tutorial's tuning is the longest)
# Pages whose commands use fixed ports (the defaults a reader gets). Where the machine allows it
# (`unshare -rn`: an unprivileged user and network namespace), every page's shell runs with a loopback
# of its own, so those ports cannot collide with anything else on the machine, this test run's other
# tests included. Elsewhere these pages run in the serial lane (scripts/test.sh: `-m serial`) and wait
# for their ports to be free.
FIXED_PORTS = {"tutorial.md": (8270, 8280), "serving.md": (8300,)}
PORT_WAIT_S = 30


def _own_network_available() -> bool:
    if not (shutil.which("unshare") and shutil.which("ip")):
        return False
    try:
        return subprocess.run(["unshare", "-rn", "ip", "link", "set", "lo", "up"], capture_output=True,
                              timeout=10).returncode == 0  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return False


OWN_NETWORK = _own_network_available()
MARKER_ENV = "TRAINFORGE_DOCS_PAGE"


def doc_pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO))


LOOKS_LIKE_CODE = re.compile(
    r"(\$ |>>> |(trainforge|python3?|pip|bash|curl|git|cd|export|source) |import \w|from [\w.]+ import )"
)


def _fence_body(path: Path, fence_line: int) -> list[str]:
    """The lines inside the fence that opens at ``fence_line``."""
    lines = path.read_text().splitlines()
    body = []
    for line in lines[fence_line:]:
        if FENCE.match(line):
            break
        body.append(line)
    return body


def fences(path: Path) -> list[tuple[int, str, str]]:
    """``(line, info string, indent)`` of every opening fence of the page (1-based lines)."""
    found: list[tuple[int, str, str]] = []
    open_fence: str | None = None
    for number, line in enumerate(path.read_text().splitlines(), 1):
        m = FENCE.match(line)
        if not m:
            continue
        if open_fence is None:
            open_fence = m.group("fence")
            found.append((number, m.group("info").strip(), m.group("indent")))
        else:
            fence = m.group("fence")
            if fence[0] == open_fence[0] and len(fence) >= len(open_fence) and not m.group("info").strip():
                open_fence = None
    return found


# ----------------------------------------------------------------------------------------------------
# Sybil: parse a page into examples; bash blocks go to the page's shell session.
# ----------------------------------------------------------------------------------------------------
class BlockFailed(AssertionError):
    pass


class BashSession:
    """One ``bash`` for a page's shell blocks, as a reader's terminal: ``cd``, variables and background
    jobs (``cmd &`` ... ``kill %1``) carry from block to block. Each block is sourced from a file with
    stdin from /dev/null; ``set -eo pipefail`` ends the session at the first failing command."""

    def __init__(self, cwd: Path, env: dict[str, str], *, own_network: bool = False) -> None:
        self.cwd = cwd
        self.blocks = cwd / ".docs-blocks"
        self.blocks.mkdir()
        self.output: list[str] = []
        self._lines: queue.Queue[str | None] = queue.Queue()
        argv = ["bash", "--noprofile", "--norc"]
        if own_network:  # a network namespace whose loopback is this session's alone
            argv = ["unshare", "-rn", "bash", "--noprofile", "--norc", "-c",
                    "ip link set lo up && exec bash --noprofile --norc"]  # fmt: skip
        self.proc = subprocess.Popen(argv, cwd=cwd, env=env, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     start_new_session=True)  # fmt: skip
        threading.Thread(target=self._read, daemon=True).start()
        self._send("set -eo pipefail\n")

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text)
        self.proc.stdin.flush()

    def run(self, source: str, where: str) -> None:
        n = len(list(self.blocks.iterdir()))
        script = self.blocks / f"block_{n}.sh"
        script.write_text(source)
        done = f"__docs_block_{uuid.uuid4().hex}_done__"
        self.output.append(f"$ # {where}\n")
        try:
            self._send(f"source '{script}' </dev/null\necho {done}\n")
        except BrokenPipeError:
            raise BlockFailed(f"{where}: the shell session had already ended\n{self.tail()}") from None
        deadline = time.monotonic() + BLOCK_TIMEOUT_S
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise BlockFailed(f"{where}: still running after {BLOCK_TIMEOUT_S} s\n{self.tail()}") from None
            if line is None:
                code = self.proc.wait()
                raise BlockFailed(f"{where}: a command failed (the shell exited with {code})\n{self.tail()}")
            if done in line:  # the block's last output line may lack its newline (curl's does)
                before = line[: line.index(done)]
                if before:
                    self.output.append(before + "\n")
                return
            self.output.append(line)

    def tail(self, lines: int = 60) -> str:
        return "".join(self.output[-lines:])

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self._send("exit 0\n")
            except BrokenPipeError:
                pass
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                pass
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()
        try:  # the session's process group: background jobs a page forgot
            os.killpg(self.proc.pid, 9)
        except ProcessLookupError:
            pass


def _bash_evaluator(example: Any) -> None:
    session: BashSession = example.namespace["__docs_bash__"]
    session.run(str(example.parsed), f"{_rel(Path(example.path))}:{example.line}")


def parse(path: Path) -> Any:
    try:
        from sybil import Sybil
        from sybil.parsers.markdown import CodeBlockParser, PythonCodeBlockParser, SkipParser
    except ImportError as exc:  # a missing dev package is a failure, never a skip
        pytest.fail(f"{exc}: the docs' tests need sybil (requirements-dev.txt): run `bash scripts/setup.sh dev`")

    sybil = Sybil(parsers=[PythonCodeBlockParser(), CodeBlockParser(language="bash", evaluator=_bash_evaluator),
                           SkipParser()])  # fmt: skip
    return sybil.parse(path)


def runnable_pages() -> list[Path]:
    """Pages with at least one python/bash block that is not skipped."""
    pages = []
    for page in doc_pages():
        text = page.read_text()
        lines = text.splitlines()
        for number, info, _ in fences(page):
            if info in RUNNABLE and not _skipped(lines, number):
                pages.append(page)
                break
    return pages


def _skipped(lines: list[str], fence_line: int) -> bool:
    """Whether a skip directive governs the fence opening at ``fence_line`` (``next`` just before it, or
    inside a ``start``/``end`` span)."""
    text = "\n".join(lines[: fence_line - 1])
    last = None
    for m in SKIP.finditer(text):
        last = m
    if last is None:
        return False
    action = last.group("action")
    if action == "start":
        return True
    if action == "next":  # only blank lines between the directive and the fence
        return not text[last.end():].strip()
    return False


# ----------------------------------------------------------------------------------------------------
# The checks.
# ----------------------------------------------------------------------------------------------------
def test_every_code_block_is_labelled_and_runs_or_says_why_not():
    """python/bash blocks must be exactly ```python / ```bash (so Sybil finds them), every other block says
    what it is (text, json, ...), and every skip directive gives its reason."""
    problems = []
    for page in [*doc_pages(), README]:
        text = page.read_text()
        parsed_lines = {ex.line for ex in parse(page)} if page != README else set()
        for number, info, indent in fences(page):
            where = f"{_rel(page)}:{number}"
            lang = info.split()[0] if info else ""
            if not lang:  # a picture or output; a command in it would dodge the tests
                body = _fence_body(page, number)
                first = next((line.strip() for line in body if line.strip()), "")
                if LOOKS_LIKE_CODE.match(first):
                    problems.append(f"{where}: this unlabelled block looks like code: label it python or bash "
                                    "(it runs), or text")  # fmt: skip
            elif lang in RUNNABLE and info != lang:
                problems.append(f"{where}: write ```{lang} alone (Sybil runs only plain ```{lang} blocks)")
            elif lang not in RUNNABLE and lang not in NOT_RUN:
                problems.append(f"{where}: label {lang!r}: use python or bash for code (they run), or one of "
                                f"{sorted(NOT_RUN)}")  # fmt: skip
            elif lang in RUNNABLE and page != README and number not in parsed_lines:
                problems.append(f"{where}: Sybil does not see this block (indented {indent!r}?)")
        for m in SKIP.finditer(text):
            line = text[: m.start()].count("\n") + 1
            reason = m.group("rest").strip()
            if m.group("action") in ("next", "start") and not re.fullmatch(r'"[^"]{3,}"', reason):
                problems.append(f'{_rel(page)}:{line}: give the reason: <!-- skip: {m.group("action")} "why" -->')
    assert not problems, "\n".join(problems)


def test_readme_code_blocks_are_in_the_docs():
    """The README's commands are the docs' (where they run): each README python/bash block appears
    verbatim in a docs page, so it is tested there."""
    docs_text = "\n".join(p.read_text() for p in doc_pages())
    missing = []
    for number, info, _ in fences(README):
        if info not in RUNNABLE:
            continue
        body = _fence_body(README, number)
        if "\n".join(body) not in docs_text:
            missing.append(f"README.md:{number}")
    assert not missing, f"README blocks not found verbatim in any docs page (so not tested): {missing}"


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def clone_checkout(dest: Path) -> Path:
    """A copy of the checkout as a fresh clone would have it (tracked and untracked-but-not-ignored
    files), with the checkout's .venv linked in."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=REPO, check=True,
                                capture_output=True).stdout.decode().split("\0")  # fmt: skip
        files = [f for f in listed if f and (REPO / f).is_file()]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: everything but build output
        skip = {".git", ".venv", "__pycache__", "site", ".pytest_cache", ".ruff_cache", ".mypy_cache"}
        files = [str(p.relative_to(REPO)) for p in REPO.rglob("*")
                 if p.is_file() and not skip & set(p.relative_to(REPO).parts)]  # fmt: skip
    for f in files:
        target = dest / f
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / f, target)
    (dest / ".venv").symlink_to(REPO / ".venv")
    return dest


# The tutorial trains 8 small runs end to end (about a minute on an idle 2-core machine): more than the
# suite's per-test timeout allows on a busy one.
TIMEOUTS_S = {"tutorial.md": 600}


def _page_params() -> list[Any]:
    params = []
    for page in runnable_pages():
        name = str(page.relative_to(DOCS))
        marks = [pytest.mark.serial] if name in FIXED_PORTS and not OWN_NETWORK else []
        if name in TIMEOUTS_S:
            marks.append(pytest.mark.timeout(TIMEOUTS_S[name]))
        params.append(pytest.param(page, id=name, marks=marks))
    return params


@pytest.mark.slow
@pytest.mark.parametrize("page", _page_params())
def test_page_code_runs(page: Path, tmp_path, monkeypatch):
    """Every python and bash block of the page that is not skipped runs, in page order, and the page
    leaves no process behind."""
    from trainforge._testing.procs import kill_procs, processes_with_env

    ports = () if OWN_NETWORK else FIXED_PORTS.get(str(page.relative_to(DOCS)), ())
    try:
        wait_until(lambda: all(_port_free(p) for p in ports), PORT_WAIT_S, "the page's default ports", interval=1)
    except TimeoutError:
        busy = [p for p in ports if not _port_free(p)]
        pytest.fail(f"{_rel(page)} uses the default ports {busy}, which something on this machine holds "
                    "(a trainforge server of yours? `trainforge server stop`); free them and rerun")  # fmt: skip
    clone = clone_checkout(tmp_path / "clone")
    before = _files(clone)
    monkeypatch.chdir(clone)
    marker = uuid.uuid4().hex
    monkeypatch.setenv(MARKER_ENV, marker)  # so processes the page's python blocks start carry it too
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}", MARKER_ENV: marker,
           "NO_COLOR": "1"}  # fmt: skip
    env.pop("VIRTUAL_ENV", None)
    document = parse(page)
    # Only the pages with fixed ports get a network of their own: another page's shell may talk to a server
    # its python blocks started (on a free port, in this network).
    own_network = OWN_NETWORK and str(page.relative_to(DOCS)) in FIXED_PORTS
    session = BashSession(clone, env, own_network=own_network)
    document.namespace["__docs_bash__"] = session
    ran, skipped = 0, []
    failure: BaseException | None = None
    try:
        for example in document:
            try:
                example.evaluate()
            except unittest.SkipTest as reason:
                skipped.append(f"{example.line}: {reason}")
                continue
            if not isinstance(example.parsed, tuple):  # a code block, not a skip directive
                ran += 1
    except BaseException as exc:  # noqa: BLE001 (reported below, after the clean-up)
        failure = exc
    finally:
        session.close()
        try:  # a stopping server takes a moment
            wait_until(lambda: not processes_with_env(MARKER_ENV, marker), 10, "the page's processes to end")
        except TimeoutError:
            pass  # killed, and reported, below
        killed = kill_procs(processes_with_env(MARKER_ENV, marker))
    if failure is not None:
        if isinstance(failure, BlockFailed) or not isinstance(failure, Exception):  # Ctrl-C, a timeout
            raise failure
        raise AssertionError(f"{_rel(page)}: a python block failed: {failure!r}\nshell output so far:\n"
                             f"{session.tail()}") from failure  # fmt: skip
    print(f"{_rel(page)}: {ran} block(s) ran, {len(skipped)} skipped; the shell's output:\n{session.tail(10**6)}")
    assert not killed, f"{_rel(page)} left processes behind (killed now): {killed}"
    assert ran, f"{_rel(page)}: no block ran"
    if str(page.relative_to(DOCS)) in LEAVES_NOTHING:
        left = _not_ignored(sorted(_files(clone) - before))
        assert not left, f"{_rel(page)} leaves files in the checkout that git would show as untracked: {left}"


# Pages a reader follows in their own checkout: they write nothing there that `git status` would show.
LEAVES_NOTHING = {"tutorial.md"}


def _files(root: Path) -> set[str]:
    """The files under ``root``, but the venv link's and this test's own (the bash blocks it writes)."""
    own = {".venv", ".docs-blocks"}
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and not own & set(p.relative_to(root).parts)}


def _not_ignored(paths: list[str]) -> list[str]:
    """Those of ``paths`` (relative to the checkout) that the checkout's .gitignore does not ignore."""
    if not paths:
        return []
    proc = subprocess.run(["git", "check-ignore", "--no-index", "--stdin"], cwd=REPO, input="\n".join(paths),
                          capture_output=True, text=True)  # fmt: skip
    ignored = set(proc.stdout.split("\n"))
    return [p for p in paths if p not in ignored]


def _load_gen_docs() -> Any:
    spec = importlib.util.spec_from_file_location("gen_docs", REPO / "scripts" / "gen_docs.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_docs"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_generated_pages_are_current(capsys):
    """The API pages, benchmark pages and mkdocs.yml's generated nav are what scripts/gen_docs.py writes
    from today's ``__all__`` lists and bench/results/*.json."""
    gen_docs = _load_gen_docs()
    code = gen_docs.main(["--check"])
    assert code == 0, capsys.readouterr().err


def test_every_public_module_has_an_api_page():
    gen_docs = _load_gen_docs()
    on_pages = {m for mods in gen_docs.reference_groups().values() for m in mods}
    assert on_pages == set(gen_docs.public_modules())
    for module in ("trainforge", "trainforge.torch", "trainforge.tune", "trainforge.registry", "trainforge.serve",
                   "trainforge.server", "trainforge.model"):  # fmt: skip
        assert module in on_pages


def test_benchmark_tables_name_their_commit_and_date():
    gen_docs = _load_gen_docs()
    import json

    for path in sorted((REPO / "bench" / "results").glob("*.json")):
        data = json.loads(path.read_text())
        page = (DOCS / "benchmarks" / f"{path.stem}.md").read_text()
        commit = data.get("git_commit") or data.get("commit")
        assert commit and f"commit `{commit}`" in page, path.name
        if data.get("date"):
            assert str(data["date"]) in page, path.name
        for row in (data.get("table") or {}).get("rows", []):
            assert gen_docs._cell(row[0]) in page, (path.name, row[0])


@pytest.mark.slow
def test_site_builds_strictly(tmp_path):
    """``mkdocs build --strict``: a broken link, a missing anchor, a page not in the nav or an API name
    that does not resolve fails the build."""
    try:
        import material  # noqa: F401  (mkdocs-material, which pulls mkdocs in)
        import mkdocstrings  # noqa: F401
    except ImportError as exc:
        pytest.fail(f"{exc}: building the docs needs mkdocs-material and mkdocstrings-python "
                    "(requirements-dev.txt): run `bash scripts/setup.sh dev`")  # fmt: skip
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "WARNING" not in proc.stderr, proc.stderr
    assert (tmp_path / "site" / "tutorial" / "index.html").is_file()
    external = re.compile(r"""<(?:link|script|img|iframe)\b[^>]*\b(?:href|src)=["']?(?:https?:)?//""", re.I)
    loads = {str(page.relative_to(tmp_path / "site")): external.findall(page.read_text(errors="replace"))
             for page in (tmp_path / "site").rglob("*.html")}  # fmt: skip
    assert not {k: v for k, v in loads.items() if v}, "pages load resources from elsewhere (read offline, they fail)"
    reference = (tmp_path / "site" / "reference" / "index.html").read_text()
    assert "stylesheets/extra.css" in reference  # its table's names are kept whole (docs/stylesheets/extra.css)


def _slug(heading: str) -> str:
    """Python-Markdown's toc slug (what MkDocs gives a heading as its id)."""
    import unicodedata

    text = re.sub(r"<[^>]+>", "", heading)
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", text)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _anchors(page: Path) -> set[str]:
    anchors = set()
    in_fence = False
    for line in page.read_text().splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
        elif not in_fence and line.startswith("#"):
            anchors.add(_slug(line.lstrip("#").strip()))
    return anchors


def test_every_page_is_in_the_nav_once():
    import yaml

    def pages(node: Any) -> list[str]:
        if isinstance(node, str):
            return [node]
        if isinstance(node, list):
            return [p for item in node for p in pages(item)]
        if isinstance(node, dict):
            return [p for value in node.values() for p in pages(value)]
        return []

    listed = pages(yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"])
    twice = sorted({p for p in listed if listed.count(p) > 1})
    assert not twice, f"pages listed more than once in mkdocs.yml's nav: {twice}"


def test_the_docs_name_no_tool_of_the_developers_environment():
    """The docs are for users: no word of the tools the project's own sessions have (a lent machine's
    device tool, its library) that a user cannot run."""
    words = ("device tool", "give_back", "KINDS.md", ".library", "budget_left")
    found = [(str(p.relative_to(REPO)), w) for p in sorted(DOCS.rglob("*.md")) for w in words if w in p.read_text()]
    assert not found, found


def test_a_benchmark_is_dirty_only_when_the_code_that_ran_differs(tmp_path, monkeypatch):
    """Running a benchmark rewrites its own JSON: that (and the pages made from it) must not mark the
    next benchmark's commit ``-dirty``; a change to the code must."""
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import _common
    finally:
        sys.path.remove(str(REPO / "bench"))
    repo = tmp_path / "repo"
    for d in ("bench/results", "docs/benchmarks", "trainforge"):
        (repo / d).mkdir(parents=True)
    (repo / "bench/results/x.json").write_text("{}")
    (repo / "docs/benchmarks/x.md").write_text("x")
    (repo / "trainforge/a.py").write_text("a = 1")
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], cwd=repo, check=True)
    subprocess.run([*git, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "x"], cwd=repo, check=True)
    monkeypatch.setattr(_common, "REPO_ROOT", str(repo))
    (repo / "bench/results/x.json").write_text('{"new": 1}')
    (repo / "docs/benchmarks/x.md").write_text("y")
    (repo / "notes.txt").write_text("untracked")
    assert not _common.git_commit().endswith("-dirty")
    (repo / "trainforge/a.py").write_text("a = 2")
    assert _common.git_commit().endswith("-dirty")


def test_readme_is_short_and_its_links_resolve():
    text = README.read_text()
    lines = text.splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines: keep it to about 200, move the rest into docs/"
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://", target) or target.startswith("mailto:"):
            continue
        path, _, anchor = target.partition("#")
        file = (REPO / path) if path else README
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            broken.append(f"{target}: no heading #{anchor} in {path or 'README.md'}")
    assert not broken, broken
    for needed in ("bash scripts/test.sh", "mkdocs serve", "docs/tutorial.md", "docs/security.md", "docs/gpu.md"):
        assert needed in text, f"the README should mention {needed}"


def test_cli_help_links_name_existing_pages():
    """Links to the docs that the CLI's help prints (``docs/<page>.md`` or a site URL ending in
    ``/<page>/``) name pages that exist, with their anchors."""
    broken = []
    for source in sorted((REPO / "trainforge").rglob("*.py")):
        for m in re.finditer(r"docs/([\w./-]+\.md)(?:#([\w-]+))?", source.read_text()):
            page = DOCS / m.group(1)
            if not page.exists():
                broken.append(f"{_rel(source)}: {m.group(0)}: no such page")
            elif m.group(2) and m.group(2) not in _anchors(page):
                broken.append(f"{_rel(source)}: {m.group(0)}: no such heading")
    assert not broken, broken
