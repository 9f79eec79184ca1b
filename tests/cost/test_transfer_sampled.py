"""The transfer tables on many devices: over a sample of the devices (a lower bound, entry by entry, and the
exact table when the sample is every device), with dimensions one by one instead of in pairs (the same numbers),
on machines with switch levels above the nodes (equal to the exchange costed tile pair by tile pair), and one
pair the tables' way (equal to the pair-by-pair exchange)."""

import os

import numpy as np
import pytest

from spmdcnn.cost import layout, transfer
from spmdcnn.cost.compute import ComputeModel
from spmdcnn.cost.layout import _unique_rows
from spmdcnn.cost.machine import parse_machine_text
from spmdcnn.cost.model import CostModel
from spmdcnn.graph import load_model
from spmdcnn.graph.blocks import DATA
from spmdcnn.planner.configs import configurations

MODELS = os.path.join(os.path.dirname(__file__), "..", "..", "models")
LEVELS = parse_machine_text("""
format: spmdcnn-machine/1
name: four-levels
nodes: 16
devices_per_node: 2
intra_node: {bandwidth: 1.0e+11, latency: 1.0e-6}
inter_node: {bandwidth: 2.0e+10, latency: 3.0e-6}
switches:
  - {name: leaf, nodes: 2}
  - {name: pod, nodes: 4, oversubscription: 2, latency: 5.0e-6}
  - {name: spine, nodes: 16, oversubscription: 3, latency: 9.0e-6}
""")
TWO_LEVELS = parse_machine_text("""
format: spmdcnn-machine/1
name: two-levels
nodes: 16
devices_per_node: 4
intra_node: {bandwidth: 1.8e+10, latency: 1.0e-5}
inter_node: {bandwidth: 1.2e+10, latency: 2.0e-5}
""")
CASES = [("small_resnet", 16, TWO_LEVELS), ("small_inception", 8, LEVELS), ("alexnet", 16, LEVELS),
         ("cifar_cnn", 20, LEVELS), ("small_resnet", 12, LEVELS)]


def edges(name, devices, machine, batch=None):
    """``(traffic, producers, consumers)`` of every edge of model ``name`` on ``devices`` devices of ``machine``."""
    graph = load_model(os.path.join(MODELS, f"{name}.yaml"))
    batch = batch or 2 * devices
    cost = CostModel(graph, batch, machine, ComputeModel(machine.device))
    for layer in graph.layers:
        for slot, ref in enumerate(layer.inputs):
            if ref != DATA:
                yield (cost.edge(layer, slot), configurations(graph.by_name[ref], batch, devices),
                       configurations(layer, batch, devices))


@pytest.mark.parametrize("name,devices,machine", CASES, ids=[f"{n}-{d}-{m.name}" for n, d, m in CASES])
def test_a_sample_of_the_devices_bounds_the_table_and_all_of_them_give_it(name, devices, machine):
    tight = 0
    for traffic, producers, consumers in edges(name, devices, machine):
        seconds, nbytes = traffic.table(producers, consumers)
        every = traffic.table(producers, consumers, tuple(range(devices)))
        assert np.array_equal(every[0], seconds) and np.array_equal(every[1], nbytes)
        for sample in [(0,), (0, devices // 2 + 1), (devices - 1, 3, 5)]:
            low, _ = traffic.table(producers, consumers, sample)
            assert (low <= seconds).all()
            tight += int((low == seconds).sum())
    assert tight > 0        # the bounds meet the table somewhere: a bound of zeros would not


@pytest.mark.parametrize("name,devices,machine", CASES[:3], ids=[f"{n}-{d}-{m.name}" for n, d, m in CASES[:3]])
def test_dimensions_one_by_one_give_the_tables_of_pairs(name, devices, machine, monkeypatch):
    found = [traffic.table(producers, consumers) for traffic, producers, consumers in edges(name, devices, machine)]
    monkeypatch.setattr(layout, "PAIR_ENTRIES", 0)
    layout.layout_of.cache_clear()
    for (seconds, nbytes), (traffic, producers, consumers) in zip(found, edges(name, devices, machine)):
        single = traffic.table(producers, consumers)
        assert np.array_equal(single[0], seconds) and np.array_equal(single[1], nbytes)
    layout.layout_of.cache_clear()


@pytest.mark.parametrize("name,devices", [("small_inception", 8), ("small_resnet", 32), ("cifar_cnn", 12),
                                          ("alexnet", 16)])
def test_switch_levels_price_the_tables_as_the_pairs_of_tiles(name, devices):
    """The per-level windows of the tables against the exchange costed tile pair by tile pair over
    ``Machine.matrices`` (every level's link), on a machine of four levels that cuts configurations anywhere."""
    for traffic, producers, consumers in edges(name, devices, LEVELS, batch=2 * devices + 1):
        rng = np.random.default_rng(len(producers))
        rows = rng.choice(len(producers), min(12, len(producers)), replace=False)
        cols = rng.choice(len(consumers), min(12, len(consumers)), replace=False)
        picked = [producers[i] for i in rows], [consumers[j] for j in cols]
        seconds, nbytes = traffic.table(*picked)
        pairs_seconds, pairs_bytes = traffic._table_by_pairs(*picked)
        np.testing.assert_allclose(seconds, pairs_seconds, rtol=1e-12, atol=0)
        np.testing.assert_allclose(nbytes, pairs_bytes, rtol=1e-12, atol=0)


def test_one_pair_the_tables_way_is_the_exchange(monkeypatch):
    """From ``TABLED`` devices on, ``forward`` costs a pair through the tables: the same as tile pair by pair."""
    monkeypatch.setattr(transfer, "TABLED", 1)
    for traffic, producers, consumers in edges("small_resnet", 16, LEVELS):
        for p, q in zip(producers[::7], consumers[::5]):
            traffic._forward.clear()
            got, want = traffic.forward(p, q), traffic._exchange(p, q)
            assert got.seconds == pytest.approx(want.seconds, rel=1e-12, abs=0)
            assert got.bytes == want.bytes


def test_rows_read_as_numbers_are_unique_rows():
    rng = np.random.default_rng(3)
    for columns in (1, 2, 4):
        rows = rng.integers(0, 5, size=(200, columns))
        found, ids = _unique_rows(rows)
        expected, inverse = np.unique(rows, axis=0, return_inverse=True)
        assert np.array_equal(found, expected) and np.array_equal(ids, inverse.reshape(-1))
        assert np.array_equal(found[ids], rows)
    huge = np.array([[2 ** 40, 1], [0, 2 ** 40], [2 ** 40, 1]])          # too wide for one number: the rows' way
    found, ids = _unique_rows(huge)
    assert np.array_equal(found[ids], huge) and len(found) == 2
