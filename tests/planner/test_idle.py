"""A plan that leaves devices idle says why: the layers, and the model's prediction with them spread out."""

import os

from spmdcnn.cost.compute import ComputeModel
from spmdcnn.cost.machine import default_machine
from spmdcnn.cost.model import CostModel
from spmdcnn.graph import load_model
from spmdcnn.planner.idle import idle_layers, idle_note
from spmdcnn.tiling.plan import Plan, named

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _cost(graph, batch):
    machine = default_machine()
    return CostModel(graph, batch, machine, ComputeModel(machine.device))


def test_a_plan_using_every_device_says_nothing_and_one_leaving_some_idle_names_them_and_the_alternative():
    graph = load_model(os.path.join(ROOT, "models", "tiny_cnn.yaml"))
    cost = _cost(graph, 8)
    data = named("data", graph, 8, 2)
    assert idle_layers(data) == [] and idle_note(cost, data) is None
    first = graph.layers[0].name
    configs = dict(data.configs)
    configs[first] = named("data", graph, 8, 1)[first]          # the first layer on device 0 alone
    plan = Plan(graph, 8, 2, configs, "hand-made")
    assert idle_layers(plan) == [first]
    note = idle_note(cost, plan)
    spread = cost.simulate(data).iteration_s * 1e3
    assert note.startswith(f"idle devices: {first} runs on 1 of 2 devices; split over all 2 as data parallelism "
                           f"splits them, the model predicts {spread:.2f} ms per step against ")
    assert ("% faster: this plan is not the model's best there" in note) == (spread < cost.simulate(plan).iteration_s
                                                                            * 1e3)


def test_a_batch_smaller_than_the_devices_is_the_reason_given():
    graph = load_model(os.path.join(ROOT, "models", "tiny_cnn.yaml"))
    plan = named("data", graph, 2, 4)
    assert idle_note(_cost(graph, 2), plan) == ("idle devices: the batch of 2 leaves some of the 4 devices without a "
                                                "sample in the layers the plan splits over samples alone")
