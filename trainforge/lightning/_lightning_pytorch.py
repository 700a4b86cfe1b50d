"""trainforge's Lightning classes for the ``lightning.pytorch`` namespace (see ``_classes``)."""

from trainforge.lightning._classes import build

globals().update(build("lightning.pytorch"))
