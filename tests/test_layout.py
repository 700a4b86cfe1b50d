"""The package layout's rules that import-linter does not check: no module imports a private name
across packages.

A private name (one leading underscore, not a dunder) is private to the package or module that
holds it: ``trainforge.server._config`` to ``trainforge.server``, ``_num`` in
``trainforge.server.scheduling.decision`` to that module. Any module inside the owner may import
it; any other may not, whether the import is at the top, inside a function or under
``TYPE_CHECKING``. So ``trainforge.server.jobs.service`` may import ``trainforge.server._config``,
and every module of ``trainforge`` may import ``trainforge._internal.http``; but
``trainforge.tune`` may not import ``trainforge.server._config``, nor
``trainforge.server.scheduling.rule`` import ``_num`` from ``decision``. A name another package
needs is made public where it lives (exported by its package's ``__init__``, or moved to a
module without the underscore).
"""

from __future__ import annotations

import ast
import pathlib

import pytest

import trainforge

ROOT = pathlib.Path(trainforge.__file__).parent


def _private(segment: str) -> bool:
    return segment.startswith("_") and not (segment.startswith("__") and segment.endswith("__"))


def module_name(path: pathlib.Path, root: pathlib.Path = ROOT) -> str:
    parts = [root.name, *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_paths(tree: ast.AST, module: str, is_package: bool) -> list[tuple[int, list[str]]]:
    """Every dotted path ``tree`` imports, as segments: ``import a.b`` is ``a.b``, ``from a.b import
    c`` is ``a.b.c`` (c a module or a name in it); relative imports resolved against ``module``."""
    out: list[tuple[int, list[str]]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name.split(".")) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                source = base + (node.module.split(".") if node.module else [])
            else:
                source = (node.module or "").split(".")
            out += [(node.lineno, [*source, alias.name]) for alias in node.names if alias.name != "*"]
    return out


def private_imports(source: str, module: str, *, is_package: bool = False, root: str = "trainforge") -> list[str]:
    """The imports of ``module`` (its ``source``) of a private name it is not inside of, as
    ``"module:line: imported.path (private to owner)"``. Only paths under ``root`` are looked at."""
    violations = []
    for line, segments in imported_paths(ast.parse(source), module, is_package):
        if segments[0] != root:
            continue
        for i, segment in enumerate(segments):
            if _private(segment):
                owner = ".".join(segments[:i])
                if module != owner and not module.startswith(owner + "."):
                    violations.append(f"{module}:{line}: {'.'.join(segments)} (private to {owner})")
                break  # the first private segment decides: deeper ones are inside it
    return violations


@pytest.mark.parametrize(
    "module, source",
    [
        ("trainforge.server.jobs.service", "from trainforge.server._config import ServerConfig"),
        ("trainforge.server.jobs.service", "import trainforge.server._config"),
        ("trainforge.server.routes.jobs", "from trainforge._internal.http import guard"),
        ("trainforge.tune._tuner", "from trainforge._internal import http"),
        ("trainforge.server.scheduling.decision", "from trainforge.server.scheduling.decision import _num"),
        ("trainforge.client", "from trainforge.client._client import Client"),
        ("trainforge.client._job", "from trainforge.client._errors import ServerError"),
        ("trainforge.server.scheduling.rule", "from trainforge.server.scheduling.decision import decide"),
        ("trainforge.server.x", "import json as _json\nfrom os import _exit\nfrom trainforge.server import __main__"),
    ],
)
def test_imports_allowed(module, source):
    assert private_imports(source, module) == []


@pytest.mark.parametrize(
    "module, source, owner",
    [
        ("trainforge.server.scheduling.rule", "from trainforge.server.scheduling.decision import _num, decide",
         "trainforge.server.scheduling.decision"),
        ("trainforge.tune._server", "from trainforge.server._config import ENV_ADDRESS", "trainforge.server"),
        ("trainforge.server._main", "from trainforge.client._discovery import read_text", "trainforge.client"),
        ("trainforge.server._main", "import trainforge.client._discovery", "trainforge.client"),
        ("trainforge.server.cli.commands", "def f():\n    from trainforge.client._client import Client\n",
         "trainforge.client"),
        ("trainforge.server.jobs.service",
         "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from trainforge.server.store._sql import Q\n",
         "trainforge.server.store"),
        ("trainforge.server.scheduling.rule", "from .decision import _Tail", "trainforge.server.scheduling.decision"),
        ("trainforge.server.scheduling", "from ..store._sql import Q", "trainforge.server.store"),
        ("trainforge.serverx", "from trainforge.server._config import X", "trainforge.server"),  # a prefix is not inside
    ],
)  # fmt: skip
def test_imports_refused_name_their_owner(module, source, owner):
    found = private_imports(source, module, is_package=module == "trainforge.server.scheduling")
    assert len(found) == 1 and found[0].endswith(f"(private to {owner})"), found


def test_no_module_imports_a_private_name_across_packages():
    files = sorted(ROOT.rglob("*.py"))
    assert len(files) > 100  # the walk found the package
    violations = [
        v for path in files
        for v in private_imports(path.read_text(encoding="utf-8"), module_name(path), is_package=path.name == "__init__.py")
    ]  # fmt: skip
    assert not violations, "private names imported across packages (make them public where they live):\n" + "\n".join(
        violations
    )
