"""Parameters, gradients and buffers held in flat arrays with one named view per tensor.

One flat array per kind lets the optimizer, a gradient allreduce and the checkpoint walk all parameters at once,
while layers address each tensor by its global name ``"<layer>.<name>"``.
"""

import zlib

import numpy as np


def count(shape):
    return int(np.prod(shape, dtype=np.int64))


def flat_offsets(shapes):
    """``{name: (start, stop)}`` of each tensor of ``shapes`` (in its order) in one flat array."""
    offsets, total = {}, 0
    for name, shape in shapes.items():
        offsets[name] = (total, total + count(shape))
        total += count(shape)
    return offsets


class FlatStore:
    """Named views over one contiguous array: ``store[name]`` is the tensor, ``store.flat`` all of them."""

    def __init__(self, shapes, dtype, xp=np):
        self.shapes = dict(shapes)
        self.offsets = flat_offsets(self.shapes)
        total = max((stop for _, stop in self.offsets.values()), default=0)
        self.flat = xp.zeros(total, dtype=dtype)
        self.views = {name: self.flat[a:b].reshape(self.shapes[name]) for name, (a, b) in self.offsets.items()}

    def __getitem__(self, name):
        return self.views[name]

    def __contains__(self, name):
        return name in self.views

    def __iter__(self):
        return iter(self.views)

    def items(self):
        return self.views.items()

    @property
    def size(self):
        return self.flat.size


def fan_in(shape):
    """Inputs feeding one output: ``C*kH*kW`` for a conv weight, ``F_in`` for a linear one."""
    return count(shape[1:])


def initial_value(layer, kind, seed, rows=None, axis=0):
    """PyTorch's default initial value of parameter ``kind`` of ``layer``, from a generator keyed by name.

    Conv and linear weights and biases: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) (kaiming_uniform with a=sqrt(5));
    batch-norm weights 1 and biases 0; running means 0 and variances 1; a layer scale's factors its ``init``. Keying the generator by (seed, name)
    makes every tensor independent of the others and of the plan. Returned in float64.

    ``rows=(r0, r1)`` gives only those rows (a shard along the first axis), drawing nothing else: the generator
    (PCG64, one 64-bit draw per number) jumps over the ``r0`` rows before them. A shard along another ``axis`` (a
    transposed convolution's weight, ``(C_in, C_out, k...)``) is cut from the whole tensor drawn.
    """
    shape = tuple(layer.params.get(kind, layer.buffers.get(kind)))
    if axis:
        whole = initial_value(layer, kind, seed)
        return whole[(slice(None),) * axis + (slice(*(rows or (0, shape[axis]))),)]
    r0, r1 = (0, shape[0]) if rows is None else rows
    shape = (r1 - r0,) + shape[1:]
    if layer.spec.unit_init:        # normalisations' weights 1 and biases 0; a layer scale's factors its init
        if kind in ("weight", "running_var"):
            return np.full(shape, layer.attrs.get("init", 1.0) if kind == "weight" else 1.0)
        return np.zeros(shape)
    bound = 1.0 / np.sqrt(fan_in(layer.params["weight"]))
    rng = np.random.default_rng([seed, zlib.crc32(f"{layer.name}.{kind}".encode())])
    rng.bit_generator.advance(r0 * count(shape[1:]))
    return rng.uniform(-bound, bound, size=shape)
