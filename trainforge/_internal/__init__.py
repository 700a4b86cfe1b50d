"""Implementation details of trainforge. Nothing here is public API."""
