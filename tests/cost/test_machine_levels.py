"""Machines with switches above the nodes (``switches`` in a machine file): parsing and its errors, levels, links,
matrices, allreduce regimes by span and their scaling, parameter servers, tiers, the YAML round trip, and the
shipped machines without switches unchanged."""

import glob
import os

import numpy as np
import pytest

from spmdcnn.cost.machine import (Link, MachineError, Regimes, Switch, default_machine, load_machine,
                                  parse_machine_text)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# 8 nodes of 2 devices; a leaf switch over each 2 nodes, a pod over each 4, the spine over all 8.
# Links worked by hand: intra (100, 1); leaf = inter_node (40, 2); pod 40 / 2 = 20 with latency 3;
# spine 20 / 4 = 5 with the pod's latency 3.
THREE = """\
format: spmdcnn-machine/1
name: three
nodes: 8
devices_per_node: 2
intra_node: {bandwidth: 100, latency: 1}
inter_node: {bandwidth: 40, latency: 2}
switches:
  - {name: leaf, nodes: 2}
  - {name: pod, nodes: 4, oversubscription: 2, latency: 3}
  - {name: spine, nodes: 8, oversubscription: 4}
"""
INTRA, INTER, POD, SPINE = Link(100, 1), Link(40, 2), Link(20, 3), Link(5, 3)
REGIMES = """\
allreduce:
  intra_node: {small: {bandwidth: 50, latency: 0.5}, large: {bandwidth: 90, latency: 0.25}}
  inter_node: {small: {bandwidth: 30, latency: 0.5}, large: {bandwidth: 36, latency: 1.5}}
"""


def three(extra=""):
    return parse_machine_text(THREE + extra, "three.yaml")


def test_switches_parse_into_levels_with_derived_links():
    machine = three()
    assert machine.switches == (Switch("leaf", 2, INTER), Switch("pod", 4, POD, 2.0), Switch("spine", 8, SPINE, 4.0))
    assert machine.level_names == ("intra_node", "inter_node", "pod", "spine")
    assert [machine.level_link(level) for level in range(4)] == [INTRA, INTER, POD, SPINE]


def test_given_bandwidth_and_latency_override_the_derived_ones():
    text = THREE.replace("{name: spine, nodes: 8, oversubscription: 4}",
                         "{name: spine, nodes: 8, oversubscription: 4, bandwidth: 7, latency: 0.5}")
    assert parse_machine_text(text).switches[2].link == Link(7, 0.5)
    first = THREE.replace("{name: leaf, nodes: 2}", "{name: leaf, nodes: 2, oversubscription: 4}")
    machine = parse_machine_text(first)     # the first level's oversubscription divides inter_node
    assert machine.level_link(1) == Link(10, 2) and machine.level_link(2) == Link(5, 3)
    assert machine.inter_node == INTER


@pytest.mark.parametrize("a, b, level", [
    (0, 0, 0), (0, 1, 0), (0, 2, 1), (1, 3, 1), (0, 4, 2), (3, 7, 2), (0, 8, 3), (7, 8, 3), (8, 15, 2),
    (12, 14, 1), (15, 0, 3)])
def test_level_and_link_of_two_devices(a, b, level):
    machine = three()
    assert machine.level(a, b) == level
    assert machine.link(a, b) == [INTRA, INTER, POD, SPINE][level]


def test_matrices_hold_every_level():
    machine = three()
    # devices 0..7: nodes 0 0 1 1 2 2 3 3, leaves 0 0 0 0 1 1 1 1, one pod
    levels = np.array([[0, 0, 1, 1, 2, 2, 2, 2],
                       [0, 0, 1, 1, 2, 2, 2, 2],
                       [1, 1, 0, 0, 2, 2, 2, 2],
                       [1, 1, 0, 0, 2, 2, 2, 2],
                       [2, 2, 2, 2, 0, 0, 1, 1],
                       [2, 2, 2, 2, 0, 0, 1, 1],
                       [2, 2, 2, 2, 1, 1, 0, 0],
                       [2, 2, 2, 2, 1, 1, 0, 0]])
    inverse, latency = machine.matrices(8)
    expected_inverse = np.array([1 / 100, 1 / 40, 1 / 20])[levels]
    expected_latency = np.array([1.0, 2.0, 3.0])[levels]
    np.fill_diagonal(expected_inverse, 0)
    np.fill_diagonal(expected_latency, 0)
    assert np.array_equal(inverse, expected_inverse) and np.array_equal(latency, expected_latency)
    inverse, latency = machine.matrices(16)
    # ordered pairs per level on 16 devices: 16 on one node, 32 under one leaf, 64 under one pod, 128 across
    for link, pairs in ((INTRA, 16), (INTER, 32), (POD, 64), (SPINE, 128)):
        assert np.count_nonzero(inverse == 1 / link.bandwidth) == pairs
    assert latency[0, 8] == latency[7, 15] == 3 and inverse[7, 8] == 1 / 5 and inverse[8, 12] == 1 / 20
    assert all(inverse[a, b] == 1 / machine.link(a, b).bandwidth for a in range(16) for b in range(16) if a != b)


def test_regimes_follow_the_highest_level_a_group_spans_and_scale_above_the_given_ones():
    machine = three(REGIMES)
    intra, inter = machine.allreduce["intra_node"], machine.allreduce["inter_node"]
    # pod: inter's bandwidths / (40 / 20), latencies + (3 - 2); spine: pod's / (20 / 5), latencies + (3 - 3)
    pod = Regimes(Link(15, 1.5), Link(18, 2.5))
    spine = Regimes(Link(3.75, 1.5), Link(4.5, 2.5))
    assert machine.regimes((5,)) is None
    assert machine.regimes((0, 1)) == intra
    assert machine.regimes((0, 1, 2)) == machine.regimes((2, 1)) == inter
    assert machine.regimes((2, 3, 4)) == pod
    assert machine.regimes((0, 15)) == machine.regimes((8, 3, 5)) == machine.regimes(tuple(range(16))) == spine
    assert machine.allreduce_time((0, 15), 8) == spine.allreduce(2, 8)


def test_regimes_without_any_given_are_the_links_and_latency_scaling_stops_at_zero():
    machine = three()
    assert machine.regimes((0, 2)) == Regimes(INTER, INTER)
    assert machine.regimes((0, 4)) == Regimes(POD, POD)         # scaling the link by its own ratio: the link
    assert machine.regimes((0, 8)) == Regimes(SPINE, SPINE)
    fast = three(REGIMES.replace("allreduce:", "allreduce:\n  spine: {small: {bandwidth: 2, latency: 9}, "
                                               "large: {bandwidth: 4, latency: 8}}"))
    assert fast.regimes((0, 8)) == Regimes(Link(2, 9), Link(4, 8))
    low = parse_machine_text((THREE + REGIMES).replace("{name: pod, nodes: 4, oversubscription: 2, latency: 3}",
                                                      "{name: pod, nodes: 4, oversubscription: 2, latency: 0}"))
    assert low.regimes((0, 4)) == Regimes(Link(15, 0.0), Link(18, 0.0))     # 0.5 - 2 and 1.5 - 2: zero


def test_regimes_of_a_1024_device_group():
    machine = load_machine(os.path.join(ROOT, "jobs", "machines", "cluster-4x256-fat-tree.yaml"))
    spine, inter = machine.switches[1].link, machine.inter_node
    assert spine == Link(1.25e10, 3.5e-6)
    assert machine.regimes(list(range(1024))) == Regimes(spine, spine)
    assert machine.regimes(list(range(128))) == Regimes(inter, inter)              # one leaf: 32 nodes of 4
    assert machine.regimes(list(range(1024))[::-1]) == Regimes(spine, spine)
    assert machine.regimes(list(range(127, 1024))) == Regimes(spine, spine)     # node 31 of leaf 0 to leaf 7
    assert machine.regimes(list(range(4, 8))) == Regimes(machine.intra_node, machine.intra_node)
    assert machine.regimes(list(range(128, 256))[::-1]) == Regimes(inter, inter)   # order does not matter


def test_parameter_server_crosses_the_highest_level_the_group_spans():
    machine = three("sync: parameter-server\n")
    assert machine.gradient_sum((0, 1)).inter == INTER and machine.gradient_sum((0, 1)).across == 1
    server = machine.gradient_sum((0, 2, 3))
    assert (server.within, server.across, server.intra, server.inter) == (2, 2, INTRA, INTER)
    assert machine.gradient_sum((0, 4, 5)).inter == POD
    server = machine.gradient_sum(tuple(range(16)))
    assert (server.within, server.across, server.inter) == (2, 8, SPINE)


def test_tiers_list_the_levels_a_job_spans():
    machine = three()
    assert machine.tiers(1) == machine.tiers(2) == [(2, INTRA)]
    assert machine.tiers(3) == machine.tiers(4) == [(2, INTRA), (4, INTER)]
    assert machine.tiers(5) == machine.tiers(8) == [(2, INTRA), (4, INTER), (8, POD)]
    assert machine.tiers(9) == machine.tiers(16) == [(2, INTRA), (4, INTER), (8, POD), (16, SPINE)]
    assert machine.tiers(20) == [(2, INTRA), (4, INTER), (8, POD), (20, SPINE)]
    plain = load_machine(os.path.join(ROOT, "jobs", "machines", "paper-p100-4x4.yaml"))
    assert plain.tiers(4) == [(4, plain.intra_node)]
    assert plain.tiers(5) == plain.tiers(16) == [(4, plain.intra_node), (16, plain.inter_node)]
    assert plain.tiers(20) == [(4, plain.intra_node), (20, plain.inter_node)]
    big = load_machine(os.path.join(ROOT, "jobs", "machines", "cluster-4x256-fat-tree.yaml"))
    assert [size for size, _ in big.tiers(129)] == [4, 128, 1024]


def test_to_yaml_round_trips_switches_and_their_regimes():
    for text in (THREE + REGIMES + "sync: parameter-server\n",
                 THREE + REGIMES.replace("allreduce:", "allreduce:\n  pod: {small: {bandwidth: 2, latency: 9}, "
                                                       "large: {bandwidth: 4, latency: 8}}"),
                 THREE.replace("inter_node: {bandwidth: 40", "inter_node: {bandwidth: 1.1e+10")
                      .replace("oversubscription: 2,", "oversubscription: 3,")):    # 1.1e10 / 3: no short form
        machine = parse_machine_text(text, "m.yaml")
        again = parse_machine_text(machine.to_yaml(), "m.yaml")
        assert again == machine and again.switches == machine.switches and again.allreduce == machine.allreduce
    assert "switches:" not in default_machine().to_yaml()


def test_with_nodes_keeps_switches_and_refuses_nodes_beyond_the_top_switch():
    machine = three()
    smaller = machine.with_nodes(4)
    assert smaller.switches == machine.switches and smaller.tiers(8) == machine.tiers(8)
    with pytest.raises(MachineError, match=r"three.yaml: switches: the last level, 'spine', has 8 nodes under one "
                                           r"switch but the machine has 9 nodes \('nodes', or --nodes\)"):
        machine.with_nodes(9)


def _old_rule(machine, count):
    """The machine model before switches: one link within a node, one between nodes."""
    node = np.arange(count) // machine.devices_per_node
    same = node[:, None] == node[None, :]
    inverse = np.where(same, 1 / machine.intra_node.bandwidth, 1 / machine.inter_node.bandwidth)
    latency = np.where(same, machine.intra_node.latency, machine.inter_node.latency)
    np.fill_diagonal(inverse, 0)
    np.fill_diagonal(latency, 0)
    return inverse, latency


PLAIN = [path for path in sorted(glob.glob(os.path.join(ROOT, "jobs", "machines", "*.yaml")))
         if "\nswitches:" not in open(path, encoding="utf-8").read()]


@pytest.mark.parametrize("path", PLAIN + [None])
def test_machines_without_switches_are_unchanged(path):
    machine = default_machine() if path is None else load_machine(path)
    assert not machine.switches
    count = min(machine.max_devices, 32)
    inverse, latency = machine.matrices(count)
    old_inverse, old_latency = _old_rule(machine, count)
    assert np.array_equal(inverse, old_inverse) and np.array_equal(latency, old_latency)
    for group in [tuple(range(k)) for k in range(2, count + 1)] + [(1, count - 1)]:
        level = "intra_node" if len({machine.node_of(d) for d in group}) == 1 else "inter_node"
        link = getattr(machine, level)
        assert machine.regimes(group) == machine.allreduce.get(level, Regimes(link, link))
        assert machine.link(group[0], group[-1]) == link
        if machine.served:
            assert machine.gradient_sum(group).inter == machine.inter_node


def test_the_shipped_cluster_loads():
    machine = load_machine(os.path.join(ROOT, "jobs", "machines", "cluster-4x256-fat-tree.yaml"))
    assert (machine.nodes, machine.devices_per_node, machine.max_devices) == (256, 4, 1024)
    assert [(s.name, s.nodes) for s in machine.switches] == [("leaf", 32), ("spine", 256)]
    assert machine.level(0, 127) == 1 and machine.level(0, 128) == 2


BAD = [
    ("switches: {name: leaf, nodes: 2}", "three.yaml: switches: must be a list of switch levels"),
    ("switches: [{name: leaf}]", "three.yaml: switches[0]: missing key 'nodes'"),
    ("switches: [{name: leaf, nodes: 8, speed: 1}]", "three.yaml: switches[0]: unknown key 'speed'"),
    ("switches: [{name: inter_node, nodes: 8}]", "three.yaml: switches[0]: 'name' 'inter_node' is taken (by a level"),
    ("switches: [{name: a, nodes: 2}, {name: a, nodes: 8}]",
     "three.yaml: switches[1]: 'name' 'a' is taken (by an earlier switch level)"),
    ("switches: [{name: my leaf, nodes: 8}]", "three.yaml: switches[0]: 'name' must be a word"),
    ("switches: [{name: 7, nodes: 8}]", "three.yaml: switches[0]: 'name' must be a word"),
    ("switches: [{name: leaf, nodes: 1}, {name: top, nodes: 8}]", "three.yaml: switches[0]: 'nodes' must be at least 2"),
    ("switches: [{name: leaf, nodes: 0}]", "three.yaml: switches[0]: 'nodes' must be a positive integer, got 0"),
    ("switches: [{name: leaf, nodes: 2}, {name: top, nodes: 5}, {name: x, nodes: 10}]",
     "three.yaml: switches[1]: 'nodes' must be a multiple of the level below's ('leaf': 2 nodes) greater than it"),
    ("switches: [{name: leaf, nodes: 8}, {name: top, nodes: 8}]",
     "three.yaml: switches[1]: 'nodes' must be a multiple of the level below's ('leaf': 8 nodes)"),
    ("switches: [{name: leaf, nodes: 8, oversubscription: 0.5}]",
     "three.yaml: switches[0]: 'oversubscription' must be a number >= 1"),
    ("switches: [{name: leaf, nodes: 8, oversubscription: true}]",
     "three.yaml: switches[0]: 'oversubscription' must be a number >= 1"),
    ("switches: [{name: leaf, nodes: 8, latency: -1}]", "three.yaml: switches[0]: 'latency' must be a number >= 0"),
    ("switches: [{name: leaf, nodes: 8, bandwidth: 0}]",
     "three.yaml: switches[0]: 'bandwidth' must be a positive number"),
    ("switches: [{name: leaf, nodes: 2}, {name: pod, nodes: 4}]",
     "three.yaml: switches: the last level, 'pod', has 4 nodes under one switch but the machine has 8 nodes"),
    ("switches: [{name: leaf, nodes: 2}, {name: top, nodes: 8}]\nallreduce: {leaf: {small: {bandwidth: 1, latency: 0}, "
     "large: {bandwidth: 1, latency: 0}}}", "three.yaml: allreduce: 'leaf' is the first switch level"),
    ("switches: [{name: leaf, nodes: 2}, {name: top, nodes: 8}]\nallreduce: {core: {small: {bandwidth: 1, latency: 0}, "
     "large: {bandwidth: 1, latency: 0}}}", "three.yaml: allreduce: unknown key 'core'; allowed: inter_node, "
                                           "intra_node, top"),
]


@pytest.mark.parametrize("switches, message", BAD)
def test_bad_switches_are_refused_naming_the_file_and_the_key(switches, message):
    head = THREE[:THREE.index("switches:")]
    with pytest.raises(MachineError) as info:
        parse_machine_text(head + switches + "\n", "three.yaml")
    assert str(info.value).startswith(message)
