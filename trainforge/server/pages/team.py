"""The dashboard's parts for a server a team shares (:mod:`trainforge.server.pages.dashboard` places them):
who is signed in (every page's header), who did what to a job (the job page's audit table), and each
user's fair share, usage and quota (the queue page)."""

from __future__ import annotations

import html
import time
from typing import TYPE_CHECKING, Any

from trainforge._internal.amounts import fmt_number, fmt_resources
from trainforge.server.team.users import Principal

if TYPE_CHECKING:
    from trainforge.server.jobs.service import JobService


def _esc(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _amounts(d: dict[str, float] | None) -> str:
    return fmt_resources(d)


def signed_in(caller: Principal | None) -> str:
    """The header's note of who is signed in (nothing without a caller)."""
    if caller is None:
        return ""
    return f'<span class=who id=whoami data-role="{_esc(caller.role)}">{_esc(caller.name)} · {_esc(caller.role)}</span>'


def owner_note(job: dict[str, Any]) -> str:
    """``owner alice · preemptible (preempted 2×)`` for a job's page."""
    note = f'owner <span id=owner>{_esc(job.get("owner", "admin"))}</span>'
    if job.get("preemptible"):
        note += " · preemptible" + (f" (preempted {job['preemptions']}×)" if job.get("preemptions") else "")
    return note


def audit_section(service: JobService, job_id: int, limit: int = 50) -> str:
    """Who did what to the job, newest first (the audit log's entries of its id)."""
    entries = service.audit.query(job_id=job_id, limit=limit)
    rows = "".join(
        f"<tr><td>{_esc(time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(e['ts'])))}</td>"
        f"<td>{_esc(e['user'])} <small>{_esc(e['role'])}</small></td><td>{_esc(e['method'])} {_esc(e['path'])}</td>"
        f"<td>{_esc(e['action'])}</td><td class=num>{e['status']}</td><td>{_esc(e['client'] or '')}</td></tr>"
        for e in entries
    ) or "<tr class=empty><td colspan=6>Nobody has changed this job through the API yet.</td></tr>"
    return ("<section><h2>Audit</h2><table class=audit id=audit><thead><tr><th>When</th><th>Who</th><th>What</th>"
            f"<th>Rule</th><th>Answer</th><th>From</th></tr></thead><tbody>{rows}</tbody></table></section>")  # fmt: skip


def shares_section(service: JobService) -> str:
    """Each user's fair share: weight, usage, factor, what they hold and their quota."""
    rows = "".join(
        f"<tr><td>{_esc(r['user'])}</td><td class=num>{fmt_number(r['shares'])}</td>"
        f"<td class=num>{100 * r['share_fraction']:.0f}%</td><td class=num>{100 * r['usage_fraction']:.0f}%</td>"
        f"<td class=num>{r['factor']:.3f}</td><td>{_esc(_amounts(r['holds']))}</td><td>{_esc(_amounts(r['quota']))}</td></tr>"
        for r in service.scheduling.report(time.time())
    )
    return ("<section><h2>Fair share</h2><p class=meta>Among jobs of equal priority, users are ordered by their factor "
            "F = 2<sup>-U/S</sup> (U: their share of recent usage, S: their configured share; higher starts first).</p>"
            "<table class=shares id=shares><thead><tr><th>User</th><th>Shares</th><th>S</th><th>U</th><th>F</th>"
            f"<th>Holds</th><th>Quota</th></tr></thead><tbody>{rows}</tbody></table></section>")  # fmt: skip
