"""Bound tile kernels: each op's ``ops/`` functions bound, once, to one tile of one layer.

A :class:`TileKernel` holds everything its op reads besides the arrays of a step: the tile's geometry
(:class:`Tile`: padding, stride, where it lies in the global tensor, the batch-norm reduction over its replica
group), its parameter, gradient and buffer views (:class:`Views`), whether it computes its input's gradient, and
which input it may overwrite. Then ``forward(xs, run) -> (y, saved)`` and ``backward(gy, saved) -> [gx per
input]``; ``run`` (:class:`Run`) carries what changes per call: training or evaluation, the step (dropout's
stream), whether in-place writes are allowed. The loss takes the labels as its second input and gives its
share of the step's one reduction (:class:`LossShare`); :func:`finish_loss` turns the sums into the loss and the
seed its backward starts from. A backward writes
the parameter gradients into its gradient views and returns None for an input that needs no gradient.

The executor builds one per layer and rank from the plan (``runtime/program.py``); the profiler builds the same
from a tile shape (``runtime/profile.py``), so what it times is what training runs.

Only tanh keeps its *output* for backward (convolutions, linear and batch norm keep their input; the others keep
masks, indices or nothing: the op table's ``keeps``). So the element-wise ops and add may write their output over
an input that no other layer reads and no op keeps (``overwrite``; ``runtime.executor.overwritable_inputs``).

Ops over spatial axes are bound once for every spatial rank: ``BIND`` is keyed by the op table's ``family``.
"""

from dataclasses import dataclass, field
from math import prod
from typing import NamedTuple

import numpy as np

from .. import backend
from ..graph.optable import group_channels, layer_groups, tile_groups, window
from ..ops import (activations, add, batchnorm, bias, channels, concat, conv, conv_transpose, dice, dropout, flatten,
                   groupnorm, layer_scale, layernorm, leaky_relu, linear, loss, mse, mul, pad, pool, prelu, relu,
                   scale, softmax, tanh, upsample)
from ..ops.window import ntuple
from ..tiling.fields import Need, no_padding


class Run(NamedTuple):
    """What a forward call changes: ``training`` (batch statistics, dropout), the ``step`` (dropout's stream)
    and whether kernels may write over their inputs (not while a caller keeps outputs to look at)."""

    training: bool = True
    step: int = 0
    overwrite: bool = True


@dataclass
class Tile:
    """The geometry of one tile: its output ``box`` in the ``global_shape``, what it reads of its (first) input
    (``need``, a :class:`~spmdcnn.tiling.fields.Need`: the padding it adds, the steps of a strided read; None: an
    input that arrives padded and whole, as the profiler gives it), and over the ranks holding the same channels
    (batchnorm's statistics; None: this rank alone holds them) ``reduce``, their sum, and ``gather``, their
    arrays stacked; for a group or layer normalisation ``reduce`` sums over the ranks sharing its statistics."""

    global_shape: tuple
    box: tuple
    need: Need = None
    reduce: object = None
    gather: object = None
    ghost: object = None        # a Ghost: statistics over fixed groups of samples (job key batchnorm: {group: G})
    statistics: tuple = None    # group norm: the groups (g0, g1) of the sums ``reduce`` adds (None: its own)

    @property
    def start(self):
        return tuple(lo for lo, _ in self.box)

    @property
    def padding(self):
        """The padding it adds, a ``(before, after)`` pair per spatial axis."""
        return self.need.pads if self.need else no_padding(len(self.global_shape) - 2)

    def stride(self, stride):
        """The window stride this tile applies: 1 along a strided read, whose positions arrive subsampled."""
        return self.need.stride(stride) if self.need else tuple(stride)

    @property
    def count(self):
        """Values per channel over the global tensor (batchnorm's M = N * prod(spatial))."""
        return prod(self.global_shape[:1] + self.global_shape[2:])


@dataclass
class Views:
    """A tile's parameter shards, their gradients and its buffers, by kind (``weight``, ``running_mean``, ...)."""

    params: dict = field(default_factory=dict)
    grads: dict = field(default_factory=dict)
    buffers: dict = field(default_factory=dict)


class TileKernel:
    """One layer's op bound to one tile (module docstring)."""

    def __init__(self, layer, tile, views, overwrite=None, seed=0):
        self.layer, self.tile, self.views = layer, tile, views
        self.input_grad = layer.input_grad  # computes the gradient of its input(s): the graph's one rule
        self.overwrite = overwrite          # the index of an input it may write its output over, or None
        self.seed = seed
        self.forward, self.backward = BIND[layer.spec.family](self)

    def overwrites(self, run):
        """Whether this call of a one-input kernel may write its output over its input."""
        return run.overwrite and self.overwrite == 0

    def __repr__(self):
        return f"TileKernel({self.layer.name!r}, {self.layer.op}, input_grad={self.input_grad})"


def _window_counts(layer, tile):
    """Per spatial axis, the positions each of the tile's windows counts, where some windows count fewer than the
    kernel's (``ops/pool.py``): those inside the padded input where ceil mode's last windows reach past it, those
    inside the input itself where the padding is left out of the divisor (``count_include_pad: false``); None
    where every window counts the whole kernel."""
    written = window(layer.attrs, layer.spatial_rank)
    include = layer.attrs.get("count_include_pad", True)
    if written.padding == layer.window.padding and (include or not any(map(any, written.padding))):
        return None
    counts = []
    for (o0, o1), k, s, (before, after), size in zip(tile.box[2:], written.kernel, written.stride, written.padding,
                                                      layer.in_shapes[0][1:]):
        first, limit = (0, size + before + after) if include else (before, before + size)
        counts.append(pool.window_counts(o0, o1, k, s, first, limit))
    return tuple(counts)


def _pool(function, backward):
    def bind(kernel):
        geometry = kernel.layer.window
        counts = _window_counts(kernel.layer, kernel.tile) if kernel.layer.spec.family == "avgpool" else None
        geometry = pool.PoolGeometry(geometry.kernel, kernel.tile.stride(geometry.stride), kernel.tile.padding,
                                     counts=counts)
        return (lambda xs, run: function(xs[0], geometry)), (lambda gy, saved: [backward(gy, saved)])
    return bind


def _pad(kernel):
    padding, value = kernel.tile.padding, kernel.layer.attrs["value"]

    def backward(gy, spatial):
        return [pad.pad_backward(gy, spatial, padding)]
    return (lambda xs, run: pad.pad_forward(xs[0], padding, value)), backward


def _plain(function, backward, *keys):
    """One input, no parameters; the layer's attributes ``keys`` passed to ``function(x, *attributes)``."""
    def bind(kernel):
        attributes = tuple(kernel.layer.attrs[key] for key in keys)
        return (lambda xs, run: function(xs[0], *attributes)), (lambda gy, saved: [backward(gy, saved)])
    return bind


def _elementwise(function, backward, *keys):
    """One input that it may overwrite, the layer's attributes ``keys`` passed to both directions:
    ``function(x, *attributes, inplace=...)`` and ``backward(gy, saved, *attributes)``."""
    def bind(kernel):
        attributes = tuple(kernel.layer.attrs[key] for key in keys)
        return (lambda xs, run: function(xs[0], *attributes, inplace=kernel.overwrites(run))), \
            (lambda gy, saved: [backward(gy, saved, *attributes)])
    return bind


def _add(kernel):
    def forward(xs, run):
        return add.add_forward(xs, inplace=kernel.overwrite if run.overwrite else None)
    return forward, add.add_backward


def _mul(kernel):
    needs = kernel.layer.input_grads
    return (lambda xs, run: mul.mul_forward(xs[0], xs[1])), (lambda gy, saved: mul.mul_backward(gy, saved, needs))


def _concat(kernel):
    return (lambda xs, run: concat.concat_forward(xs)), concat.concat_backward


def _weighted(function, backward, geometry_of=None):
    """Convolutions and linear: the weight (and bias) shard, ``gw`` written straight into its gradient view."""
    def bind(kernel):
        params, grads = kernel.views.params, kernel.views.grads
        extra = () if geometry_of is None else (geometry_of(kernel),)

        def run_forward(xs, run):
            return function(xs[0], params["weight"], params.get("bias"), *extra, need_input_grad=kernel.input_grad)

        def run_backward(gy, saved):
            gx, _, gb = backward(gy, saved, gw_out=grads["weight"])
            if gb is not None:
                grads["bias"][...] = gb
            return [gx]
        return run_forward, run_backward
    return bind


def _conv_geometry(kernel):
    """The tile's window and groups: a tile of a grouped convolution holds whole groups (``tiling/config.py``)."""
    geometry = kernel.layer.window
    return conv.ConvGeometry(kernel.tile.stride(geometry.stride), kernel.tile.padding, geometry.dilation,
                             rank=len(geometry.kernel), groups=tile_groups(kernel.layer, kernel.tile.box[1]))


def _transpose_geometry(kernel):
    """The crop of a transposed convolution's tile (``ops/conv_transpose.py``): where its output box lies in the
    full extent its input part fills, or, for an input that arrives whole (the profiler's), the layer's own."""
    layer, tile = kernel.layer, kernel.tile
    geometry = layer.window
    if tile.need is None:
        return conv_transpose.whole(layer.in_shapes[0][1:], geometry.kernel, geometry.stride, geometry.padding,
                                    ntuple(layer.attrs["output_padding"], len(geometry.kernel)), geometry.dilation,
                                    layer_groups(layer))
    crop = tuple((o0 - (i0 * s - before), o1 - (i0 * s - before)) for (o0, o1), (i0, _), s, (before, _)
                 in zip(tile.box[2:], tile.need.box[2:], geometry.stride, geometry.padding))
    return conv_transpose.TransposeGeometry(geometry.stride, geometry.dilation, crop, layer_groups(layer))


def _upsample(kernel):
    """Each spatial axis's taps for the tile's outputs, from the inputs it reads (where both lie globally)."""
    layer, tile, a = kernel.layer, kernel.tile, kernel.layer.attrs
    rank = len(layer.in_shapes[0]) - 1
    scale = ntuple(a["scale"], rank)
    memo = {}

    def axes(x):
        key = (backend.array_module(x).__name__, x.dtype)
        if key not in memo:
            starts = [lo for lo, _ in tile.need.box[2:]] if tile.need is not None else [0] * rank
            memo[key] = [upsample.axis_taps(backend.array_module(x), 2 + i, a["mode"], scale[i], a["align_corners"],
                                            layer.in_shapes[0][1 + i], layer.out_shape[1 + i], tile.box[2 + i],
                                            starts[i], x.shape[2 + i], x.dtype) for i in range(rank)]
        return memo[key]
    return (lambda xs, run: upsample.upsample_forward(xs[0], axes(xs[0]))), \
        (lambda gy, saved: [upsample.upsample_backward(gy, saved)])


def _groupnorm(kernel):
    """A group (or instance) normalisation's tile: its own box, its partial sums per sample and group added over
    the tiles that share its groups (``tile.reduce``; ``tile.statistics``: the groups of that table, None for the
    tile's own), the count of each group the whole tensor's."""
    layer, tile, views = kernel.layer, kernel.tile, kernel.views
    per = group_channels(layer)
    eps = layer.attrs["eps"]
    c0, c1 = tile.box[1]
    g0, g1 = tile.statistics or (c0 // per, -(-c1 // per))
    count = per * prod(tile.global_shape[2:])
    memo = {}

    def members(x):
        xp = backend.array_module(x)
        if xp not in memo:
            memo[xp] = groupnorm.group_members(xp, c0, c1, per, g0, g1 - g0)
        return memo[xp]

    def forward(xs, run):
        return groupnorm.groupnorm_forward(xs[0], views.params.get("weight"), views.params.get("bias"),
                                           members(xs[0]), count, eps, tile.reduce)
    return forward, _affine_backward(groupnorm.groupnorm_backward, views)


def _affine_backward(backward, views):
    """A normalisation's backward writing gamma's and beta's gradients, when it has them, into their views."""
    def run(gy, saved):
        gx, ggamma, gbeta = backward(gy, saved)
        if ggamma is not None:
            views.grads["weight"][...] = ggamma
            if "bias" in views.grads:
                views.grads["bias"][...] = gbeta
        return [gx]
    return run


def _layernorm(kernel):
    """A layer normalisation's tile: its own box, its partial sums per sample and position added over the tiles of
    the same samples and positions (``tile.reduce``), over the whole tensor's channels."""
    layer, tile, views = kernel.layer, kernel.tile, kernel.views
    eps, count = layer.attrs["eps"], tile.global_shape[1]

    center, correction = layer.attrs["center"], layer.attrs["correction"]

    def forward(xs, run):
        return layernorm.layernorm_forward(xs[0], views.params.get("weight"), views.params.get("bias"), count, eps,
                                           tile.reduce, center, correction)
    return forward, _affine_backward(layernorm.layernorm_backward, views)


@dataclass
class Ghost:
    """A batchnorm tile under ghost batch norm (:mod:`spmdcnn.tiling.ghost`): its ``site`` (a GhostSite),
    ``count`` values per channel of a group, ``groups`` in the global batch, ``gather`` and ``reduce`` over its
    component (None: a component of one), and ``defer(contribution, apply)``, which sums the running statistics'
    contribution over the replica group off the critical path and calls ``apply`` with the sum (None: the
    component is the whole replica group, which updates them alone)."""

    site: object
    count: int
    groups: int
    gather: object = None
    reduce: object = None
    defer: object = None


def _running_update(views, momentum, groups):
    """``apply(sums)``: the momentum update of the running statistics from ``sums`` (2, C) float64 of the group
    means and unbiased variances over all ``groups`` groups: their averages."""
    def apply(sums):
        for name, total in zip(("running_mean", "running_var"), sums):
            buffer = views.buffers[name]
            buffer *= 1.0 - momentum
            buffer += (momentum * total / groups).astype(buffer.dtype)
    return apply


def _ghost_batchnorm(kernel):
    a, views, ghost = kernel.layer.attrs, kernel.views, kernel.tile.ghost
    site = ghost.site
    apply = _running_update(views, a["momentum"], ghost.groups)

    def forward(xs, run):
        if not run.training:
            return batchnorm.batchnorm_forward(xs[0], views.params["weight"], views.params["bias"],
                                               views.buffers["running_mean"], views.buffers["running_var"],
                                               eps=a["eps"], training=False)
        y, saved, (means, variances) = batchnorm.ghost_batchnorm_forward(
            xs[0], views.params["weight"], views.params["bias"], site.spans, ghost.count, a["eps"], ghost.gather)
        xp = backend.array_module(means)
        contribution = xp.stack([means.sum(axis=0), variances.sum(axis=0)])
        if ghost.defer is None:
            apply(contribution)
        else:       # the component's leader adds its groups' statistics, the others nothing
            ghost.defer(contribution if site.leader else xp.zeros_like(contribution), apply)
        return y, saved

    def backward(gy, saved):
        gx, ggamma, gbeta, own_ggamma, own_gbeta = batchnorm.ghost_batchnorm_backward(gy, saved, ghost.reduce)
        whole = site.whole          # every tile of the replica group has every group's sums
        views.grads["weight"][...] = ggamma if whole else own_ggamma
        views.grads["bias"][...] = gbeta if whole else own_gbeta
        return [gx]
    return forward, backward


def _batchnorm(kernel):
    a, views, tile = kernel.layer.attrs, kernel.views, kernel.tile
    if tile.ghost is not None:
        return _ghost_batchnorm(kernel)

    def forward(xs, run):
        return batchnorm.batchnorm_forward(
            xs[0], views.params["weight"], views.params["bias"], views.buffers["running_mean"],
            views.buffers["running_var"], eps=a["eps"], momentum=a["momentum"], training=run.training,
            reduce=tile.reduce, gather=tile.gather, count=tile.count)   # over the tiles with these channels

    def backward(gy, saved):
        gx, ggamma, gbeta = batchnorm.batchnorm_backward(gy, saved)
        views.grads["weight"][...] = ggamma
        views.grads["bias"][...] = gbeta
        return [gx]
    return forward, backward


def _one_weight(forward, backward, name="weight"):
    """A layer whose one parameter is ``name`` (a layer scale's factors, a PReLU's slopes, a bias):
    ``forward(x, parameter) -> (y, saved)``, ``backward(gy, saved, parameter) -> (gx, gparameter)``."""
    def bind(kernel):
        views = kernel.views

        def backward_(gy, saved):
            gx, gweight = backward(gy, saved, views.params[name])
            views.grads[name][...] = gweight
            return [gx]
        return (lambda xs, run: forward(xs[0], views.params[name])), backward_
    return bind


def _masked(function):
    """Dropout and stochastic depth: in training, ``function(x, p, key, start, global_shape, inplace)`` with the
    layer's stream key of the step and the tile's place in the global tensor; the identity in evaluation."""
    def bind(kernel):
        layer, tile = kernel.layer, kernel.tile

        def forward(xs, run):
            if not run.training:
                return xs[0], None
            key = dropout.stream_key(kernel.seed, run.step, layer.name)
            return function(xs[0], layer.attrs["p"], key, tile.start, tile.global_shape,
                            inplace=kernel.overwrites(run))
        return forward, lambda gy, saved: [dropout.dropout_backward(gy, saved)]
    return bind


class LossShare(NamedTuple):
    """What a loss tile adds to the step's one reduction over the ranks: its loss ``sum``, the elements it
    ``counted`` and, for a loss with sums per sample and class (the op table's ``class_sums``: Dice), a
    ``table`` of the graph's :meth:`~spmdcnn.graph.graph.Graph.loss_table` shape with its samples' rows filled."""

    sum: float
    counted: float
    table: object = None


def _loss(forward, backward):
    """The answers of the tile's elements (labels or targets) come as the second input. Forward gives
    ``(LossShare, saved)``: the loss summed over the tile and the elements it counted, which the executor sums over
    the tiles (the global mean is the one sum over the other); backward takes the gradient of the sum."""
    def bind(kernel):
        extra = {"ignore_index": kernel.layer.attrs["ignore_index"]} if "ignore_index" in kernel.layer.attrs else {}

        def run(xs, run):
            share, saved = forward(xs[0], xs[1], total=1, **extra)
            return LossShare(share, saved.counted), saved
        return run, (lambda gy, saved: [backward(gy, saved)])
    return bind


def _dice(kernel):
    """The cross-entropy's forward, and the tile's (I, P, T) sums placed at its samples' rows of the batch's
    table (``ops/dice.py``); backward takes its rows of the seed's Dice derivatives."""
    start, stop = kernel.tile.box[0]
    batch, ignore = kernel.tile.global_shape[0], kernel.layer.attrs["ignore_index"]

    def run(xs, run):
        share, saved = loss.softmax_cross_entropy_forward(xs[0], xs[1], total=1, ignore_index=ignore)
        part = backend.to_numpy(dice.dice_partials(saved))
        table = np.zeros((part.shape[0], batch, part.shape[2]))
        table[:, start:stop] = part
        return LossShare(share, saved.counted, table), saved
    return run, (lambda seed, saved: [dice.dice_backward(seed.rows(start, stop), saved)])


def finish_loss(layer, total, counted, table):
    """``(loss, seed)`` from the sums over the ranks of the loss tiles' :class:`LossShare`: the global loss, and
    what its backward starts from (the gradient of the loss with respect to the tiles' sums; for Dice a
    :class:`~spmdcnn.ops.dice.DiceSeed`). Nothing counted: loss 0, gradient 0."""
    per = 1.0 / counted if counted else 0.0
    if not layer.spec.class_sums:
        return total * per, per
    a = layer.attrs
    value, da, db = dice.dice_finish(table, a["dice"], a["include_background"], a["smooth"], a["batch"])
    return a["cross_entropy"] * total * per + value, dice.DiceSeed(a["cross_entropy"] * per, da, db)


BIND = {
    "conv": _weighted(conv.conv_forward, conv.conv_backward, _conv_geometry),
    "conv_transpose": _weighted(conv_transpose.conv_transpose_forward, conv_transpose.conv_transpose_backward,
                                _transpose_geometry),
    "linear": _weighted(linear.linear_forward, linear.linear_backward),
    "maxpool": _pool(pool.maxpool_forward, pool.maxpool_backward),
    "avgpool": _pool(pool.avgpool_forward, pool.avgpool_backward),
    "global_avgpool": _plain(pool.global_avgpool_forward, pool.global_avgpool_backward),
    "adaptive_avgpool": _plain(pool.adaptive_avgpool_forward, pool.adaptive_avgpool_backward, "output_size"),
    "upsample": _upsample,
    "flatten": _plain(flatten.flatten_forward, flatten.flatten_backward),
    "slice": _plain(channels.slice_forward, channels.slice_backward),
    "channel_shuffle": _plain(channels.channel_shuffle_forward, channels.channel_shuffle_backward, "groups"),
    "group_softmax": _plain(softmax.group_softmax_forward, softmax.group_softmax_backward, "groups"),
    "space_to_depth": _plain(channels.space_to_depth_forward, channels.space_to_depth_backward, "size", "order"),
    "pad": _pad,
    "relu": _elementwise(relu.relu_forward, relu.relu_backward),
    "leaky_relu": _elementwise(leaky_relu.leaky_relu_forward, leaky_relu.leaky_relu_backward, "negative_slope"),
    "tanh": _elementwise(tanh.tanh_forward, tanh.tanh_backward),
    "sigmoid": _elementwise(activations.sigmoid_forward, activations.sigmoid_backward),
    "silu": _elementwise(activations.silu_forward, activations.silu_backward),
    "gelu": _elementwise(activations.gelu_forward, activations.gelu_backward, "approximate"),
    "hardswish": _elementwise(activations.hardswish_forward, activations.hardswish_backward),
    "hardsigmoid": _elementwise(activations.hardsigmoid_forward, activations.hardsigmoid_backward),
    "relu6": _elementwise(activations.relu6_forward, activations.relu6_backward),
    "hardtanh": _elementwise(activations.hardtanh_forward, activations.hardtanh_backward, "min_val", "max_val"),
    "clamp": _elementwise(activations.clamp_forward, activations.clamp_backward, "min", "max"),
    "elu": _elementwise(activations.elu_forward, activations.elu_backward, "alpha", "gain", "input_scale"),
    "mish": _elementwise(activations.mish_forward, activations.mish_backward),
    "scale": _elementwise(scale.scale_forward, scale.scale_backward, "factor", "shift"),
    "add": _add,
    "mul": _mul,
    "concat": _concat,
    "batchnorm": _batchnorm,
    "groupnorm": _groupnorm,
    "instancenorm": _groupnorm,
    "layernorm": _layernorm,
    "dropout": _masked(dropout.dropout_forward),
    "stochastic_depth": _masked(dropout.stochastic_depth_forward),
    "layer_scale": _one_weight(layer_scale.layer_scale_forward, layer_scale.layer_scale_backward),
    "prelu": _one_weight(prelu.prelu_forward, prelu.prelu_backward),
    "bias": _one_weight(bias.bias_forward, bias.bias_backward, "bias"),
    "softmax_cross_entropy": _loss(loss.softmax_cross_entropy_forward, loss.softmax_cross_entropy_backward),
    "dice_loss": _dice,
    "mse_loss": _loss(mse.mse_loss_forward, mse.mse_loss_backward),
}
