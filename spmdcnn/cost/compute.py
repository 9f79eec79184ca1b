"""``t_c``: the forward + backward (+ SGD update) time of a layer's tiles, measured or modelled.

A tile's work is fixed by its :class:`~spmdcnn.cost.tiles.TileShape` (``cost/tiles.py``: a configuration has one
to a few distinct shapes).

Times come from a :class:`Profile` (``spmdcnn profile``: each distinct tile shape run on the device, cached in a
JSON file keyed by device and tile shape) and, for shapes no profile holds, from the analytic model: calls x the
device's per-call overhead + FLOPs / its FLOP rate + bytes / its memory bandwidth, scaled per op by the median
ratio of measured to modelled time over the profile's points (so a partial profile calibrates the rest). A
layer's ``t_c`` under a configuration is its slowest tile's time: every device waits for it at the next exchange.
"""

import copy
import hashlib
import json
import os
import statistics
from dataclasses import replace
from itertools import product
from math import prod

import numpy as np

from ..graph.optable import OPS
from ..io.atomic import written_aside
from .tiles import TileShape, combine, layer_classes

PROFILE_FORMAT = "spmdcnn-profile/1"
OPS_PER_CALL = 12        # NumPy (or CUDA) calls one kernel call makes, each paying the device's per-call overhead


def work(shape, itemsize=4):
    """``(calls, flops, bytes)`` of a tile's forward and backward: kernel calls, floating-point operations, and
    bytes read and written (a rough count of the passes each kernel makes), by the op's entry of :data:`WORK`.

    Contract: non-decreasing in every extent of the tile (output, each input, each parameter shard), as
    :func:`update_work` is in its parameter count. ``ComputeModel.layer_times`` relies on it to time only each
    axis's largest kinds of part; ``tests/cost/test_compute_and_sync.py`` checks it."""
    if not shape.backward:
        return _forward_work(shape, itemsize)
    return WORK[OPS[shape.op].family](shape, prod(shape.output), sum(prod(s) for s in shape.inputs), itemsize)


def _conv_work(shape, out, ins, itemsize):
    taps = prod(dict(shape.attrs)["kernel"])
    n, k = shape.output[:2]
    positions = prod(shape.output[2:])
    c = shape.inputs[0][1]
    per_group = dict(shape.params)["weight"][1]     # input channels each output reads: C / groups
    gemm = 2 * n * k * per_group * taps * positions
    passes = 3 if shape.input_grad else 2
    cols = n * c * taps * positions            # im2col (and col2im in backward)
    return 2 + passes, gemm * passes, itemsize * (cols * passes + 3 * (ins + out) + 2 * _shard(shape))


def _conv_transpose_work(shape, out, ins, itemsize):
    """The convolution's work with its roles turned: products over the input's positions, columns of the output's
    channels, and the full extent the input fills written and cropped (about the output's size)."""
    taps = prod(dict(shape.attrs)["kernel"])
    n, k = shape.output[:2]
    positions = prod(shape.inputs[0][2:])
    c = shape.inputs[0][1]
    gemm = 2 * n * dict(shape.params)["weight"][1] * c * taps * positions     # output channels per group
    passes = 3 if shape.input_grad else 2
    cols = n * k * taps * positions            # col2im forward, im2col for both of backward's products
    return 2 + passes, gemm * passes, itemsize * (cols * passes + 3 * (ins + out) + 2 * out + 2 * _shard(shape))


def _linear_work(shape, out, ins, itemsize):
    passes = 3 if shape.input_grad else 2
    return 2 + passes, 2 * out * shape.inputs[0][1] * passes, itemsize * (3 * (ins + out) + 3 * _shard(shape))


def _pool_work(shape, out, ins, itemsize):
    taps = prod(dict(shape.attrs)["kernel"])
    return 4, 2 * out * taps, itemsize * (out * taps * 2 + 2 * ins + 3 * out)


def _copies(shape, out, ins, itemsize):
    """Ops that move data: concat, add, flatten, slice, channel shuffle, space to depth, pad, global pooling."""
    return 2, 0, itemsize * 2 * (ins + out)


def _upsample_work(shape, out, ins, itemsize):
    """A gather (and backward's adds) per tap and spatial axis: nearest one tap, linear two, each weighted."""
    a = dict(shape.attrs)
    axes, taps = len(shape.output) - 2, 1 if a["mode"] == "nearest" else 2
    return 2 + 2 * axes * taps, 2 * (taps * 2 - 1) * axes * out, itemsize * (2 * ins + (2 + 3 * taps) * axes * out)


def _groupnorm_work(shape, out, ins, itemsize):
    """Statistics over the whole block it reads (two passes), its normalised copy, the output; backward's two
    means per group and the block's gradient."""
    return 14, 10 * ins + 4 * out, itemsize * (8 * ins + 4 * out)


def _shard(shape):
    return sum(prod(s) for _, s in shape.params)


def _elementwise_work(shape, out, ins, itemsize):
    return 2, out, itemsize * 4 * out


# one entry per family of the op table (tests/graph/test_optable.py checks there is one for every op)
WORK = {
    "conv": _conv_work,
    "conv_transpose": _conv_transpose_work,
    "upsample": _upsample_work,
    "groupnorm": _groupnorm_work,
    "instancenorm": _groupnorm_work,
    "layernorm": _groupnorm_work,
    "linear": _linear_work,
    "maxpool": _pool_work,
    "avgpool": _pool_work,
    "adaptive_avgpool": lambda shape, out, ins, itemsize: (6, 4 * ins, itemsize * 4 * (ins + out)),
    "batchnorm": lambda shape, out, ins, itemsize: (8, 12 * out, itemsize * 9 * out),
    "relu": _elementwise_work,
    "leaky_relu": _elementwise_work,
    "tanh": lambda shape, out, ins, itemsize: (2, 10 * out, itemsize * 4 * out),
    "sigmoid": lambda shape, out, ins, itemsize: (2, 12 * out, itemsize * 5 * out),
    "silu": lambda shape, out, ins, itemsize: (2, 20 * out, itemsize * 8 * out),
    "gelu": lambda shape, out, ins, itemsize: (2, 40 * out, itemsize * 12 * out),
    "hardswish": lambda shape, out, ins, itemsize: (2, 8 * out, itemsize * 8 * out),
    "hardsigmoid": _elementwise_work,
    "relu6": _elementwise_work,
    "hardtanh": _elementwise_work,
    "clamp": _elementwise_work,
    "elu": lambda shape, out, ins, itemsize: (2, 12 * out, itemsize * 6 * out),
    "mish": lambda shape, out, ins, itemsize: (2, 30 * out, itemsize * 10 * out),
    "scale": _elementwise_work,
    "dropout": _elementwise_work,
    "stochastic_depth": _elementwise_work,
    "layer_scale": lambda shape, out, ins, itemsize: (3, 3 * out, itemsize * 5 * out),
    "prelu": lambda shape, out, ins, itemsize: (3, 4 * out, itemsize * 5 * out),
    "bias": lambda shape, out, ins, itemsize: (2, 2 * out, itemsize * 4 * out),
    "softmax_cross_entropy": lambda shape, out, ins, itemsize: (4, 10 * ins, itemsize * 6 * ins),
    "dice_loss": lambda shape, out, ins, itemsize: (7, 20 * ins, itemsize * 11 * ins),
    "mse_loss": lambda shape, out, ins, itemsize: (4, 4 * ins, itemsize * 6 * ins),
    "concat": _copies,
    "add": _copies,
    "mul": lambda shape, out, ins, itemsize: (3, 3 * out, itemsize * 6 * out),
    "flatten": _copies,
    "slice": _copies,
    "channel_shuffle": _copies,
    "group_softmax": lambda shape, out, ins, itemsize: (6, 12 * out, itemsize * 8 * out),
    "space_to_depth": _copies,
    "pad": _copies,
    "global_avgpool": _copies,
}


def _forward_work(shape, itemsize):
    """:func:`work` of a tile whose backward never runs (a layer only the data reaches, with no parameters: no
    product of its inputs is done twice, so half of a forward and backward)."""
    calls, flops, nbytes = work(replace(shape, backward=True), itemsize)
    return max(calls // 2, 1), flops // 2, nbytes // 2


def update_work(params, itemsize=4):
    """``(calls, flops, bytes)`` of SGD with momentum and weight decay on ``params`` values."""
    return 1, 4 * params, itemsize * 5 * params


def reference_key(graph, batch, devices, ranks):
    """The ``in_situ`` key of a profile measured for ``graph`` at global ``batch`` on ``devices`` devices by
    ``ranks`` ranks: ``spmdcnn profile`` writes it once every tile shape the planner considers there is measured."""
    digest = hashlib.sha256(graph.text.encode()).hexdigest()[:12]
    return f"{graph.name} ({digest}) batch {batch} on {devices} devices, {ranks} ranks"


class Profile:
    """Measured tile times for one device: ``{TileShape.key: seconds}``, kept in a JSON file.

    ``in_situ`` holds reference iterations: a whole model run on each device at once, without communication
    (``measured``), against the sum of its tiles' times measured alone (``isolated``). A tile in a real iteration
    runs slower than alone (its inputs are no longer in cache, the runtime's own work between kernels), and
    :attr:`factor`, the median ratio, scales every tile time by that much."""

    def __init__(self, device, entries=None, shapes=None, path=None, in_situ=None, spreads=None, trials=None):
        self.device, self.entries, self.shapes, self.path = device, dict(entries or {}), dict(shapes or {}), path
        self.in_situ = dict(in_situ or {})
        self.spreads = dict(spreads or {})
        self.trials = dict(trials or {})        # plan: auto's measured candidates (runtime/trials.py)

    @property
    def spread(self):
        """The profile's own noise: the median over its measured tiles of how much their repeated timings
        disagree ((slowest - fastest) / median; 0 when it has none). The planner takes plans whose predictions
        differ by less than this fraction as ties."""
        values = [value for key, value in self.spreads.items() if key in self.entries]
        return statistics.median(values) if values else 0.0

    @property
    def factor(self):
        ratios = [r["measured"] / r["isolated"] for r in self.in_situ.values() if r.get("isolated")]
        return statistics.median(ratios) if ratios else 1.0

    @property
    def wait(self):
        """Seconds the ranks lose at each point where they synchronize, beyond the compute and the collective the
        model gives (0 when measured on one rank; older profiles' ``wait``, measured per point alone, where an entry has
        no ``latency``)."""
        waits = [r["latency"] if "latency" in r else r["wait"] for r in self.in_situ.values()
                 if "latency" in r or "wait" in r]
        return statistics.median(waits) if waits else 0.0

    @property
    def drift(self):
        """Seconds the ranks lose where they synchronize per second of the model's compute since they last did,
        on top of :attr:`wait` (0 for profiles that measured none)."""
        drifts = [r["drift"] for r in self.in_situ.values() if "latency" in r]
        return statistics.median(drifts) if drifts else 0.0

    @property
    def step(self):
        """Seconds per step of the runtime's own work that a data-parallel run of steps on the ranks (or the one
        process) took beyond what the model gave it (0 for profiles that measured none; may be negative)."""
        steps = [r["step"] for r in self.in_situ.values() if "step" in r]
        return statistics.median(steps) if steps else 0.0

    def restricted(self, key):
        """This profile with the reference iteration ``key`` alone, when it has it among others (a model measured
        in place is scaled, and its ranks' meetings charged, by its own measurements rather than the median over
        the models the cache holds), else itself. The tile times and trials are shared, not copied."""
        if key not in self.in_situ or len(self.in_situ) == 1:
            return self
        view = copy.copy(self)
        view.in_situ = {key: self.in_situ[key]}
        return view

    def get(self, shape):
        return self.entries.get(shape.key)

    def add(self, shape, seconds, spread=None):
        self.entries[shape.key] = float(seconds)
        self.shapes[shape.key] = shape
        if spread is not None:
            self.spreads[shape.key] = float(spread)

    def __len__(self):
        return len(self.entries)

    def save(self, path=None):
        path = path or self.path
        data = {"format": PROFILE_FORMAT, "device": self.device, "in_situ": self.in_situ,
                **({"trials": self.trials} if self.trials else {}),
                "entries": [{"key": key, "seconds": seconds,
                             **({"spread": self.spreads[key]} if key in self.spreads else {}),
                             **({"shape": self.shapes[key].to_json()} if key in self.shapes else {})}
                            for key, seconds in sorted(self.entries.items())]}
        with written_aside(path) as temporary, open(temporary, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=0)
        self.path = path

    @classmethod
    def load(cls, path, device=None):
        """Read a profile; with ``device``, a missing file gives an empty profile for that device."""
        if device is not None and not os.path.exists(path):
            return cls(device, path=path)
        try:
            with open(path, encoding="utf-8") as handle:
                data = json.load(handle)
        except FileNotFoundError:
            raise ValueError(f"{path}: profile not found (make one with spmdcnn profile)") from None
        except (OSError, json.JSONDecodeError) as error:
            raise ValueError(f"{path}: not a readable spmdcnn profile: {error}") from None
        if not isinstance(data, dict) or data.get("format") != PROFILE_FORMAT:
            raise ValueError(f"{path}: not an spmdcnn profile (format {PROFILE_FORMAT!r})")
        entries = {e["key"]: float(e["seconds"]) for e in data.get("entries", [])}
        shapes = {e["key"]: TileShape.from_json(e["shape"]) for e in data.get("entries", []) if "shape" in e}
        spreads = {e["key"]: float(e["spread"]) for e in data.get("entries", []) if "spread" in e}
        return cls(data.get("device", "unknown"), entries, shapes, path, data.get("in_situ"), spreads,
                   data.get("trials"))


class ComputeModel:
    """Tile times from ``profile`` where it has them, else from the analytic model of ``device`` (a
    :class:`~spmdcnn.cost.machine.Device`) scaled by what the profile measured."""

    def __init__(self, device, profile=None, itemsize=4):
        self.device, self.profile, self.itemsize = device, profile, itemsize
        self._layers = {}
        self.scale = self._calibrate()
        self.wait = profile.wait if profile is not None else 0.0
        self.drift = profile.drift if profile is not None else 0.0
        self.step = profile.step if profile is not None else 0.0

    def analytic(self, calls, flops, nbytes):
        d = self.device
        return calls * OPS_PER_CALL * d.overhead + flops / d.flops + nbytes / d.memory_bandwidth

    def _calibrate(self):
        """Per op, the median of measured / modelled time over the profile's points (and over all ops)."""
        if not self.profile:
            return {}
        ratios = {}
        for key, shape in self.profile.shapes.items():
            if key in self.profile.entries:
                model = self.analytic(*work(shape, self.itemsize))
                ratios.setdefault(shape.op, []).append(self.profile.entries[key] / model)
        for key, seconds in self.profile.entries.items():
            if key.startswith("sgd["):
                model = self.analytic(*update_work(int(key[4:-1]), self.itemsize))
                ratios.setdefault("sgd", []).append(seconds / model)
        if not ratios:
            return {}
        scale = {op: statistics.median(values) for op, values in ratios.items()}
        scale[None] = statistics.median(v for values in ratios.values() for v in values)
        return scale

    def tile_seconds(self, shape):
        if self.profile is not None:
            measured = self.profile.get(shape)
            if measured is not None:
                return measured
        return self.modelled_seconds(shape)

    def modelled_seconds(self, shape):
        """The analytic model's time for ``shape``, scaled for its op (its extents may be arrays: many tiles)."""
        factor = self.scale.get(shape.op, self.scale.get(None, 1.0))
        return factor * self.analytic(*work(shape, self.itemsize))

    def update_seconds(self, params):
        if not params:
            return 0.0
        if self.profile is not None:
            measured = self.profile.entries.get(update_key(params))
            if measured is not None:
                return measured
        return self.modelled_update(params)

    def modelled_update(self, params):
        return self.scale.get("sgd", 1.0) * self.analytic(*update_work(params, self.itemsize))

    def layer_seconds(self, layer, config, batch):
        """``t_c``: the slowest tile's forward, backward and parameter update."""
        return self.layer_times(layer, batch, [config.degrees])[0]

    def layer_times(self, layer, batch, degrees):
        """:meth:`layer_seconds` of ``layer`` under configurations with each of ``degrees`` (remembered per layer
        signature)."""
        known = self._layers.get((layer.signature, batch))
        if known is None:
            known = self._layers[layer.signature, batch] = {}
        missing = [d for d in dict.fromkeys(degrees) if d not in known]
        if missing:
            classes = layer_classes(layer, batch)
            classes.build(missing)
            seconds = self._slowest(classes, missing)
            factor = self.profile.factor if self.profile is not None else 1.0
            for d, slowest in zip(missing, seconds):
                known[d] = factor * slowest
        return [known[d] for d in degrees]

    def _slowest(self, classes, configs):
        """Per configuration (its degrees), the slowest of its distinct tiles. Without measured times, only the
        tiles of each axis's largest kinds of part: every term of the analytic model (:func:`work`,
        :func:`update_work`) grows with every extent of a tile; and those of many configurations are timed at once
        (``largest_tiles``: extents are arrays of Python integers, so each time has one tile's arithmetic)."""
        seconds = [None] * len(configs)
        measured = bool(self.profile)
        if not measured and len(configs) > 1:
            chosen, starts, shapes = classes.largest_tiles(configs)
            if len(chosen):
                counts = _param_count(shapes)
                update = np.where(counts > 0, self.modelled_update(counts), 0.0) if shapes.params else 0.0
                times = self.modelled_seconds(shapes) + update      # update_seconds, unmeasured, on arrays
                for index, value in zip(chosen, np.maximum.reduceat(times, starts)):
                    seconds[index] = value
        for index, degrees in enumerate(configs):
            if seconds[index] is None:      # measured, one configuration, or a strided read left with one row
                kinds = product(*(c.every if measured else c.largest for c in classes.of(degrees)))
                seconds[index] = max(self.tile_seconds(shape) + self.update_seconds(_param_count(shape))
                                     for shape in map(combine, kinds))
        return seconds


def _param_count(shape):
    """The values of the parameter shards of the tile ``shape`` (an array of counts for many tiles)."""
    return sum(prod(p) for _, p in shape.params)


def update_key(params):
    return f"sgd[{params}]"
