"""Scheduling: which waiting jobs start, and what they are charged. The pure rule (``rule.decide``
and ``decision``), the waiting queue (``waiting``), fair share and preemption (``sharing``), usage
accounting (``accounting``), elastic sizes (``elastic``) and GPU owners (``gpus``). It imports neither
HTTP nor SQL (an import contract says so): time and state are its inputs."""
