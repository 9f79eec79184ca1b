"""Random and hand-made plans for the multi-rank tests (the same plan on every rank: seeded generators only)."""

import numpy as np

from decoder_models import answers  # noqa: F401  (the tests take it from here)

from spmdcnn.tiling.config import dims_of, names_of, output_shape
from spmdcnn.tiling.plan import from_mapping


def _degrees(rng, dims, shape, budget):
    """Random degrees over ``dims`` (each at most its extent) whose product is at most ``budget``."""
    degrees = {}
    for name in rng.permutation(list(dims)).tolist():
        extent = shape[names_of(len(shape)).index(name)]
        limit = min(extent, budget)
        degree = int(rng.integers(1, limit + 1)) if limit > 1 else 1
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
        degrees = _degrees(rng, dims_of(layer), output_shape(layer, batch), devices)
        count = int(np.prod(list(degrees.values()), dtype=np.int64)) if degrees else 1
        layers[layer.name] = {**degrees, "devices": rng.permutation(devices)[:count].tolist()}
    return from_mapping({"format": "spmdcnn-plan/1", "devices": devices, "layers": layers}, graph, batch, devices,
                        f"random plan {seed}")


def uniform_plan(graph, batch, devices, spec):
    """``spec`` (e.g. ``{"h": 2, "w": 2}``) for every layer that can take it, the loss over n."""
    layers = {}
    for layer in graph.layers:
        shape = output_shape(layer, batch)
        degrees = {d: min(k, shape[names_of(len(shape)).index(d)]) for d, k in spec.items() if d in dims_of(layer)}
        count = int(np.prod(list(degrees.values()), dtype=np.int64)) if degrees else 1
        if count > devices:
            degrees, count = {}, 1
        layers[layer.name] = {**degrees, "devices": list(range(count))}
    return from_mapping({"format": "spmdcnn-plan/1", "devices": devices, "layers": layers}, graph, batch, devices,
                        f"plan {spec}")
