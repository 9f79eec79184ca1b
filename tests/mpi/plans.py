"""Random and hand-made plans for the multi-rank tests (the same plan on every rank: seeded generators only)."""

import numpy as np

from decoder_models import answers  # noqa: F401  (the tests take it from here)

from spmdcnn.tiling.config import dims_of, keeps_groups, names_of, output_shape
from spmdcnn.tiling.plan import from_mapping


def _allowed(layer, name, degree):
    """Whether ``layer`` may split ``name`` ``degree`` ways (a grouped convolution's channels in whole groups)."""
    return name != "c" or keeps_groups(layer, degree)


def _degrees(rng, layer, shape, budget):
    """Random degrees over the layer's dimensions (each at most its extent, a grouped convolution's channels in
    whole groups) whose product is at most ``budget``."""
    degrees = {}
    for name in rng.permutation(list(dims_of(layer))).tolist():
        extent = shape[names_of(len(shape)).index(name)]
        choices = [d for d in range(1, min(extent, budget) + 1) if _allowed(layer, name, d)]
        degree = int(rng.choice(choices))
        if degree > 1:
            degrees[name] = degree
            budget //= degree
    return degrees


def random_plan(graph, batch, devices, seed, listed=0.85):
    """Per layer: random degrees over its dimensions and a random subset of devices in random order. Element-wise
    layers (relu, dropout, ...) are sometimes left out (they inherit their input's configuration)."""
    rng = np.random.default_rng(seed)
    layers = {}
    for layer in graph.layers:
        if layer.spec.inherits and rng.random() > listed:
            continue
        degrees = _degrees(rng, layer, output_shape(layer, batch), devices)
        count = int(np.prod(list(degrees.values()), dtype=np.int64)) if degrees else 1
        layers[layer.name] = {**degrees, "devices": rng.permutation(devices)[:count].tolist()}
    return from_mapping({"format": "spmdcnn-plan/1", "devices": devices, "layers": layers}, graph, batch, devices,
                        f"random plan {seed}")


def uniform_plan(graph, batch, devices, spec):
    """``spec`` (e.g. ``{"h": 2, "w": 2}``) for every layer that can take it, the loss over n."""
    layers = {}
    for layer in graph.layers:
        shape = output_shape(layer, batch)
        degrees = {d: max(k for k in range(1, min(k, shape[names_of(len(shape)).index(d)]) + 1)
                          if _allowed(layer, d, k)) for d, k in spec.items() if d in dims_of(layer)}
        count = int(np.prod(list(degrees.values()), dtype=np.int64)) if degrees else 1
        if count > devices:
            degrees, count = {}, 1
        layers[layer.name] = {**degrees, "devices": list(range(count))}
    return from_mapping({"format": "spmdcnn-plan/1", "devices": devices, "layers": layers}, graph, batch, devices,
                        f"plan {spec}")
