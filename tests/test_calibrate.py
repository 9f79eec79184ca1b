"""``spmdcnn calibrate``: the link fit and rank pairing (pure), one process (device rates, default links), and two
ranks under ``mpiexec`` (measured links). Every launch has a timeout, so a deadlock fails instead of hanging."""

import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from spmdcnn.cli import main
from spmdcnn.comm.calibrate import Placement, fit_link, inter_node_partners, intra_node_partners
from spmdcnn.cost.calibrate import DEFAULT_LINK
from spmdcnn.cost.machine import load_machine

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MPIEXEC = shutil.which("mpiexec")
# one BLAS thread per rank: the ranks share two cores
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "SPMDCNN_NUM_THREADS": "1",
       "PYTHONUNBUFFERED": "1"}


def spmdcnn(*args):
    return [sys.executable, "-m", "spmdcnn.cli", *map(str, args)]


def launch(command, ranks=1, timeout=120):
    prefix = []
    if ranks > 1:
        assert MPIEXEC, "this test needs mpiexec on PATH: pip install mpich (or load the system's MPI)"
        prefix = [MPIEXEC, "-n", str(ranks)]
    return subprocess.run([*prefix, *command], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=timeout)


# --- the fit and the pairs (pure) ---------------------------------------------------------------------------------

def test_fit_recovers_latency_and_bandwidth_of_exact_points():
    sizes = [8, 1 << 10, 1 << 16, 1 << 20, 1 << 22, 1 << 24]
    latency, bandwidth = fit_link(sizes, [3e-6 + s / 8e9 for s in sizes])
    assert latency == pytest.approx(3e-6, rel=1e-6) and bandwidth == pytest.approx(8e9, rel=1e-6)


def test_fit_of_noisy_points_takes_latency_from_small_and_bandwidth_from_large_messages():
    sizes = np.array([8, 1 << 10, 1 << 16, 1 << 20, 1 << 22, 1 << 24])
    noise = np.random.default_rng(0).uniform(0.95, 1.05, sizes.size)
    latency, bandwidth = fit_link(sizes, (2e-5 + sizes / 1e10) * noise)
    assert latency == pytest.approx(2e-5, rel=0.1) and bandwidth == pytest.approx(1e10, rel=0.1)


def test_fit_clamps_a_negative_latency_and_survives_flat_times():
    sizes = [1 << 20, 1 << 22, 1 << 24]
    latency, bandwidth = fit_link(sizes, [s / 1e10 - 2e-5 for s in sizes])      # a line of latency -20 us
    assert latency == 0 and bandwidth == pytest.approx(1e10, rel=0.25)
    latency, bandwidth = fit_link([8, 1 << 20], [2e-6, 1e-6])                    # time falls as size grows
    assert latency == 1e-6 and bandwidth == (1 << 20) / 1e-6


def test_fit_refuses_too_few_or_non_positive_points():
    with pytest.raises(ValueError, match="two or more positive sizes"):
        fit_link([8], [1e-6])
    with pytest.raises(ValueError, match="two or more positive sizes"):
        fit_link([8, 1024], [1e-6, 0.0])


def test_partners_pair_ranks_within_a_node_and_across_node_pairs():
    node_of = (0, 0, 0, 1, 1, 1, 2)         # 3 + 3 + 1 ranks
    assert intra_node_partners(node_of) == [1, 0, None, 4, 3, None, None]
    assert inter_node_partners(node_of) == [3, 4, 5, 0, 1, 2, None]
    assert intra_node_partners((0, 1)) == [None, None]
    assert inter_node_partners((0, 0)) == [None, None]


def test_placement_that_is_not_node_by_node_is_reported():
    block = Placement(("a", "a", "b", "b"), (0, 0, 1, 1), 2)
    assert block.block and block.nodes == 2 and block.warning() is None
    cyclic = Placement(("a", "b", "a", "b"), (0, 1, 0, 1), 2)
    assert not cyclic.block
    assert "rank 1 is on node 1" in cyclic.warning() and "node by node" in cyclic.warning()


# --- the command --------------------------------------------------------------------------------------------------

def test_one_process_measures_the_device_and_writes_default_links(tmp_path):
    path = tmp_path / "new" / "one.yaml"
    result = launch(spmdcnn("calibrate", "-o", path, "--quick", "--name", "box-1"))
    assert result.returncode == 0, result.stderr
    assert "need mpiexec -n 2" in result.stdout and f"wrote {path}" in result.stdout
    machine = load_machine(path)
    assert machine.name == "box-1" and (machine.nodes, machine.devices_per_node) == (1, 1)
    assert machine.intra_node == machine.inter_node == DEFAULT_LINK
    device = machine.device
    assert device.flops > 1e8 and device.memory_bandwidth > 1e8 and 0 < device.overhead < 1e-3
    assert device.name.endswith(tuple(f" x{n}" for n in range(1, 1025)))
    assert machine.measured["ranks"] == 1 and machine.measured["quick"] is True
    assert "not measured" in machine.measured["intra_node"]


def test_two_ranks_measure_the_link_within_the_node(tmp_path):
    path = tmp_path / "two.yaml"
    result = launch(spmdcnn("calibrate", "-o", path, "--quick", "--json"), ranks=2, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    printed = json.loads(result.stdout)         # rank 0 alone prints
    machine = load_machine(path)
    assert (machine.nodes, machine.devices_per_node) == (1, 2)
    assert machine.intra_node.bandwidth > 1e7 and machine.intra_node.latency < 1e-2
    assert machine.inter_node == machine.intra_node             # one node: nothing to measure between nodes
    assert printed["intra_node"]["bandwidth"] == pytest.approx(machine.intra_node.bandwidth, rel=1e-3)
    raw = machine.measured["intra_node"]
    assert raw["pairs_at_once"] == 1 and len(raw["bytes"]) == len(raw["seconds"]) >= 2
    assert raw["bytes"][0] == 8 and all(t > 0 for t in raw["seconds"])
    assert len(machine.measured["device"]["flops_per_rank"]) == 2 and machine.device.flops > 1e8
    assert machine.measured["placement"] == "block" and "warnings" not in machine.measured
    allreduce = machine.measured["allreduce"]["intra_node"]
    assert allreduce["groups"] == [2] and allreduce["bytes"][0] == 8 and len(allreduce["seconds"][0]) >= 2
    regimes = machine.allreduce["intra_node"]
    assert regimes.small.bandwidth > 1e6 and regimes.large.bandwidth > 1e6 and regimes.large.latency < 1e-2


def test_the_allreduce_fit_recovers_both_regimes_from_exact_points():
    from spmdcnn.comm.calibrate import fit_allreduce
    groups, sizes = (2, 4, 8), (8, 512, 1 << 15, 1 << 20, 1 << 22, 1 << 24)
    small, large = (2e-6, 4e9), (8e-6, 1.2e10)

    def time(p, n):
        doubling = math.ceil(math.log2(p)) * (small[0] + n / small[1])
        ring = 2 * (p - 1) * (large[0] + n / p / large[1])
        return doubling if n <= 1 << 16 else ring
    seconds = [[time(p, n) for n in sizes] for p in groups]
    got_small, got_large = fit_allreduce(groups, sizes, seconds)
    assert got_small == pytest.approx(small, rel=1e-6) and got_large == pytest.approx(large, rel=1e-6)


def test_allreduce_groups_are_prefixes_of_a_node_and_of_the_node_leaders():
    from spmdcnn.comm.calibrate import allreduce_groups
    assert allreduce_groups((0, 0, 0, 0, 0, 0)) == {"intra_node": [(0, 1), (0, 1, 2, 3), (0, 1, 2, 3, 4, 5)]}
    assert allreduce_groups((0, 0, 1, 1, 2, 2)) == {"intra_node": [(0, 1)], "inter_node": [(0, 2), (0, 2, 4)]}
    assert allreduce_groups((0, 1)) == {"inter_node": [(0, 1)]}
    assert allreduce_groups((0,)) == {}


def test_calibrate_help(capsys):
    with pytest.raises(SystemExit) as info:
        main(["calibrate", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: spmdcnn calibrate") and "--quick" in out and "mpiexec" in out


@pytest.mark.parametrize("args, message", [
    (["--name", "my machine"], "machine name 'my machine' may use only"),
    ([], "is a directory"),
])
def test_calibrate_errors_name_the_problem(tmp_path, capsys, args, message):
    output = tmp_path if not args else tmp_path / "m.yaml"
    code = main(["calibrate", "-o", str(output), "--quick", *args])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.startswith("spmdcnn: error:")
    assert not (tmp_path / "m.yaml").exists()


def test_the_links_are_measured_through_the_worlds_transport():
    """calibrate times exchanges as training makes them: through the world's transport, which it records."""
    from spmdcnn.comm import World
    from spmdcnn.comm.transport import HostTransport
    from spmdcnn.cost.calibrate import calibrate, summary

    class Counting(HostTransport):
        name = "counting"
    world = World(None)
    world.use(Counting())
    machine = calibrate(world, "t", quick=True)
    assert machine.measured["transport"] == "counting"
    assert "links measured through the counting transport" in "\n".join(summary(machine))
