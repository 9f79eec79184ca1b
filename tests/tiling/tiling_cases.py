"""Models and random plans shared by the tiling tests."""

import functools
import os

import numpy as np

from spmdcnn.graph import load_model
from spmdcnn.graph.graph import parse_model
from spmdcnn.tiling.config import dims_of, names_of, output_shape
from spmdcnn.tiling.plan import from_mapping

MODELS = os.path.join(os.path.dirname(__file__), "..", "..", "models")
SMALL_MODELS = ("tiny_cnn", "small_inception", "small_resnet", "cifar_cnn", "tiny_volume")


@functools.lru_cache(maxsize=None)
def model(name):
    return load_model(os.path.join(MODELS, f"{name}.yaml"))


def handmade(layers, input_shape=(3, 8, 8), name="handmade"):
    """A model from a list of layer dicts; a flatten, a linear and the loss are appended when the list does not
    end in a loss."""
    layers = list(layers)
    if layers[-1]["op"] not in ("softmax_cross_entropy", "mse_loss"):
        layers += [{"name": "flat", "op": "flatten"}, {"name": "fc", "op": "linear", "out_features": 3},
                   {"name": "loss", "op": "softmax_cross_entropy"}]
    return parse_model({"name": name, "input": list(input_shape), "layers": layers})


def random_spec(rng, layer, batch, devices):
    """A random valid configuration of ``layer``: degrees over the dims the op may split, product at most
    ``devices``, each at most its extent, on a random choice of devices in a random order."""
    shape = output_shape(layer, batch)
    allowed = dims_of(layer)
    spec, count = {}, 1
    for name, extent in zip(names_of(len(shape)), shape):
        if name not in allowed:
            continue
        most = min(extent, devices // count)
        degree = int(rng.integers(1, most + 1))
        if degree > 1:
            spec[name] = degree
        count *= degree
    spec["devices"] = [int(d) for d in rng.permutation(devices)[:count]]
    return spec


def random_mapping(rng, graph, batch, devices):
    return {"format": "spmdcnn-plan/1", "model": graph.name, "batch_size": batch, "devices": devices,
            "layers": {layer.name: random_spec(rng, layer, batch, devices) for layer in graph.layers}}


def random_plan(seed, graph, batch, devices):
    rng = np.random.default_rng(seed)
    return from_mapping(random_mapping(rng, graph, batch, devices), graph, batch, devices, f"random plan {seed}")


def slices(box, origin=None):
    """Slices selecting ``box`` in an array that holds ``origin`` (the whole tensor when None)."""
    if origin is None:
        return tuple(slice(start, stop) for start, stop in box)
    return tuple(slice(start - o, stop - o) for (start, stop), (o, _) in zip(box, origin))


def inside(inner, outer):
    return all(o0 <= i0 <= i1 <= o1 for (i0, i1), (o0, o1) in zip(inner, outer))
