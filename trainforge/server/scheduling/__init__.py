"""Scheduling: which waiting jobs start, and what they are charged. The pure rule (``rule.decide``, its
walk ``scan`` and its answer ``decision``), the waiting queue (``waiting``), the scheduling policies
(``policy``: the plug-in interface; ``policies``: priority, quota, fair_share, preemption,
max_running and the registry by name), the inputs a shared server adds (``sharing``: ``Team``,
``RunningJob``), the arithmetic on resources (``resources``), the ``ResourceLedger`` that alone owns
what running jobs hold and charges their usage (``ledger``, ``accounting``, ``gpus``) and the rules'
configuration (``team_policy``). It imports neither HTTP nor SQL nor the store (an import contract
says so): time and state are its inputs."""
