"""``spmdcnn calibrate`` with every rank on a node of its own (``python calibrate_fake_nodes.py ARGS``): the
processor names are replaced by ``node<rank>``, so that one computer stands for a job across nodes, and Slurm's
topology variables, set per rank by the launcher, place those nodes under switches."""

import sys

from spmdcnn import cli
from spmdcnn.comm import calibrate

real = calibrate.placement


def placement(world):
    where = real(world)
    return calibrate.Placement(tuple(f"node{rank}" for rank in range(world.size)), tuple(range(world.size)), 1,
                               where.addresses)


calibrate.placement = placement
sys.exit(cli.main(sys.argv[1:]))
