"""trainforge's Lightning classes for the standalone ``pytorch_lightning`` namespace (see ``_classes``)."""

from trainforge.lightning._classes import build

globals().update(build("pytorch_lightning"))
