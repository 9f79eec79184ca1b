"""A replica group's gradients summed through a parameter server (machine files' ``sync: parameter-server``), as
Jia et al.'s runtime synchronized parameters: every member's gradients go to the group's server, which sums them
and sends the sum back, layer by layer, on the critical path.

On the way in, the members of each node send to the node's first member (its leader), which adds them to its own
and sends the node's sum to the server (the group's first member, the leader of its node); on the way out the
server sends the sum to the other leaders and each leader to its node's members. One way thus takes ``g - 1``
transfers within a node and ``n - 1`` between nodes (``g`` the most members on a node, ``n`` the nodes), the
paper's simulator's ``t_s``, which :class:`~spmdcnn.cost.machine.ParameterServer` charges each way. Sums are
taken in member order (a leader: its own, then its node's members'; the server: its node's sum, then the other
nodes' in leader order), so every member ends with the same bits.

:func:`routes` is the schedule (pure: who receives from and sends to whom at each of the four steps);
:func:`serve` runs it over an MPI communicator through the transport's exchange (all receives posted, then the
sends, then a wait: deadlock-free).
"""

from typing import NamedTuple

import numpy as np

TAGS = (7101, 7102, 7103, 7104)     # in to the leaders, in to the server, out to the leaders, out to the members


class Step(NamedTuple):
    """One member's part of one step: the members it receives from (whose arrays it adds to its own, in this
    order, on the way in; the one whose array replaces its own, on the way out) and those it sends to."""

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
    others = tuple(sorted(l for l in leaders.values() if l != server))
    none = Step((), ())
    if me != leader:
        return (Step((), (leader,)), none, none, Step((leader,), ()))
    if me != server:
        return (Step(mates, ()), Step((), (server,)), Step((server,), ()), Step((), mates))
    return (Step(mates, ()), Step(others, ()), Step((), others), Step((), mates))


def serve(array, comm, nodes, transport):
    """Sum the contiguous host ``array`` over ``comm``'s members in place through the server (``nodes``: the node
    of each member, in rank order); ``transport``'s exchange moves the bytes."""
    me = comm.Get_rank()
    for step, tag in zip(routes(nodes, me), TAGS):
        inbound = tag in TAGS[:2]
        buffers = [np.empty_like(array) for _ in step.receive] if inbound else [array] * len(step.receive)
        transport.exchange(comm, [(buffer, source, tag) for buffer, source in zip(buffers, step.receive)],
                           [(array, dest, tag) for dest in step.send])
        if inbound:
            for buffer in buffers:
                array += buffer
    return array
