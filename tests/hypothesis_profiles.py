"""The Hypothesis profiles of the suite, chosen by ``$HYPOTHESIS_PROFILE`` (conftest.py loads it;
scripts/test.sh sets it):

- ``thorough`` (the default, and the full suite's lanes): Hypothesis's 100 examples and no deadline
  (a deadline is a timing assertion: on a loaded machine a 200 ms one failed a correct property), and
  each property's own ``max_examples`` as it asks (``examples(300)`` is 300);
- ``quick`` (``scripts/test.sh --quick``, the edit loop): at most :data:`QUICK_EXAMPLES` examples a
  property and no deadline, so the scheduler's properties (hundreds of examples, 25-70 s each when
  thorough) take seconds. A property found wrong by the thorough lanes fails there.

A property that wants more than 100 examples (or fewer) says so with ``examples(n)``::

    @settings(max_examples=examples(300), deadline=None)
"""

from __future__ import annotations

import os

from hypothesis import settings

QUICK_EXAMPLES = 15
PROFILES = ("quick", "thorough")
ENV_PROFILE = "HYPOTHESIS_PROFILE"

settings.register_profile("thorough", deadline=None)
settings.register_profile("quick", max_examples=QUICK_EXAMPLES, deadline=None)


def profile() -> str:
    """The profile ``$HYPOTHESIS_PROFILE`` names (``thorough`` if unset)."""
    name = os.environ.get(ENV_PROFILE) or "thorough"
    if name not in PROFILES:
        raise ValueError(f"${ENV_PROFILE}={name!r}: give one of {', '.join(PROFILES)} (or leave it unset: thorough)")
    return name


def load() -> None:
    settings.load_profile(profile())


def examples(n: int) -> int:
    """The examples a property that asks ``n`` runs: ``n`` (thorough), at most QUICK_EXAMPLES (quick)."""
    return n if profile() == "thorough" else min(n, QUICK_EXAMPLES)
