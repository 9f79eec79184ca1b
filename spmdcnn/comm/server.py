"""A replica group's gradients summed through a parameter server (machine files' ``sync: parameter-server``), as
Jia et al.'s runtime synchronized parameters: after a layer's backward every member pushes its gradients to the
group's server, which sums them, and the sum is pulled back before the layer's update.

On the way in, the members of each node send to the node's first member (its leader), which adds them to its own
and sends the node's sum to the server (the group's first member, the leader of its node); on the way out the
server sends the sum to the other leaders and each leader to its node's members. One way thus takes ``g - 1``
transfers within a node and ``n - 1`` between nodes (``g`` the most members on a node, ``n`` the nodes), the
paper's simulator's ``t_s``, which :class:`~spmdcnn.cost.machine.ParameterServer` charges. The push is done when
:func:`push` returns (backward goes on after it, as the paper's cost model has it); the pull (:class:`Pull`) is
posted then and completed before the update, so it overlaps the rest of backward. Sums are taken in member order
(a leader: its own, then its node's members'; the server: its node's sum, then the other nodes' in leader order),
so every member ends with the same bits.

:func:`routes` is the schedule (pure: who receives from and sends to whom at each of the four steps). Every step
posts its receives, then its sends, then waits (a leader's part of the pull: the receive from the server is posted
with the pull, its sends once that receive is complete): no rank waits on a message not yet posted by a rank that
waits on it. Each of a group's sums has its own tags (:func:`tags`), so pulls in flight together cannot take each
other's messages, whatever order they complete in.
"""

from typing import NamedTuple

import numpy as np

TAG_BASE = 7100
STEPS = 4       # in to the leaders, in to the server, out to the leaders, out to the members


def tags(index):
    """The four steps' tags of the group's sum number ``index`` (its place among the group's sums, the same on
    every member): each sum has tags of its own, so pulls in flight together never take each other's messages
    whatever order they complete in (a leader forwards each as it arrives)."""
    first = TAG_BASE + STEPS * index
    return tuple(range(first, first + STEPS))


class Step(NamedTuple):
    """One member's part of one step: the members it receives from (whose arrays it adds to its own, on the way
    in; whose array becomes its own, on the way out) and those it sends to."""

    receive: tuple
    send: tuple


def routes(nodes, me):
    """The four :class:`Step` s of member ``me`` of a group whose members are on ``nodes`` (a node id per member,
    in member order): in to the node leaders, in to the server, out to the leaders, out to the members."""
    leaders = {}
    for member, node in enumerate(nodes):
        leaders.setdefault(node, member)
    leader, server = leaders[nodes[me]], 0
    mates = tuple(m for m, node in enumerate(nodes) if node == nodes[me] and m != me)
    others = tuple(sorted(other for other in leaders.values() if other != server))
    none = Step((), ())
    if me != leader:
        return (Step((), (leader,)), none, none, Step((leader,), ()))
    if me != server:
        return (Step(mates, ()), Step((), (server,)), Step((server,), ()), Step((), mates))
    return (Step(mates, ()), Step(others, ()), Step((), others), Step((), mates))


def push(array, comm, nodes, transport, index=0):
    """Push the contiguous host ``array`` of every member of ``comm`` to the server (``nodes``: the node of each
    member, in rank order; ``index``: the sum's number, :func:`tags`), through ``transport``'s exchange; on the
    server (and a leader) ``array`` then holds the sum (of its node's). Returns the member's four steps, for
    :class:`Pull`."""
    steps = routes(nodes, comm.Get_rank())
    for step, tag in zip(steps[:2], tags(index)[:2]):
        buffers = [np.empty_like(array) for _ in step.receive]
        transport.exchange(comm, [(buffer, source, tag) for buffer, source in zip(buffers, step.receive)],
                           [(array, dest, tag) for dest in step.send])
        for buffer in buffers:
            array += buffer
    return steps


class Pull:
    """The sum on its way back from the server into ``array`` (after :func:`push`, which gave ``steps``, of the
    group's sum number ``index``)."""

    finished_at = None          # no clock of its own: the caller sees when it completed

    def __init__(self, array, comm, steps, mpi, index=0):
        self.array, self.comm, self.mpi = array, comm, mpi
        self.tags = tags(index)
        self.relay = steps[3].send          # a leader's members, once its part has come
        self.requests = [comm.Isend(array, dest=dest, tag=self.tags[2]) for dest in steps[2].send]
        self.incoming = [comm.Irecv(array, source=source, tag=self.tags[2 + bool(steps[3].receive)])
                         for source in steps[2].receive + steps[3].receive]
        if not self.incoming:               # the server: its own members too at once
            self._relay()

    def _relay(self):
        self.requests += [self.comm.Isend(self.array, dest=dest, tag=self.tags[3]) for dest in self.relay]
        self.relay = ()

    def test(self):
        """Whether the sum is in ``array`` and every send of it done; a leader whose part has come sends it on to
        its node's members here. Lets MPI progress what is posted."""
        if self.incoming and self.mpi.Request.Testall(self.incoming):
            self.incoming = []
            self._relay()
        return not self.incoming and self.mpi.Request.Testall(self.requests)

    def wait(self):
        """Wait until the sum is in ``array`` (a leader sends it on first) and every send of it is done."""
        if self.incoming:
            self.mpi.Request.Waitall(self.incoming)
            self.incoming = []
            self._relay()
        self.mpi.Request.Waitall(self.requests)
