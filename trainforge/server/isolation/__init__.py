"""How a server a team shares keeps each job to itself: the mechanism chosen at start
(``mechanism``, configured by ``config``), each job's sandbox (``sandboxes``) and ``trainforge server
doctor`` (``doctor``). The kernel-facing parts are the core's (``trainforge._internal.sandbox``)."""
