"""The error every rank raises together, in a module of its own: the transports and the world both raise it, and
neither needs to import the other for it."""


class CollectiveError(RuntimeError):
    """An error every rank raises at the same point (so no rank is left waiting): rank 0 reports it once and
    every rank exits normally."""

    collective = True
