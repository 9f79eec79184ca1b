"""Sums through a parameter server (comm/server.py) in one process: every member of a group pushes and pulls in
a thread of its own over a mailbox that stands in for MPI, for groups laid out over nodes in many ways. Every
member ends with the same bits, summed in the documented order, and the transfers are those the cost model's
ParameterServer charges (within a node: the most members on one node less one; between nodes: the nodes less
one; each way). tests/mpi/test_parameter_server.py runs it on real ranks."""

import collections
import queue
import random
import threading

import numpy as np
import pytest

from spmdcnn.comm.server import Pull, push, routes, tags
from spmdcnn.cost.machine import Link, Machine


class Request:
    """A stand-in MPI request: a send is done when posted; a receive when its message is in the mailbox."""

    def __init__(self, post=None, key=None, buffer=None):
        self.post, self.key, self.buffer, self.done = post, key, buffer, post is None

    def test(self, block=False):
        if not self.done:
            try:
                self.buffer[...] = self.post.box(self.key).get(block=block, timeout=10 if block else None)
                self.done = True
            except queue.Empty:
                if block:
                    raise
        return self.done


class MPI:
    class Request:
        @staticmethod
        def Testall(requests):
            return all([request.test() for request in requests])

        @staticmethod
        def Waitall(requests):
            for request in requests:
                request.test(block=True)


class Member:
    """Member ``rank`` of the group: the communicator calls :class:`Pull` makes, over the shared mailbox."""

    def __init__(self, rank, post):
        self.rank, self.post = rank, post

    def Get_rank(self):
        return self.rank

    def Isend(self, array, dest, tag):
        self.post.send(self.rank, dest, tag, array)
        return Request()

    def Irecv(self, array, source, tag):
        return Request(self.post, (source, self.rank, tag), array)


class Post:
    """The transport's ``exchange`` over in-process queues, one per ``(source, dest, tag)``, made under a lock
    (two threads must not each make one); notes every transfer ``(source, dest, tag)``."""

    def __init__(self):
        self.boxes = {}
        self.sent = []
        self.lock = threading.Lock()

    def box(self, key):
        with self.lock:
            return self.boxes.setdefault(key, queue.Queue())

    def send(self, source, dest, tag, array):
        with self.lock:
            self.sent.append((source, dest, tag))
        self.box((source, dest, tag)).put(array.copy())

    def exchange(self, comm, recvs, sends):
        for array, dest, tag in sends:
            self.send(comm.rank, dest, tag, array)
        for array, source, tag in recvs:
            array[...] = self.box((source, comm.rank, tag)).get(timeout=10)


def run_group(nodes, arrays, tested=False):
    """Every member pushes, then (``tested``: testing it a few times first) waits for its pull, each in a
    thread."""
    post = Post()
    errors = []

    def member(rank):
        try:
            comm = Member(rank, post)
            pull = Pull(arrays[rank], comm, push(arrays[rank], comm, nodes, post), MPI)
            for _ in range(3 if tested else 0):
                pull.test()
            pull.wait()
        except BaseException as error:     # noqa: BLE001 -- reported below
            errors.append(error)
    threads = [threading.Thread(target=member, args=(rank,)) for rank in range(len(nodes))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors and not any(thread.is_alive() for thread in threads), errors
    return post.sent


def expected_sum(nodes, arrays):
    """The documented order: each node's leader adds its members in order; the server adds the other nodes'
    sums in leader order to its own node's."""
    order = list(dict.fromkeys(nodes))
    sums = {}
    for node in order:
        members = [m for m, n in enumerate(nodes) if n == node]
        total = arrays[members[0]].copy()
        for m in members[1:]:
            total += arrays[m]
        sums[node] = total
    total = sums[nodes[0]].copy()
    for node in sorted(order[1:], key=lambda n: nodes.index(n)):
        total += sums[node]
    return total


LAYOUTS = [[0, 0], [0, 1], [0, 0, 0, 0], [0, 0, 1, 1], [0, 1, 2, 3], [0, 0, 0, 1, 1, 2], [3, 3, 1, 1, 1, 7],
           [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3]]


@pytest.mark.parametrize("tested", [False, True], ids=["waited", "tested"])
@pytest.mark.parametrize("nodes", LAYOUTS, ids=lambda nodes: "-".join(map(str, nodes)))
def test_every_member_ends_with_the_same_sum_in_the_documented_order(nodes, tested):
    rng = np.random.default_rng(len(nodes))
    # magnitudes far apart, so that another order of the sums would give other bits
    arrays = [(rng.standard_normal(257) * 10.0 ** rng.integers(-6, 6, 257)).astype(np.float32) for _ in nodes]
    want = expected_sum(nodes, [a.copy() for a in arrays])
    run_group(nodes, arrays, tested)
    for rank, array in enumerate(arrays):
        assert np.array_equal(array, want), f"member {rank}"


@pytest.mark.parametrize("nodes", LAYOUTS, ids=lambda nodes: "-".join(map(str, nodes)))
def test_the_transfers_are_those_the_cost_model_charges(nodes):
    """Each way, the busiest leader receives (g - 1) arrays from its node and the server (n - 1) from the other
    nodes, as ParameterServer(within=g, across=n) charges them; out, the same transfers reversed."""
    sent = run_group(nodes, [np.ones(3, np.float32) for _ in nodes])
    devices_per_node = 100
    machine = Machine("m", 8, devices_per_node, Link(1e9, 0.0), Link(1e8, 0.0), sync="parameter-server")
    group = [node * devices_per_node + member for member, node in enumerate(nodes)]     # the same layout
    server = machine.gradient_sum(group)
    into = collections.Counter((dest, tag) for _, dest, tag in sent)
    assert max((n for (_, tag), n in into.items() if tag == tags(0)[0]), default=0) == server.within - 1
    assert into[0, tags(0)[1]] == server.across - 1
    inward = sorted((a, b) for a, b, tag in sent if tag in tags(0)[:2])
    outward = sorted((b, a) for a, b, tag in sent if tag in tags(0)[2:])
    assert inward == outward and len(inward) == len(nodes) - 1
    nbytes = 1e6
    one_way = (server.within - 1) * nbytes / 1e9 + (server.across - 1) * nbytes / 1e8
    assert server.allreduce(len(nodes), nbytes) == pytest.approx(one_way)      # each way


def test_routes_of_random_layouts_pair_every_send_with_a_receive():
    rng = random.Random(4)
    for _ in range(200):
        nodes = [rng.randrange(4) for _ in range(rng.randrange(2, 12))]
        steps = [routes(nodes, me) for me in range(len(nodes))]
        for index in range(4):
            sends = sorted((me, dest) for me, mine in enumerate(steps) for dest in mine[index].send)
            receives = sorted((source, me) for me, mine in enumerate(steps) for source in mine[index].receive)
            assert sends == receives


def test_pulls_in_flight_together_keep_their_own_sums_whatever_order_they_complete_in():
    """Two sums of one group in flight at once (layers A then B): a node leader whose pull of B completes first
    sends B on first; with a tag pair per sum the members still receive A's sum as A and B's as B."""
    nodes = [0, 0, 1, 1]
    post = Post()
    sums = {name: [np.full(4, (10 ** k) * (rank + 1), np.float32) for rank in range(4)]
            for k, name in enumerate(("A", "B"))}
    want = {name: expected_sum(nodes, [a.copy() for a in arrays]) for name, arrays in sums.items()}
    errors = []

    def member(rank):
        try:
            comm = Member(rank, post)
            pulls = {name: Pull(sums[name][rank], comm, push(sums[name][rank], comm, nodes, post, index), MPI, index)
                     for index, name in enumerate(("A", "B"))}
            if rank == 2:                   # the leader of node 1: B is through before A
                pulls["B"].wait()
            for name in ("A", "B"):
                pulls[name].wait()
        except BaseException as error:     # noqa: BLE001 -- reported below
            errors.append(error)
    threads = [threading.Thread(target=member, args=(rank,)) for rank in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors and not any(thread.is_alive() for thread in threads), errors
    for name, arrays in sums.items():
        for rank, array in enumerate(arrays):
            assert np.array_equal(array, want[name]), (name, rank)
    relayed = [(tag, dest) for source, dest, tag in post.sent if source == 2 and dest == 3]
    assert relayed[0][0] == tags(1)[3] and relayed[1][0] == tags(0)[3]       # B went on first, under B's tag
