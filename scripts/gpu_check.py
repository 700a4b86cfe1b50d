"""The Python half of scripts/gpu_check.sh (run with the Python that runs the tests; standard library
only, plus ``packaging`` where it is installed):

    python scripts/gpu_check.py env OUT/gpu_env.json            the GPU, driver, Python, torch, CUDA, NCCL
    python scripts/gpu_check.py wheels OUT/gpu_wheels.json|- [--installed]
                                                                 .whl/ against scripts/gpu_wheels.txt
    python scripts/gpu_check.py summary OUT [--dry-run]          OUT/gpu_check.json and OUT/gpu_check.md

``wheels`` checks that .whl/ holds exactly the wheels the list pins (one version each, for CPython 3.12
on x86-64 Linux) and that every requirement of each is in the list or in the GPU image
(scripts/gpu_image_packages.txt); with ``--installed`` (after the install into /tmp/site, with it on
``PYTHONPATH``) also that each requirement is met by the version this Python imports. Without .whl/
it checks the list against what this environment has installed (the versions .venv pins).

:func:`runtime_closure` is what tests/test_gpu_readiness.py checks the list with.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
import zipfile
from importlib import metadata
from typing import Any

SCRIPTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(SCRIPTS)
WHEELS_LIST = os.path.join(SCRIPTS, "gpu_wheels.txt")
IMAGE_LIST = os.path.join(SCRIPTS, "gpu_image_packages.txt")
WHEEL_DIR = os.path.join(REPO, ".whl")
CARRY_LIMIT_MIB = 64  # the device tool's limit for the working tree and the carried paths together
# The GPU image's interpreter, for evaluating requirement markers: CPython 3.12 on x86-64 Linux.
GPU_MARKERS = {
    "python_version": "3.12", "python_full_version": "3.12.3", "implementation_name": "cpython",
    "platform_python_implementation": "CPython", "sys_platform": "linux", "platform_system": "Linux",
    "platform_machine": "x86_64", "os_name": "posix", "implementation_version": "3.12.3", "extra": "",
}  # fmt: skip
WHEEL_TAGS = re.compile(r"^(cp312|py3|py2\.py3)-(cp312|abi3|none)-(any|manylinux.*x86_64|linux_x86_64)$")

try:  # the image has packaging; so does any environment with pip
    from packaging.requirements import Requirement
    from packaging.version import Version
except ImportError:  # pragma: no cover
    from pip._vendor.packaging.requirements import Requirement  # type: ignore[assignment]
    from pip._vendor.packaging.version import Version  # type: ignore[assignment]


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_wheel_list(path: str = WHEELS_LIST) -> dict[str, str]:
    """``{canonical name: version}`` from ``NAME==VERSION`` lines (``#`` starts a comment)."""
    pins: dict[str, str] = {}
    with open(path) as f:
        for n, raw in enumerate(f, 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][A-Za-z0-9.+!-]*)", line)
            if m is None:
                raise ValueError(f"{path}:{n}: {line!r} is not NAME==VERSION")
            name = canonical(m.group(1))
            if name in pins:
                raise ValueError(f"{path}:{n}: {name} is listed twice: keep one version")
            pins[name] = m.group(2)
    return pins


def read_image_list(path: str = IMAGE_LIST) -> set[str]:
    with open(path) as f:
        return {canonical(w) for line in f if not line.startswith("#") for w in line.split()}


def runtime_requirements(requires: list[str] | None) -> list[Any]:
    """The requirements (``Requirement``) that apply on the GPU image, extras left out."""
    out = []
    for text in requires or []:
        req = Requirement(text)
        if req.marker is None or req.marker.evaluate(GPU_MARKERS):
            out.append(req)
    return out


def runtime_closure(extras: tuple[str, ...] = ("torch", "server", "serve")) -> dict[str, str | None]:
    """Every distribution trainforge needs at run time with ``extras`` on the GPU image, from the
    metadata installed here: ``{canonical name: installed version (None: not installed here)}``."""
    roots = []
    for text in metadata.requires("trainforge") or []:
        req = Requirement(text)
        if req.marker is None or any(req.marker.evaluate({**GPU_MARKERS, "extra": e}) for e in ("", *extras)):
            roots.append(req.name)
    found: dict[str, str | None] = {}
    todo = list(roots)
    while todo:
        name = canonical(todo.pop())
        if name in found:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            found[name] = None
            continue
        found[name] = dist.version
        todo += [r.name for r in runtime_requirements(dist.requires)]
    return found


def _wheel_requires(path: str) -> list[str]:
    with zipfile.ZipFile(path) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Requires-Dist:")]


def check_wheels(wheel_dir: str = WHEEL_DIR, installed: bool = False) -> dict[str, Any]:
    """What is wrong with ``wheel_dir`` (see the module's docstring): ``problems`` (empty: fine) and
    ``notes``. ``installed``: also check each requirement against the versions this Python imports."""
    pins, image = read_wheel_list(), read_image_list()
    problems: list[str] = []
    notes = [f"{n} is in the GPU image too: carried for its version" for n in pins if n in image]
    requires: dict[str, list[str]] = {}
    files = sorted(f for f in os.listdir(wheel_dir) if f.endswith(".whl")) if os.path.isdir(wheel_dir) else []
    size = sum(os.path.getsize(os.path.join(wheel_dir, f)) for f in files)
    if not files:
        notes.append(f"no wheels in {os.path.relpath(wheel_dir, REPO)}/: `bash scripts/gpu_wheels.sh` downloads them; "
                     "the list is checked against this environment's packages instead")  # fmt: skip
        for name, version in pins.items():
            try:
                dist = metadata.distribution(name)
            except metadata.PackageNotFoundError:
                notes.append(f"{name} is not installed here: its requirements are not checked")
                continue
            if dist.version != version:
                problems.append(f"{name}=={version} is listed, but this environment has {dist.version}: list the "
                                "version requirements-dev.txt installs")  # fmt: skip
            requires[name] = list(dist.requires or [])
    seen: dict[str, str] = {}
    for f in files:
        parts = f[:-4].split("-")
        name, version, tags = canonical(parts[0]), parts[1], "-".join(parts[-3:])
        if name in seen:
            problems.append(f"two versions of {name} ({seen[name]}, {version}): the install refuses; keep one")
        seen[name] = version
        if pins.get(name) != version:
            problems.append(f"{f} is not in scripts/gpu_wheels.txt" + (f" (it pins {pins[name]})" if name in pins else "")
                            + ": run `bash scripts/gpu_wheels.sh`, which clears the folder first")  # fmt: skip
        if not WHEEL_TAGS.match(tags):
            problems.append(f"{f} is not for CPython 3.12 on x86-64 Linux (tags {tags})")
        requires[name] = _wheel_requires(os.path.join(wheel_dir, f))
    if files:
        problems += [f"{n}=={v} is listed but not in .whl/: run `bash scripts/gpu_wheels.sh`" for n, v in pins.items()
                     if n not in seen]  # fmt: skip
    if size > CARRY_LIMIT_MIB * 2**20 / 4:
        problems.append(f".whl/ holds {size / 2**20:.1f} MiB: keep it well under the {CARRY_LIMIT_MIB} MiB that travel")
    for name, reqs in requires.items():
        for req in runtime_requirements(reqs):
            dep = canonical(req.name)
            if dep not in pins and dep not in image:
                problems.append(f"{name} needs {req}, which neither the GPU image nor scripts/gpu_wheels.txt has: add it")
            elif dep in pins and not req.specifier.contains(pins[dep], prereleases=True):
                problems.append(f"{name} needs {req}, but scripts/gpu_wheels.txt pins {dep}=={pins[dep]}")
            elif installed:
                try:
                    have = metadata.version(dep)
                except metadata.PackageNotFoundError:
                    problems.append(f"{name} needs {req}, which this Python cannot find")
                    continue
                if not req.specifier.contains(Version(have), prereleases=True):
                    problems.append(f"{name} needs {req}, but this Python has {dep} {have}: carry a wheel of it "
                                    "(scripts/gpu_wheels.txt)")  # fmt: skip
    return {"wheels": len(files), "mib": round(size / 2**20, 2), "listed": pins, "problems": problems,
            "notes": notes, "installed_checked": installed}  # fmt: skip


def environment() -> dict[str, Any]:
    """The machine as the tests will see it (without initialising CUDA in a way that matters: this
    process ends right after)."""
    env: dict[str, Any] = {"python": sys.version.split()[0], "executable": sys.executable}
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,name,driver_version,memory.total,uuid",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=30)  # fmt: skip
        env["nvidia_smi"] = [line.strip() for line in out.stdout.splitlines() if line.strip()] or out.stderr.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        env["nvidia_smi"] = f"not available: {exc}"
    try:
        import torch

        env["torch"] = torch.__version__
        env["torch_cuda"] = torch.version.cuda
        env["cuda_available"] = torch.cuda.is_available()
        if env["cuda_available"]:
            env["devices"] = [
                {"name": p.name, "capability": f"{p.major}.{p.minor}", "memory_gib": round(p.total_memory / 2**30, 1)}
                for p in (torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count()))
            ]
            env["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
            env["cudnn"] = torch.backends.cudnn.version()
    except ImportError as exc:
        env["torch"] = f"not importable: {exc}"
    env["packages"] = {}
    for name in ("fastapi", "uvicorn", "pydantic", "starlette", "nvidia-ml-py", "httpx", "pytest", "pytest-timeout"):
        try:
            env["packages"][name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            env["packages"][name] = None
    return env


def _junit(path: str) -> dict[str, Any] | None:
    if not os.path.exists(path):
        return None
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as exc:
        return {"problem": f"{path} does not parse: {exc}"}
    cases: list[dict[str, Any]] = []
    for case in root.iter("testcase"):
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                text = (node.get("message") or node.text or "").strip()
                message = text.splitlines()[0][:300] if text else ""
                break
        module = (case.get("classname") or "").rsplit(".", 1)[-1]
        cases.append({"name": f"{module}::{case.get('name')}", "outcome": outcome,
                      "seconds": round(float(case.get("time") or 0), 2), "message": message})  # fmt: skip
    counts = {k: sum(c["outcome"] == k for c in cases) for k in ("passed", "failed", "error", "skipped")}
    return {**counts, "total": len(cases), "seconds": round(sum(c["seconds"] for c in cases), 1), "cases": cases}


def _load(path: str) -> Any:
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def summary(out: str, dry_run: bool) -> dict[str, Any]:
    env = _load(os.path.join(out, "gpu_env.json")) or {}
    wheels = _load(os.path.join(out, "gpu_wheels.json"))
    tests = _junit(os.path.join(out, "gpu_tests.xml"))
    bench = _load(os.path.join(out, "gpu_bench.json"))
    gpu = (env.get("devices") or [{}])[0].get("name") if env.get("cuda_available") else None
    tests_ok = tests is not None and "problem" not in tests and tests["passed"] > 0 and not (tests["failed"] or tests["error"])
    ok = (not (wheels or {}).get("problems")) and (dry_run or (tests_ok and bench is not None))
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": os.environ.get("GPU_CHECK_COMMIT") or _git_commit(), "dry_run": dry_run, "ok": ok, "gpu": gpu,
        "environment": env, "wheels": wheels, "tests": tests,
        "bench": {"summary": bench.get("summary"), "config": bench.get("config"), "sampler": bench.get("sampler")}
        if bench else None,
    }  # fmt: skip
    with open(os.path.join(out, "gpu_check.json"), "w") as f:
        json.dump(result, f, indent=1, default=str)
    with open(os.path.join(out, "gpu_check.md"), "w") as f:
        f.write(markdown(result))
    return result


def _git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    except OSError:
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 else "unknown (no git here: set GPU_CHECK_COMMIT)"


def _fmt(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def markdown(r: dict[str, Any]) -> str:
    env, tests, bench = r["environment"], r["tests"], (r["bench"] or {}).get("summary") or {}
    smi = env.get("nvidia_smi")
    lines = [f"# GPU check{' (dry run)' if r['dry_run'] else ''}: {'OK' if r['ok'] else 'NOT OK'}", "",
             f"- date: {r['date']}, commit: {r['commit']}",
             f"- GPU: {'; '.join(smi) if isinstance(smi, list) else smi}",
             f"- Python {env.get('python')}, torch {env.get('torch')} (CUDA {env.get('torch_cuda')}), NCCL "
             f"{env.get('nccl', '-')}, cuDNN {env.get('cudnn', '-')}",
             f"- packages: {', '.join(f'{k} {v}' for k, v in (env.get('packages') or {}).items())}"]  # fmt: skip
    wheels = r["wheels"] or {}
    lines.append(f"- wheels: {wheels.get('wheels', 0)} ({wheels.get('mib', 0)} MiB), "
                 + ("; ".join(wheels.get("problems") or []) or "no problems"))  # fmt: skip
    lines += ["", "## Tests (tests/gpu/)", ""]
    if not tests:
        lines.append("not run" + (" (dry run)" if r["dry_run"] else ": no JUnit XML"))
    elif "problem" in tests:
        lines.append(tests["problem"])
    else:
        lines += [f"{tests['passed']} passed, {tests['failed']} failed, {tests['error']} errors, {tests['skipped']} "
                  f"skipped in {tests['seconds']} s", "", "| test | outcome | s | message |", "| --- | --- | --- | --- |"]
        lines += [f"| {c['name']} | {c['outcome']} | {c['seconds']} | {c['message'].replace('|', '/')} |"
                  for c in tests["cases"]]  # fmt: skip
    lines += ["", "## Benchmark (bench/bench_gpu.py --quick)", ""]
    if not bench:
        lines.append("not run" if r["dry_run"] else "no results (see gpu_check.log)")
    else:
        step, first = bench.get("step_ms") or {}, bench.get("first_step_s") or {}
        lines += ["| metric | value |", "| --- | --- |"]
        lines += [f"| step ms, {k} | {_fmt(v, '.2f')} |" for k, v in step.items()]
        lines += [f"| speed vs raw (goal >= 0.98) | {_fmt(bench.get('step_ratio'), '.3f')} |",
                  f"| AMP speed-up float16 / bfloat16 | {_fmt(bench.get('amp_speedup_fp16'), '.2f')} / "
                  f"{_fmt(bench.get('amp_speedup_bf16'), '.2f')} |",
                  f"| first step s, raw / trainforge | {_fmt(first.get('raw'), '.2f')} / {_fmt(first.get('trainforge'), '.2f')} |",
                  f"| usage sampler ms per NVML reading | {_fmt(bench.get('sampler_ms'), '.3f')} |"]  # fmt: skip
    if tests and "problem" not in tests and not r["dry_run"]:
        lines += ["", "Row for docs/gpu.md:", "",
                  f"| {r['date'][:10]} | {r['gpu']} | {r['commit']} | {env.get('torch')} / CUDA {env.get('torch_cuda')} | "
                  f"{tests['passed']}/{tests['total']} | {_fmt(bench.get('step_ratio'), '.3f')} | "
                  f"{_fmt(bench.get('amp_speedup_fp16'), '.2f')} / {_fmt(bench.get('amp_speedup_bf16'), '.2f')} | "
                  f"{_fmt((bench.get('first_step_s') or {}).get('trainforge'), '.1f')} | {_fmt(bench.get('sampler_ms'), '.2f')} |"]  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "env":
        env = environment()
        with open(argv[1], "w") as f:
            json.dump(env, f, indent=1, default=str)
        print(json.dumps(env, indent=1, default=str))
        return 0
    if len(argv) >= 2 and argv[0] == "wheels":
        report = check_wheels(installed="--installed" in argv)
        if argv[1] != "-":
            with open(argv[1], "w") as f:
                json.dump(report, f, indent=1)
        print(f"wheels: {report['wheels']} in .whl/ ({report['mib']} MiB), {len(report['listed'])} listed")
        for line in report["notes"]:
            print(f"  note: {line}")
        for line in report["problems"]:
            print(f"  PROBLEM: {line}")
        return 1 if report["problems"] else 0
    if len(argv) >= 2 and argv[0] == "summary":
        result = summary(argv[1], "--dry-run" in argv)
        with open(os.path.join(argv[1], "gpu_check.md")) as f:
            print(f.read())
        return 0 if result["ok"] else 1
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
