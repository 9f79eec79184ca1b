"""The exchange (comm/exchange.py) on one rank: a tile that reads the middle rows of its producer's tile gets a
view forward, and backward its gradient is added into the producer tile's with the ``accumulate`` it was given
(by default ``+=``; the runtime passes ops.add.accumulate). tests/mpi/test_adjoint.py checks the exchanges of
random plans on real ranks."""

import numpy as np
import pytest

from spmdcnn.comm import Exchange, World
from spmdcnn.ops.add import accumulate as ops_accumulate
from spmdcnn.tiling.fields import Need
from spmdcnn.tiling.transfers import Transfer

TILE = ((0, 4), (0, 3))
MIDDLE = ((1, 3), (0, 3))


def _exchange(**options):
    world = World(None)
    transfers = [Transfer(slot=0, src=0, dst=0, box=MIDDLE, src_box=TILE, dst_box=MIDDLE)]
    return world, Exchange(world, transfers, np.float64, np, **options)


def test_forward_passes_a_view_of_the_producer_tile():
    _, exchange = _exchange()
    tile = np.arange(12.0).reshape(4, 3)
    inputs = exchange.forward({0: tile}, {0: Need(MIDDLE)})
    assert np.shares_memory(inputs[0], tile) and np.array_equal(inputs[0], tile[1:3])
    assert not exchange.remote


@pytest.mark.parametrize("accumulate", [None, ops_accumulate], ids=["default", "ops.add"])
def test_the_adjoint_adds_the_gradient_into_the_producer_tile(accumulate):
    world, exchange = _exchange(accumulate=accumulate)
    gradient = np.arange(1.0, 7.0).reshape(2, 3)
    result = exchange.adjoint({0: gradient}, {0: TILE}, {0})
    expected = np.zeros((4, 3))
    expected[1:3] = gradient
    assert np.array_equal(result[0], expected)
    assert world.counters.transfer_s == 0 and world.counters.bytes_transferred == 0


def test_the_adjoint_sums_with_the_accumulate_it_was_given():
    calls = []

    def subtract(target, source):
        calls.append((target.shape, source.shape))
        target -= source
    _, exchange = _exchange(accumulate=subtract)
    gradient = np.ones((2, 3))
    result = exchange.adjoint({0: gradient}, {0: TILE}, {0})
    assert calls == [((2, 3), (2, 3))]
    assert np.array_equal(result[0], [[0, 0, 0], [-1, -1, -1], [-1, -1, -1], [0, 0, 0]])


def test_slots_without_a_gradient_get_none():
    _, exchange = _exchange(accumulate=lambda target, source: pytest.fail("accumulated"))
    assert exchange.adjoint({0: np.ones((2, 3))}, {0: TILE}, set()) == {}
