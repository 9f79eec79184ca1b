"""``t_c``: the forward + backward (+ SGD update) time of a layer's tiles, measured or modelled.

A tile's work is fixed by its :class:`TileShape`: the op, the shapes of the (padded) inputs it reads, its output
box's shape, its parameter shard, and whether it computes a gradient for its input (not when it reads the data).
Tiles of one layer differ only where a split is uneven, so a configuration has one to a few distinct shapes.

Times come from a :class:`Profile` (``spmdcnn profile``: each distinct tile shape run on the device, cached in a
JSON file keyed by device and tile shape) and, for shapes no profile holds, from the analytic model: calls x the
device's per-call overhead + FLOPs / its FLOP rate + bytes / its memory bandwidth, scaled per op by the median
ratio of measured to modelled time over the profile's points (so a partial profile calibrates the rest). A
layer's ``t_c`` under a configuration is its slowest tile's time: every device waits for it at the next exchange.
"""

import json
import os
import statistics
from dataclasses import dataclass
from itertools import product
from math import prod

from ..graph.blocks import DATA
from ..ops.window import pair
from ..tiling.boxes import part, shape_of
from ..tiling.config import output_shape
from ..tiling.fields import needs as tile_needs

PROFILE_FORMAT = "spmdcnn-profile/1"
OPS_PER_CALL = 12        # NumPy (or CUDA) calls one kernel call makes, each paying the device's per-call overhead


@dataclass(frozen=True)
class TileShape:
    """What one tile computes: enough to run it alone (the profiler does) and to count its work."""

    op: str
    attrs: tuple            # sorted (key, value) pairs the kernel uses (the stride after strided reads)
    inputs: tuple           # per input: its shape including the padding the tile adds
    output: tuple
    params: tuple           # (name, shard shape) pairs
    input_grad: bool        # computes the gradient of its input (False for a layer reading the data)

    @property
    def key(self):
        attrs = ",".join(f"{k}={v}" for k, v in self.attrs)
        ins = ";".join("x".join(map(str, s)) for s in self.inputs)
        params = ";".join(f"{n}:{'x'.join(map(str, s))}" for n, s in self.params)
        return f"{self.op}[{attrs}] in={ins} out={'x'.join(map(str, self.output))} p={params} " \
               f"dx={int(self.input_grad)}"

    def to_json(self):
        return {"op": self.op, "attrs": [list(a) for a in self.attrs], "inputs": [list(s) for s in self.inputs],
                "output": list(self.output), "params": [[n, list(s)] for n, s in self.params],
                "input_grad": self.input_grad}

    @classmethod
    def from_json(cls, data):
        return cls(data["op"], tuple((k, _tuple(v)) for k, v in data["attrs"]),
                   tuple(tuple(s) for s in data["inputs"]), tuple(data["output"]),
                   tuple((n, tuple(s)) for n, s in data["params"]), bool(data["input_grad"]))


def _tuple(value):
    return tuple(value) if isinstance(value, list) else value


def tile_shapes(layer, config, batch):
    """The distinct :class:`TileShape` of ``layer``'s tiles under ``config``.

    What a tile reads along one dimension depends only on its part along that dimension, so the distinct tiles
    are the combinations of each dimension's distinct parts (at most a few: balanced splits differ by one in
    size, and only the first and last parts of a window see padding)."""
    in_shapes = [(batch,) + tuple(s) for s in layer.in_shapes]
    classes = [_classes(layer, batch, axis, degree) for axis, degree in enumerate(config.degrees)]
    result = []
    for box in product(*classes):
        shape = tile_shape(layer, box, tile_needs(layer, box, in_shapes))
        if shape not in result:
            result.append(shape)
    return result


_CLASSES = {}


def clear_caches():
    """Forget the tile shapes worked out so far (they are kept per layer signature for the whole process)."""
    _CLASSES.clear()


def _classes(layer, batch, axis, degree):
    """One range per distinct kind of part along ``axis`` split ``degree`` ways: parts whose tiles read inputs of
    the same extent with the same padding along that axis."""
    key = (layer.signature, batch, axis, degree)
    if key not in _CLASSES:
        in_shapes = [(batch,) + tuple(s) for s in layer.in_shapes]
        whole = tuple((0, extent) for extent in output_shape(layer, batch))
        seen = {}
        # a concat's channel parts read from different inputs: every part counts
        parts = range(degree) if layer.op == "concat" and axis == 1 else _candidates(whole[axis][1], degree)
        for index in parts:
            box = whole[:axis] + (part(whole[axis][1], degree, index),) + whole[axis + 1:]
            shape = tile_shape(layer, box, tile_needs(layer, box, in_shapes))
            kind = (shape.output[axis], tuple(s[axis] if axis < len(s) else None for s in shape.inputs),
                    shape.params, shape.attrs)
            seen.setdefault(kind, box[axis])
        _CLASSES[key] = list(seen.values())
    return _CLASSES[key]


def _candidates(extent, degree):
    """Parts that may differ in what their tiles read: the first and the last (padding, the tensor's edge), and
    among the others one of each size (balanced parts have two sizes at most, and an interior part's reads
    depend only on its size)."""
    chosen, sizes = {0, degree - 1}, set()
    for index in range(1, degree - 1):
        lo, hi = part(extent, degree, index)
        if hi - lo not in sizes:
            sizes.add(hi - lo)
            chosen.add(index)
        if len(sizes) == 2:
            break
    return sorted(chosen)


def tile_shape(layer, box, needs):
    """The :class:`TileShape` of the tile of ``layer`` with output ``box`` reading ``needs``."""
    a = layer.attrs
    inputs = []
    for need in needs:
        shape = list(shape_of(need.box, need.steps))
        if layer.op in ("conv2d", "maxpool2d", "avgpool2d"):
            (top, bottom), (left, right) = need.padding
            shape[2] += top + bottom
            shape[3] += left + right
        inputs.append(tuple(shape))
    attrs = {}
    if layer.op in ("conv2d", "maxpool2d", "avgpool2d"):
        stride = pair(a["kernel"] if a.get("stride") is None else a["stride"])
        attrs = {"kernel": pair(a["kernel"]), "stride": needs[0].stride(stride),
                 "dilation": pair(a.get("dilation", 1))}
    elif layer.op == "dropout":
        attrs = {"p": a["p"]}
    elif layer.op == "batchnorm2d":
        attrs = {"eps": a["eps"], "momentum": a["momentum"]}
    output = shape_of(box)
    rows = box[1][1] - box[1][0] if len(box) > 1 else 1
    params = tuple((name, (rows,) + tuple(shape[1:])) for name, shape in layer.params.items())
    return TileShape(layer.op, tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in attrs.items())),
                     tuple(inputs), tuple(output), params, DATA not in layer.inputs)


def work(shape, itemsize=4):
    """``(calls, flops, bytes)`` of a tile's forward and backward: kernel calls, floating-point operations, and
    bytes read and written (a rough count of the passes each kernel makes)."""
    op, out = shape.op, prod(shape.output)
    ins = sum(prod(s) for s in shape.inputs)
    params = sum(prod(s) for _, s in shape.params)
    attrs = dict(shape.attrs)
    if op == "conv2d":
        kh, kw = attrs["kernel"]
        n, k, oh, ow = shape.output
        c = shape.inputs[0][1]
        gemm = 2 * n * k * c * kh * kw * oh * ow
        passes = 3 if shape.input_grad else 2
        cols = n * c * kh * kw * oh * ow           # im2col (and col2im in backward)
        return 2 + passes, gemm * passes, itemsize * (cols * passes + 3 * (ins + out) + 2 * params)
    if op == "linear":
        passes = 3 if shape.input_grad else 2
        return 2 + passes, 2 * out * shape.inputs[0][1] * passes, itemsize * (3 * (ins + out) + 3 * params)
    if op in ("maxpool2d", "avgpool2d"):
        kh, kw = attrs["kernel"]
        return 4, 2 * out * kh * kw, itemsize * (out * kh * kw * 2 + 2 * ins + 3 * out)
    if op == "batchnorm2d":
        return 8, 12 * out, itemsize * 9 * out
    if op in ("relu", "dropout"):
        return 2, out, itemsize * 4 * out
    if op == "softmax_cross_entropy":
        return 4, 10 * ins, itemsize * 6 * ins
    return 2, 0, itemsize * 2 * (ins + out)             # concat, add, flatten, global_avgpool: copies


def update_work(params, itemsize=4):
    """``(calls, flops, bytes)`` of SGD with momentum and weight decay on ``params`` values."""
    return 1, 4 * params, itemsize * 5 * params


class Profile:
    """Measured tile times for one device: ``{TileShape.key: seconds}``, kept in a JSON file.

    ``in_situ`` holds reference iterations: a whole model run on each device at once, without communication
    (``measured``), against the sum of its tiles' times measured alone (``isolated``). A tile in a real iteration
    runs slower than alone (its inputs are no longer in cache, the runtime's own work between kernels), and
    :attr:`factor`, the median ratio, scales every tile time by that much."""

    def __init__(self, device, entries=None, shapes=None, path=None, in_situ=None):
        self.device, self.entries, self.shapes, self.path = device, dict(entries or {}), dict(shapes or {}), path
        self.in_situ = dict(in_situ or {})

    @property
    def factor(self):
        ratios = [r["measured"] / r["isolated"] for r in self.in_situ.values() if r.get("isolated")]
        return statistics.median(ratios) if ratios else 1.0

    @property
    def wait(self):
        """Seconds the ranks lose at each point where they synchronize (0 when measured on one rank)."""
        waits = [r["wait"] for r in self.in_situ.values() if "wait" in r]
        return statistics.median(waits) if waits else 0.0

    def get(self, shape):
        return self.entries.get(shape.key)

    def add(self, shape, seconds):
        self.entries[shape.key] = float(seconds)
        self.shapes[shape.key] = shape

    def __len__(self):
        return len(self.entries)

    def save(self, path=None):
        path = path or self.path
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, exist_ok=True)
        data = {"format": PROFILE_FORMAT, "device": self.device, "in_situ": self.in_situ,
                "entries": [{"key": key, "seconds": seconds,
                             **({"shape": self.shapes[key].to_json()} if key in self.shapes else {})}
                            for key, seconds in sorted(self.entries.items())]}
        temporary = f"{path}.tmp{os.getpid()}"
        with open(temporary, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=0)
        os.replace(temporary, path)
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
        return cls(data.get("device", "unknown"), entries, shapes, path, data.get("in_situ"))


class ComputeModel:
    """Tile times from ``profile`` where it has them, else from the analytic model of ``device`` (a
    :class:`~spmdcnn.cost.machine.Device`) scaled by what the profile measured."""

    def __init__(self, device, profile=None, itemsize=4):
        self.device, self.profile, self.itemsize = device, profile, itemsize
        self._layers = {}
        self.scale = self._calibrate()
        self.wait = profile.wait if profile is not None else 0.0

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
        factor = self.scale.get(shape.op, self.scale.get(None, 1.0))
        return factor * self.analytic(*work(shape, self.itemsize))

    def update_seconds(self, params):
        if not params:
            return 0.0
        if self.profile is not None:
            measured = self.profile.entries.get(update_key(params))
            if measured is not None:
                return measured
        return self.scale.get("sgd", 1.0) * self.analytic(*update_work(params, self.itemsize))

    def layer_seconds(self, layer, config, batch):
        """``t_c``: the slowest tile's forward, backward and parameter update."""
        key = (layer.signature, config.degrees, batch)
        if key not in self._layers:
            shapes = tile_shapes(layer, config, batch)
            factor = self.profile.factor if self.profile is not None else 1.0
            self._layers[key] = factor * max(self.tile_seconds(s) + self.update_seconds(
                sum(prod(p) for _, p in s.params)) for s in shapes)
        return self._layers[key]


def update_key(params):
    return f"sgd[{params}]"
