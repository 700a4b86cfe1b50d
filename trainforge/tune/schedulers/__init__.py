"""Trial schedulers: decide on every reported result whether a trial continues, stops or exploits."""

__all__: list[str] = []
