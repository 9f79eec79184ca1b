"""Tests that run on any number of ranks: ``mpiexec -n K python -m mpi4py -m pytest tests/mpi`` (tests/test_mpi.py
launches them for K = 2, 3, 4; a plain ``pytest`` runs them on one rank).

Every check collects its mismatches on each rank and all ranks compare the union (:func:`agree`), so one rank's
failure fails the test on every rank instead of leaving the others waiting in the next collective.

A test marked ``@pytest.mark.ranks(K, ...)`` runs on those rank counts only (deselected on the others, one process
included): what it checks does not depend on how many ranks share the work beyond them, and running it again on
another count would check the same thing twice.
"""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))     # tests/: shared helpers

from spmdcnn.comm import World  # noqa: E402

WORLD = World.create()


@pytest.fixture
def world():
    return WORLD


def agree(world, problems):
    """Fail on every rank when any rank found a problem."""
    everyone = world.allgather(list(problems))
    found = [f"rank {rank}: {p}" for rank, items in enumerate(everyone) for p in items]
    assert not found, "\n".join(found[:20]) + (f"\n... {len(found) - 20} more" if len(found) > 20 else "")


def pytest_collection_modifyitems(config, items):
    """Deselect the tests of this folder marked ``ranks`` with counts other than this world's size."""
    here = os.path.dirname(os.path.abspath(__file__))
    kept, dropped = [], []
    for item in items:
        marker = item.get_closest_marker("ranks")
        elsewhere = marker is not None and str(item.path).startswith(here) and WORLD.size not in marker.args
        (dropped if elsewhere else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
