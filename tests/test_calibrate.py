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
from spmdcnn.cost.calibrate import DEFAULT_LINK, host_name
from spmdcnn.cost.machine import load_machine

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MPIEXEC = shutil.which("mpiexec")
# one BLAS thread per rank: the ranks share two cores
ENV = {**{key: value for key, value in os.environ.items() if not key.startswith("SLURM_TOPOLOGY")},
       "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "SPMDCNN_NUM_THREADS": "1",
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


def test_the_host_name_becomes_a_machine_name(monkeypatch):
    import socket
    monkeypatch.setattr(socket, "gethostname", lambda: "gpu node#17.cluster.example")
    assert host_name() == "gpu-node-17"
    monkeypatch.setattr(socket, "gethostname", lambda: "")
    assert host_name() == "measured"


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
    assert machine.name == host_name() != "local"               # named after the host, not the built-in machine
    assert (machine.nodes, machine.devices_per_node) == (1, 2)
    assert machine.intra_node.bandwidth > 1e7 and machine.intra_node.latency < 1e-2
    assert machine.inter_node == machine.intra_node             # one node: nothing to measure between nodes
    assert printed["intra_node"]["bandwidth"] == pytest.approx(machine.intra_node.bandwidth, rel=1e-3)
    raw = machine.measured["intra_node"]
    assert raw["pairs_at_once"] == 1 and len(raw["bytes"]) == len(raw["seconds"]) >= 2
    assert raw["bytes"][0] == 8 and all(t > 0 for t in raw["seconds"])
    assert len(machine.measured["device"]["flops_per_rank"]) == 2 and machine.device.flops > 1e8
    assert machine.measured["placement"] == "block" and "warnings" not in machine.measured
    assert machine.switches == () and "topology variables" in machine.measured["switches"]
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


# --- switch levels from Slurm's topology variables ----------------------------------------------------------------

def test_switch_path_reads_slurm_addresses():
    from spmdcnn.comm.topology import switch_path
    assert switch_path("s0.s3.node17", "switch.switch.node") == ("s0", "s3")
    assert switch_path("node17", "node") == ()
    assert switch_path("s0.n1.cluster.org", "switch.node") == ("s0",)       # a node name with dots
    with pytest.raises(ValueError, match="does not follow SLURM_TOPOLOGY_ADDR_PATTERN='switch.node'"):
        switch_path("n1", "switch.node")             # no switch where the pattern has one
    with pytest.raises(ValueError, match="does not follow"):
        switch_path("s0.n1", "node.switch")


def fake(paths, per_node=1):
    """``(node_of, addresses)`` of nodes with the switch ``paths`` (outermost first), ``per_node`` ranks each."""
    node_of = tuple(n for n in range(len(paths)) for _ in range(per_node))
    return node_of, tuple((".".join([*paths[n], f"node{n}"]), ".".join(["switch"] * len(paths[n]) + ["node"]))
                          for n in node_of)


def test_topology_groups_nodes_by_switch_innermost_first():
    from spmdcnn.comm.topology import find_topology
    # 8 nodes: leaves a, b, c, d of 2 nodes; pods p (a, b) and q (c, d); one spine
    paths = [("top", pod, leaf) for pod, leaves in (("p", "ab"), ("q", "cd")) for leaf in leaves for _ in range(2)]
    found = find_topology(*fake(paths, per_node=2))
    assert found.levels == ((0, 0, 1, 1, 2, 2, 3, 3), (0, 0, 0, 0, 1, 1, 1, 1), (0,) * 8)
    assert found.sizes == (2, 4, 8) and found.block and not found.note
    # a level that groups no further (one pod over everything, under the spine) is dropped
    found = find_topology(*fake([("top", "p", leaf) for leaf in "aabb"]))
    assert found.levels == ((0, 0, 1, 1), (0, 0, 0, 0)) and found.sizes == (2, 4)
    # uneven leaves: sizes round up to multiples; nodes not numbered switch by switch
    found = find_topology(*fake([("t", "a"), ("t", "b"), ("t", "a"), ("t", "a")]))
    assert found.levels == ((0, 1, 0, 0), (0, 0, 0, 0)) and found.sizes == (3, 6) and not found.block
    found = find_topology(*fake([("t", "a"), ("t", "a"), ("t", "a"), ("t", "b")]))
    assert found.sizes == (3, 6) and found.block


def test_topology_says_why_it_has_no_levels():
    from spmdcnn.comm.topology import ABSENT, find_topology
    node_of, addresses = fake([("t", "a"), ("t", "b")])
    assert find_topology(node_of, (addresses[0], None)).note == ABSENT
    assert find_topology(node_of, ()).note == ABSENT and "docs/formats.md#machine-files" in ABSENT
    assert "one node" in find_topology(*fake([("t", "a")], per_node=2)).note
    assert "no common switch" in find_topology(*fake([("t", "a"), ("u", "b")])).note
    assert "different depths" in find_topology(*fake([("t", "a"), ("t",)])).note
    assert "rank 1: SLURM_TOPOLOGY_ADDR='x'" in find_topology(node_of, (addresses[0], ("x", "switch.node"))).note
    both = find_topology((0, 0), (("t.a.n0", "switch.switch.node"), ("t.b.n0", "switch.switch.node")))
    assert "ranks of node 0 disagree" in both.note


def test_pairs_across_each_switch_level():
    from spmdcnn.comm.topology import find_topology, level_node_pairs, loaded_node_pairs, rank_partners
    paths = [("top", pod, leaf) for pod, leaves in (("p", "ab"), ("q", "cd")) for leaf in leaves for _ in range(2)]
    node_of, addresses = fake(paths, per_node=2)
    found = find_topology(node_of, addresses)
    assert level_node_pairs(found, 0) == [(0, 1), (2, 3), (4, 5), (6, 7)]       # within each leaf
    assert level_node_pairs(found, 1) == [(0, 2), (1, 3), (4, 6), (5, 7)]       # leaf to leaf within a pod
    assert level_node_pairs(found, 2) == [(0, 4), (1, 5), (2, 6), (3, 7)]       # pod to pod
    assert loaded_node_pairs(found, 1) == [(0, 2), (1, 3)]                      # both nodes of leaf a to leaf b
    assert loaded_node_pairs(found, 2) == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert rank_partners(node_of, [(0, 4)]) == [8, 9] + [None] * 6 + [0, 1] + [None] * 6
    lonely = find_topology(*fake([("t", "a"), ("t", "a"), ("t", "b")]))         # one node under leaf b
    assert level_node_pairs(lonely, 1) == [(0, 2)] and loaded_node_pairs(lonely, 1) == []
    from spmdcnn.comm.calibrate import allreduce_groups
    assert allreduce_groups((0, 1, 2, 3), (0, 0, 1, 1)) == {"inter_node": [(0, 1)]}   # nodes under node 0's leaf


def test_measured_switch_levels_become_the_machines_switches():
    from spmdcnn.comm.calibrate import LinkMeasurement
    from spmdcnn.comm.topology import find_topology
    from spmdcnn.cost.calibrate import _switches
    from spmdcnn.cost.machine import Link, Machine, Switch, parse_machine_text
    found = find_topology(*fake([("top", pod, leaf) for pod, leaves in (("p", "ab"), ("q", "cd"))
                                 for leaf in leaves for _ in range(2)]))
    sizes = (8, 1 << 20)

    def measured(latency, bandwidth):
        return LinkMeasurement("x", 1, sizes, tuple(latency + s / bandwidth for s in sizes), latency, bandwidth)
    links = {"switches": [(measured(3e-6, 1e10), measured(3e-6, 5e9)), (measured(4e-6, 4e9), None)]}
    switches, record = _switches(found, links, Link(1e10, 2e-6))
    assert switches == (Switch("switch1", 2, Link(1e10, 2e-6)), Switch("switch2", 4, Link(5e9, 3e-6), 2.0),
                        Switch("switch3", 8, Link(4e9, 4e-6), 1.25))
    assert record[1]["loaded"]["fit"] == {"bandwidth": 5e9, "latency": 3e-6}
    assert "not measured" in record[2]["loaded"]
    machine = Machine("m", 8, 1, Link(2e10, 1e-6), Link(1e10, 2e-6), switches=switches)
    assert parse_machine_text(machine.to_yaml(), machine.source) == machine
    assert _switches(find_topology((0,), ()), {}, Link(1, 0)) == ((), find_topology((0,), ()).note)


def test_four_fake_nodes_under_two_switches_measure_both_levels(tmp_path):
    """Each rank a node of its own (the script renames the hosts), Slurm's variables set per rank: nodes 0 and 1
    under leaf s1, 2 and 3 under leaf s2, both leaves under s0."""
    path = tmp_path / "fat.yaml"
    script = os.path.join(ROOT, "tests", "mpi_scripts", "calibrate_fake_nodes.py")
    assert MPIEXEC, "this test needs mpiexec on PATH: pip install mpich (or load the system's MPI)"
    command = []
    for rank in range(4):
        command += [":"] * bool(command) + [
            "-n", "1", "env", f"SLURM_TOPOLOGY_ADDR=s0.s{1 + rank // 2}.node{rank}",
            "SLURM_TOPOLOGY_ADDR_PATTERN=switch.switch.node", sys.executable, script, "calibrate", "-o", str(path),
            "--quick"]
    result = subprocess.run([MPIEXEC, *command], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    machine = load_machine(path)
    assert (machine.nodes, machine.devices_per_node) == (4, 1)
    assert [(s.name, s.nodes) for s in machine.switches] == [("switch1", 2), ("switch2", 4)]
    top = machine.switches[1]
    assert top.link.bandwidth > 1e6 and top.oversubscription >= 1 and machine.level(0, 2) == 2
    record = machine.measured["switches"]
    assert record[1]["pair"]["pairs_at_once"] == 1 and record[1]["loaded"]["pairs_at_once"] == 2
    assert machine.measured["inter_node"]["pairs_at_once"] == 2             # nodes 0-1 and 2-3, within leaves
    assert machine.measured["allreduce"]["inter_node"]["groups"] == [2]     # the nodes under node 0's leaf
    assert "switch level switch2 (4 nodes under one switch)" in result.stdout
