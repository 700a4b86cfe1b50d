"""Tune experiments on the train server: the trials Tune submits as jobs, grouped by experiment
(``book``), their numbers (``trial_stats``), parameter importance (``importance``), the API's schemas
(``schemas``) and what the API and pages show of them (``views``)."""
