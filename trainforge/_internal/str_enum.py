"""``StrEnum``: an enum whose members are their ``str`` values, in Python 3.10 too (``enum.StrEnum``
came in 3.11): ``str(JobState.RUNNING) == "RUNNING"`` and f-strings show the value."""

from __future__ import annotations

import enum


class StrEnum(str, enum.Enum):
    def __str__(self) -> str:  # "RUNNING", not "JobState.RUNNING"
        return str.__str__(self)

    def __format__(self, format_spec: str) -> str:
        return str.__format__(self, format_spec)
