"""Transposed convolution over 1, 2 or 3 spatial axes (PyTorch's conv_transpose1d/2d/3d): the adjoint of
:mod:`spmdcnn.ops.conv`, written with its pieces, one implementation for every spatial rank.

Along one spatial axis, input position ``i`` adds ``w[c, k, p] * x[n, c, i]`` into output position
``i*s - pad + p*d`` (stride s, padding pad, dilation d, kernel position p). Without padding, inputs ``[0, S)`` fill
the *full* extent ``F = (S - 1)*s + d*(k - 1) + 1``; PyTorch's output is the part ``[pad, pad + O)`` of it, with
``O = F - 2*pad + output_padding`` (``output_padding`` < s or < d: the positions past the full extent hold the
bias alone). So the op is written in terms of a ``crop`` per axis, the ``[start, stop)`` of the full extent its
output holds (either end may lie outside the full extent: those positions receive nothing but the bias). A tile
of an output split over an axis reads the inputs that reach its part of the output and crops its own part
(``tiling/fields.py``); the whole tensor is the tile whose crop is ``[pad, pad + O)``.

Forward is the input gradient of the convolution of the full extent with the same weight, ``(C_in, C_out, k...)``
read as a convolution's ``(K, C, k...)`` (PyTorch's layout, so weights move as they are); backward is that
convolution's forward (the input's gradient) and its weight gradient, over the output gradient set into the full
extent (zero outside the crop). Shapes: x (N, C_in, S...), w (C_in, C_out/groups, k...), y (N, C_out, O...); with
``groups`` (PyTorch's) the convolution it is the adjoint of is grouped alike (``ops/conv.py``).

It runs wherever the convolution's pieces run: NumPy, and CuPy (cuDNN for the backward's convolution, CuPy's
products for the forward's columns). With activations of a lower precision than the weights (bfloat16 under
float32 master weights) it computes in the weights' type and rounds ``y`` and ``gx`` to the activations', as
``ops/linear.py`` does.
"""

from math import prod
from typing import NamedTuple

from .. import backend
from .conv import ConvGeometry, conv_backward, conv_forward, conv_input_gradient
from .window import ntuple, rank_of, sides


class TransposeGeometry(NamedTuple):
    """Stride, dilation and crop of a transposed convolution, one value per spatial axis; ``crop`` holds a
    ``(start, stop)`` pair per axis in the full extent's coordinates (module docstring)."""

    stride: tuple
    dilation: tuple
    crop: tuple
    groups: int = 1         # PyTorch's: C_in and C_out in as many groups, each output reading its group's inputs

    @property
    def rank(self):
        return len(self.stride)

    def full_extents(self, spatial, kernel):
        """The extents inputs of ``spatial`` extents fill, without padding (:func:`full_extents`)."""
        return full_extents(spatial, kernel, self.stride, self.dilation)

    def inner(self):
        """The convolution whose input gradient this is (no padding: the crop does its work)."""
        return ConvGeometry(self.stride, 0, self.dilation, rank=self.rank, groups=self.groups)


def full_extents(spatial, kernel, stride, dilation):
    """The extents inputs of ``spatial`` extents fill along each axis, without padding (0 for no inputs)."""
    return tuple((size - 1) * s + d * (k - 1) + 1 if size else 0
                 for size, k, s, d in zip(spatial, kernel, stride, dilation))


def whole(spatial, kernel, stride, padding, output_padding, dilation, groups=1):
    """The :class:`TransposeGeometry` of the whole tensor: its crop keeps ``[before, F - after + output_padding)``
    of the full extent ``F`` along each axis (``padding`` a ``(before, after)`` pair per axis; no checks)."""
    full = full_extents(spatial, kernel, stride, dilation)
    return TransposeGeometry(tuple(stride), tuple(dilation), tuple(
        (before, f - after + o) for f, (before, after), o in zip(full, padding, output_padding)), groups)


def output_padding_error(output_padding, stride, dilation):
    """Why ``output_padding`` is refused (PyTorch's rule: smaller than the stride or the dilation along each
    axis), or None."""
    for axis, (o, s, d) in enumerate(zip(output_padding, stride, dilation)):
        if o >= max(s, d):
            return (f"output_padding {o} along spatial axis {axis} must be smaller than the stride ({s}) or the "
                    f"dilation ({d})")
    return None


def geometry(spatial, kernel, stride=1, padding=0, output_padding=0, dilation=1, rank=None, groups=1):
    """PyTorch's transposed convolution of inputs of ``spatial`` extents as a :class:`TransposeGeometry`
    (``padding``: one value for all axes, one per axis, or a ``(before, after)`` pair per axis, which PyTorch has
    not: the positions left off the full extent's start and end)."""
    rank = rank or rank_of(kernel, stride, padding, output_padding, dilation, default=len(spatial))
    kernel, stride, dilation = (ntuple(v, rank, what) for v, what in
                                ((kernel, "kernel"), (stride, "stride"), (dilation, "dilation")))
    padding, output_padding = sides(padding, rank), ntuple(output_padding, rank, "output_padding")
    error = output_padding_error(output_padding, stride, dilation)
    if error:
        raise ValueError(f"conv_transpose: {error}")
    return whole(spatial, kernel, stride, padding, output_padding, dilation, groups)


def transposed_extents(spatial, kernel, stride, padding, output_padding, dilation):
    """PyTorch's output extents, ``(S - 1)*s - 2*pad + d*(k - 1) + output_padding + 1`` per axis (``padding`` a
    ``(before, after)`` pair per axis)."""
    return tuple((size - 1) * s - before - after + d * (k - 1) + o + 1
                 for size, k, s, (before, after), o, d in zip(spatial, kernel, stride, padding, output_padding,
                                                             dilation))


def _overlap(crop, full):
    """Per axis: the slice of the output and the slice of the full extent that overlap."""
    out, inside = [], []
    for (start, stop), extent in zip(crop, full):
        lo, hi = max(start, 0), min(stop, extent)
        hi = max(hi, lo)
        out.append(slice(lo - start, hi - start))
        inside.append(slice(lo, hi))
    return (slice(None), slice(None)) + tuple(out), (slice(None), slice(None)) + tuple(inside)


class TransposeSaved(NamedTuple):
    x: object               # the input, in the weights' type
    w: object
    has_bias: bool
    geometry: TransposeGeometry
    need_input_grad: bool
    dtype: object           # the activations' type


def conv_transpose_forward(x, w, b, geometry, need_input_grad=True):
    """``y`` (N, C_out, O...) with ``O`` the crop's extents; returns ``y, saved``."""
    if x.ndim != w.ndim or x.ndim - 2 != geometry.rank:
        raise ValueError(f"conv_transpose: input {x.shape}, weight {w.shape} and {geometry} disagree in spatial "
                         "rank")
    if w.shape[0] != x.shape[1]:
        raise ValueError(f"conv_transpose: input has {x.shape[1]} channels, weight expects {w.shape[0]}")
    xp = backend.array_module(x)
    dtype, x = x.dtype, x.astype(w.dtype, copy=False)
    N, kernel, K = x.shape[0], w.shape[2:], w.shape[1] * geometry.groups
    out = tuple(stop - start for start, stop in geometry.crop)
    full = geometry.full_extents(x.shape[2:], kernel)
    filled = conv_input_gradient(x, w, (N, K) + full, geometry.inner()) if prod(full) and prod(out) else None
    into, inside = _overlap(geometry.crop, full)
    if filled is not None and full == out and into == inside:
        y = filled                          # the crop is the full extent: nothing to move
    else:
        y = xp.zeros((N, K) + out, dtype=x.dtype)
        if filled is not None:
            y[into] = filled[inside]
    if b is not None:
        y += b.reshape((1, K) + (1,) * geometry.rank)
    return y.astype(dtype, copy=False), TransposeSaved(x, w, b is not None, geometry, need_input_grad, dtype)


def conv_transpose_backward(gy, saved, gw_out=None):
    """Gradients ``gx, gw, gb`` of :func:`conv_transpose_forward` (``gx`` None when it was not asked for);
    ``gw`` is written into ``gw_out`` when given."""
    x, w, geometry = saved.x, saved.w, saved.geometry
    xp = backend.array_module(gy)
    gy = gy.astype(w.dtype, copy=False)
    N, K, kernel = x.shape[0], w.shape[1] * geometry.groups, w.shape[2:]
    gb = gy.sum(axis=(0,) + tuple(range(2, gy.ndim))) if saved.has_bias else None
    full = geometry.full_extents(x.shape[2:], kernel)
    if not prod(full):
        gw = xp.zeros(w.shape, dtype=w.dtype) if gw_out is None else gw_out
        gw[...] = 0
        return (xp.zeros(x.shape, dtype=saved.dtype) if saved.need_input_grad else None), gw, gb
    into, inside = _overlap(geometry.crop, full)
    if full == gy.shape[2:] and into == inside:
        gfull = gy
    else:
        gfull = xp.zeros((N, K) + full, dtype=gy.dtype)
        gfull[inside] = gy[into]
    gx, conv_saved = conv_forward(gfull, w, None, geometry.inner(), need_input_grad=False)
    _, gw, _ = conv_backward(x, conv_saved, gw_out)
    return (gx.astype(saved.dtype, copy=False) if saved.need_input_grad else None), gw, gb
