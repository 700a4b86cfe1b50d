"""``trainforge models ...``: the model registry from a shell.

    trainforge models list                                    every model: latest version, aliases
    trainforge models versions NAME                           its versions with metrics and sizes
    trainforge models show REF                                one version (models:/name/3, name@alias, name)
    trainforge models register NAME SOURCE [--model-class M:C | --loader M:F] [--metric k=v] [--tag k=v]
                                           [--description TEXT] [--alias A]
    trainforge models alias set NAME ALIAS VERSION | alias rm NAME ALIAS | alias history NAME [ALIAS]
    trainforge models delete NAME VERSION [--force]           its files go unless another version has them
    trainforge models gc                                      remove files no version refers to
    trainforge models push REF DEST_REGISTRY                  a version (name/3, name@alias) or a whole model
    trainforge models pull REF DIR                            its files into DIR, verified
    trainforge models pull-from SRC_REGISTRY REF              into this registry
    trainforge models put NAME MODULE:CLASS [--config k=v] [--data M:C]   a model definition (no weights)
    trainforge models lineage NAME                            definitions -> runs -> trained versions -> aliases

``--registry URL`` (any command; default ``$TRAINFORGE_REGISTRY``, else ``~/trainforge/registry``);
``--json`` prints what the Python API returns, as JSON.
"""

from __future__ import annotations

import datetime
import json
import sys
from typing import Any

from trainforge._internal.amounts import fmt_metric
from trainforge._internal.display import ordered_metrics, table, terminal_width
from trainforge._internal.key_values import parse_key_values


def add_commands(sub: Any) -> None:
    p = sub.add_parser("models", help="the model registry: list, register, alias, push/pull, delete, gc",
                       description="The model registry (trainforge.registry) on a directory or any fsspec URL.")  # fmt: skip
    common = _common()
    msub = p.add_subparsers(dest="models_command", required=True)

    def command(parent: Any, name: str, run: Any, summary: str) -> Any:
        """Subcommand ``name`` of ``parent``, with the common options: ``run(registry, args)`` runs it."""
        c = parent.add_parser(name, parents=[common], help=summary)
        c.set_defaults(func=_run(run))
        return c

    command(msub, "list", _list, "every model")
    c = command(msub, "versions", _versions, "a model's versions")
    c.add_argument("name")
    c = command(msub, "show", _show, "one version: files, metrics, lineage")
    c.add_argument("ref", help="models:/name/3, models:/name@alias or models:/name (the latest)")

    c = command(msub, "register", _register, "register a checkpoint or directory as the next version")
    c.add_argument("name")
    c.add_argument("source", help="a directory or URL of the files (a checkpoint, a Model.save directory)")
    how = c.add_mutually_exclusive_group()
    how.add_argument("--model-class", help="module:Class of the trainforge.model.Model it holds")
    how.add_argument("--loader", help="module:function that takes the version's directory and returns the model")
    c.add_argument("--metric", action="append", default=[], metavar="KEY=VALUE", help="a metric to record (repeatable)")
    c.add_argument("--tag", action="append", default=[], metavar="KEY=VALUE", help="a tag (repeatable)")
    c.add_argument("--description")
    c.add_argument("--alias", help="point this alias at the new version")
    c.add_argument("--by", help="who registers it (default user@host)")

    a = msub.add_parser("alias", help="set, move, remove an alias, or show its history")
    asub = a.add_subparsers(dest="alias_command", required=True)
    c = command(asub, "set", _alias_set, "point ALIAS at VERSION (set or move it)")
    c.add_argument("name")
    c.add_argument("alias")
    c.add_argument("version", type=int)
    c.add_argument("--by", help="who moves it (default user@host)")
    c = command(asub, "rm", _alias_rm, "remove ALIAS (its history keeps the removal)")
    c.add_argument("name")
    c.add_argument("alias")
    c.add_argument("--by")
    c = command(asub, "history", _alias_history, "every move of the model's aliases (or of one)")
    c.add_argument("name")
    c.add_argument("alias", nargs="?")

    c = command(msub, "delete", _delete, "delete a version (refused while an alias points at it)")
    c.add_argument("name")
    c.add_argument("version", type=int)
    c.add_argument("--force", action="store_true", help="delete it even when aliases point at it (they go too)")
    command(msub, "gc", _gc, "remove stored files that no version refers to")

    c = command(msub, "put", _put, "register a model definition: its class, default config, no weights")
    c.add_argument("name")
    c.add_argument("model_class", metavar="MODULE:CLASS", help="the model class (trainforge.model.Model, XGBoostModel, ...)")
    c.add_argument("--config", action="append", default=[], metavar="KEY=VALUE", help="a default config value (repeatable)")
    c.add_argument("--data", metavar="MODULE:CLASS", help="its default trainforge.model.Data class")
    c.add_argument("--description")
    c.add_argument("--by", help="who registers it (default user@host)")
    c = command(msub, "lineage", _lineage, "definitions -> runs -> trained versions -> aliases")
    c.add_argument("name")

    c = command(msub, "push", _push, "copy a version or a whole model to another registry")
    c.add_argument("ref", help="name/3 or name@alias (one version) or name (every version and alias)")
    c.add_argument("dest", help="the other registry's directory or URL")
    c = command(msub, "pull", _pull, "copy a version's files into a local directory, verified")
    c.add_argument("ref")
    c.add_argument("dir")
    c = command(msub, "pull-from", _pull_from, "copy a version or model from another registry into this one")
    c.add_argument("source", help="the other registry's directory or URL")
    c.add_argument("ref")


def _common() -> Any:
    import argparse

    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--registry", help="the registry's directory or URL (default: $TRAINFORGE_REGISTRY, else "
                   "~/trainforge/registry)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print JSON")
    return p


def _run(fn: Any) -> Any:
    def run(args: Any) -> int:
        from trainforge import StorageError
        from trainforge.registry import Registry, RegistryError

        try:
            return int(fn(Registry(args.registry), args) or 0)
        except BrokenPipeError:  # the reader went away (`| head`): the CLI's main ends quietly
            raise
        except (KeyError, RegistryError, ValueError, TypeError, OSError, StorageError, ImportError) as exc:
            text = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
            print(f"trainforge models: {text}", file=sys.stderr)
            return 1

    return run


def _out(args: Any, data: Any, text: str) -> None:
    if args.json:
        print(json.dumps(data, indent=1, default=str))
    else:
        print(text)


def _when(t: float | None) -> str:
    if not t:
        return "-"
    return datetime.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")


def _size(n: int) -> str:
    f = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if f < 1000 or unit == "GB":
            return f"{f:.0f} {unit}" if unit == "B" else f"{f:.1f} {unit}"
        f /= 1000
    return f"{n} B"


def _table(rows: list[list[str]], header: list[str], *, right: tuple[int, ...] = (), cut: int | None = None) -> str:
    """The rows as a table sized to their content and to the terminal (:func:`~trainforge._internal.display.table`)."""
    return table(header, rows, right=right, cut=cut, width=terminal_width()) if rows else ""


def _list(reg: Any, args: Any) -> None:
    models = reg.list_models()
    rows = [[m.name, str(m.latest_version or "-"), str(m.num_versions),
             ", ".join(f"{a}->{v}" for a, v in m.aliases.items()) or "-", _when(m.updated_at)] for m in models]  # fmt: skip
    _out(args, [m.to_dict() for m in models],
         _table(rows, ["NAME", "LATEST", "VERSIONS", "ALIASES", "UPDATED"], right=(1, 2), cut=0) or f"no models in {reg.url}")  # fmt: skip


def _metrics_text(metrics: dict[str, Any]) -> str:
    """Every metric, the ones people look for first (validation) first: a narrow terminal cuts the end."""
    return " ".join(f"{k}={fmt_metric(v)}" if isinstance(v, float) else f"{k}={v}" for k, v in ordered_metrics(metrics)) or "-"


def _versions(reg: Any, args: Any) -> None:
    versions = reg.versions(args.name)
    aliases = reg.get_model(args.name).aliases
    rows = [[str(v.version), _when(v.created_at), _size(v.size), ", ".join(a for a, n in aliases.items() if n == v.version)
             or "-", _metrics_text(v.metrics)] for v in versions]  # fmt: skip
    _out(args, [v.to_dict() for v in versions],
         _table(rows, ["VERSION", "CREATED", "SIZE", "ALIASES", "METRICS"], right=(0, 2)) or f"{args.name} has no versions left")  # fmt: skip


def _show(reg: Any, args: Any) -> None:
    mv = reg.get(args.ref)
    lines = [f"{mv.uri}  ({_size(mv.size)} in {len(mv.files)} files, created {_when(mv.created_at)} by {mv.created_by})"]
    if mv.description:
        lines.append(f"  description: {mv.description}")
    lines.append(f"  load with:   {mv.loader or mv.model_class or '(no model class or loader recorded)'}")
    lines.append(f"  kind:        {mv.kind}{f' ({mv.framework})' if mv.framework else ''}")
    for key in ("metrics", "tags", "lineage"):
        for k, v in getattr(mv, key).items():
            lines.append(f"  {key[:-1] if key != 'lineage' else 'lineage'} {k}: {v}")
    for path, f in mv.files.items():
        lines.append(f"  file {path}  {_size(f['size'])}  sha256:{f['sha256'][:12]}")
    _out(args, mv.to_dict(), "\n".join(lines))


def _progress() -> Any:
    if not sys.stderr.isatty():
        return None

    def show(done: int, total: int, what: str) -> None:
        end = "\n" if done >= total else ""
        print(f"\r{what}: {_size(done)} of {_size(total)}", end=end, file=sys.stderr, flush=True)

    return show


def _transfer(reg: Any) -> str:
    t = reg.last_transfer
    return (f"{t.get('files_copied', 0)} file(s) copied ({_size(t.get('bytes_copied', 0))}), "
            f"{t.get('files_skipped', 0)} already there")  # fmt: skip


def _register(reg: Any, args: Any) -> None:
    mv = reg.register(args.name, args.source, model_cls=args.model_class, loader=args.loader,
                      metrics=parse_key_values(args.metric, "metric") or None, tags=parse_key_values(args.tag, "tag"),
                      description=args.description, alias=args.alias, by=args.by, progress=_progress())  # fmt: skip
    alias = f", alias {args.alias} -> {mv.version}" if args.alias else ""
    _out(args, mv.to_dict(), f"registered {mv.uri} in {reg.url}: {_transfer(reg)}{alias}")


def _move_text(m: Any, name: str) -> str:
    frm = "(unset)" if m.from_version is None else m.from_version
    to = "(removed)" if m.to_version is None else m.to_version
    return f"{_when(m.at)}  {name}@{m.alias}: {frm} -> {to}  by {m.by}"


def _alias_set(reg: Any, args: Any) -> None:
    m = reg.set_alias(args.name, args.alias, args.version, by=args.by)
    _out(args, m.to_dict(), _move_text(m, args.name))


def _alias_rm(reg: Any, args: Any) -> None:
    m = reg.delete_alias(args.name, args.alias, by=args.by)
    _out(args, m.to_dict(), _move_text(m, args.name))


def _alias_history(reg: Any, args: Any) -> None:
    moves = reg.alias_history(args.name, args.alias)
    _out(args, [m.to_dict() for m in moves], "\n".join(_move_text(m, args.name) for m in moves) or "no alias moves")


def _delete(reg: Any, args: Any) -> None:
    out = reg.delete_version(args.name, args.version, force=args.force)
    _out(args, out, f"deleted models:/{args.name}/{args.version}: {out['blobs_removed']} file(s) removed, "
                    f"{_size(out['bytes_freed'])} freed")  # fmt: skip


def _gc(reg: Any, args: Any) -> None:
    out = reg.gc()
    _out(args, out, f"gc {reg.url}: {out['blobs_removed']} file(s) removed, {_size(out['bytes_freed'])} freed")


def _push(reg: Any, args: Any) -> None:
    out = reg.push(args.ref, args.dest, progress=_progress())
    _out(args, [v.to_dict() for v in out],
         f"pushed {', '.join(v.uri for v in out) or 'nothing'} to {args.dest}: {_transfer(reg)}")  # fmt: skip


def _pull(reg: Any, args: Any) -> None:
    path = reg.pull(args.ref, args.dir, progress=_progress())
    _out(args, {"dir": path, **reg.last_transfer}, f"pulled {args.ref} into {path}: {_transfer(reg)}")


def _pull_from(reg: Any, args: Any) -> None:
    out = reg.pull_from(args.source, args.ref, progress=_progress())
    _out(args, [v.to_dict() for v in out],
         f"pulled {', '.join(v.uri for v in out) or 'nothing'} from {args.source} into {reg.url}: {_transfer(reg)}")  # fmt: skip


def _put(reg: Any, args: Any) -> None:
    from trainforge.model import import_path

    for what, path in (("MODULE:CLASS", args.model_class), ("--data", args.data)):
        if path is not None and ":" not in path:
            raise ValueError(f"{what} {path!r}: give module:Class")
    mv = reg.put(import_path(args.model_class), args.name, config=parse_key_values(args.config, "config"),
                 data=import_path(args.data) if args.data else None, description=args.description, by=args.by)  # fmt: skip
    _out(args, mv.to_dict(), f"registered the definition {mv.uri} ({mv.model_class}) in {reg.url}")


def _lineage(reg: Any, args: Any) -> None:
    tree = reg.lineage(args.name)
    lines = []
    for d in tree:
        what = f"{d['definition']}  definition of {d['model_class']} ({d['framework']})" if d["definition"] else \
            "(trained from no definition of this registry)"
        lines.append(what)
        for run in d["runs"]:
            lines.append(f"  run {run['run_path'] or '(a directory)'}")
            for v in run["versions"]:
                served = f"  aliases: {', '.join(v['aliases'])}" if v["aliases"] else ""
                lines.append(f"    {v['uri']}  {_metrics_text(v['metrics'])}{served}")
        if not d["runs"]:
            lines.append("  (not trained yet)")
    _out(args, tree, "\n".join(lines) or f"model {args.name!r} has no versions")
