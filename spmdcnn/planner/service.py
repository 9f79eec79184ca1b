"""Planning as the commands and jobs use it: a cost model from files, and plans written with their prediction."""

import json
import os

from ..cost.compute import ComputeModel, Profile, reference_key
from ..cost.machine import default_machine, load_machine
from ..cost.model import CostModel


def cost_model(graph, batch, devices, machine=None, profile=None, itemsize=4, nodes=None, sync=None,
               batchnorm=None):
    """A :class:`CostModel` from a machine file (or the built-in local machine) and a profile file or
    :class:`Profile` (or none: the analytic model alone; of a profile that measured this model, batch and device
    count in place, that reference iteration's scale and meetings: :meth:`Profile.restricted`). ``nodes`` overrides the machine's node count; ``sync``:
    the job's ``sync`` mapping (bucket size, overlap); ``batchnorm``: the job's key."""
    machine = load_machine(machine) if isinstance(machine, str) else (machine or default_machine())
    if nodes is not None:
        machine = machine.with_nodes(nodes)
    machine.check_devices(devices)
    store = Profile.load(profile) if isinstance(profile, str) else profile
    if store is not None:
        store = store.restricted(reference_key(graph, batch, devices, devices))
    return CostModel(graph, batch, machine, ComputeModel(machine.device, store, itemsize), itemsize, sync, batchnorm)


def plan_document(result, model_file=None, path=None):
    """The plan YAML (docs/formats.md#plan-files) of a planner :class:`Result`, with ``predicted`` and
    ``model_file``: relative to the folder of ``path`` (where the plan is written), as plan files read it."""
    summary = {key: round(value, 9) if key.endswith("_s") else int(value)
               for key, value in result.prediction.summary().items()}
    text = result.plan.text
    if model_file:
        model_file = str(model_file)
        if path is not None and not os.path.isabs(model_file):
            model_file = os.path.relpath(os.path.abspath(model_file), os.path.dirname(os.path.abspath(path)))
        text += f"model_file: {json.dumps(model_file)}\n"
    return text + f"predicted: {json.dumps(summary)}\n"
