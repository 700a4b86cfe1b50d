"""A server a team shares: its users, roles and tokens (``users``), job credentials (``job_tokens``)
and the audit log of every state-changing request (``audit``)."""
