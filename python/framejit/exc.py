"""Exceptions and warnings framejit raises."""


class Unsupported(RuntimeError):
    """Raised with ``fullgraph=True`` when a frame cannot be traced into one graph.

    The message names the reason, its category, and the user's file, line and source text.
    """


class FramejitWarning(UserWarning):
    """framejit fell back to plain Python for something it should have handled, or hit a limit."""


class RankDivergence(RuntimeError):
    """Under torch.distributed: the ranks of one process group took different compile decisions
    for a distributed model (a guard only some ranks have, a recompile on one rank only). The
    message names the region and the guard."""
