"""Stand-ins for mpi4py in one process: a communicator of several ranks seen from one of them, and the parts of
the MPI module comm/ uses. What the other ranks hold is what the test says they hold."""


class FakeComm:
    """Rank ``rank`` of ``size``. ``allgather`` returns ``gathered(this rank's object)`` (default: every rank
    holds the same); ``Split`` makes a two-rank sub-communicator and notes its arguments; a receive's ``test``
    answers ``polls`` one after the other, ``(done, object)``."""

    def __init__(self, rank=0, size=2, gathered=None, polls=()):
        self.rank, self.size = rank, size
        self.gathered = gathered or (lambda obj: [obj] * size)
        self.polls = list(polls)
        self.splits, self.sent, self.aborted = [], [], None

    def Get_rank(self):
        return self.rank

    def Get_size(self):
        return self.size

    def allgather(self, obj):
        return self.gathered(obj)

    def Split(self, color, key):
        self.splits.append((color, key))
        return FakeComm(rank=0, size=2)

    def Dup(self):
        return FakeComm(rank=self.rank, size=self.size)

    def Abort(self, status):
        self.aborted = status

    def isend(self, obj, dest, tag):
        self.sent.append((obj, dest, tag))
        return ("send", dest)

    def irecv(self, source, tag):
        return self

    def test(self):
        return self.polls.pop(0)


class FakeMPI:
    """The MPI module as comm/ uses it: ``COMM_WORLD``, ``UNDEFINED`` and ``Request.waitall``."""

    UNDEFINED = -32766

    def __init__(self, world=None):
        self.COMM_WORLD = world
        self.waited = waited = []

        class Request:
            @staticmethod
            def waitall(requests):
                waited.append(list(requests))
        self.Request = Request

    def __call__(self):
        """comm/ reaches MPI through ``mpi()``: the fake stands for that function too."""
        return self
