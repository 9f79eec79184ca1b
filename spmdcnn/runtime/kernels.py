"""Each op's forward and backward as the executor calls them: ``ops/`` functions bound to a layer's attributes,
parameters and gradients.

``forward(layer, xs, ctx) -> (y, saved)`` and ``backward(layer, gy, saved, ctx) -> [gx per input]``; a backward
writes parameter gradients into ``ctx.grads`` and returns None for inputs that need no gradient. ``ctx`` is the
executor: ``params``, ``grads``, ``buffers``, ``training``, ``step``, ``seed``, ``labels``, ``needs_input_grad``,
``overwritable``, and ``site(layer)``: this rank's tile of the layer (its padding, global offset and shape,
the batchnorm reduction over the replica group, the global batch).

No op keeps its *output* for backward (conv2d, linear and batchnorm2d keep their input; the others keep masks,
indices or nothing). So relu, dropout and add may write their output over an input that no other layer reads:
``ctx.overwritable(layer)`` names that input, if any.
"""

from ..ops import add, batchnorm, concat, conv, dropout, flatten, linear, loss, pool, relu
from ..ops.window import pair

FORWARD = {}
BACKWARD = {}


def _param(ctx, layer, kind):
    name = f"{layer.name}.{kind}"
    return ctx.params[name] if name in ctx.params else None


def _pool_geometry(layer, ctx):
    a = layer.attrs
    site = ctx.site(layer)
    stride = site.stride(pair(a["kernel"] if a["stride"] is None else a["stride"]))
    return pool.PoolGeometry(a["kernel"], stride, site.padding)


def _one_input(op, forward, backward, configure=None):
    """An op without parameters on one input: ``forward(x[, configure(layer)])``, ``backward(gy, saved)``."""
    def run_forward(layer, xs, ctx):
        return forward(xs[0]) if configure is None else forward(xs[0], configure(layer, ctx))

    def run_backward(layer, gy, saved, ctx):
        return [backward(gy, saved)]
    FORWARD[op], BACKWARD[op] = run_forward, run_backward


def _many_inputs(op, forward, backward):
    FORWARD[op] = lambda layer, xs, ctx: forward(xs)
    BACKWARD[op] = lambda layer, gy, saved, ctx: backward(gy, saved)


FORWARD["relu"] = lambda layer, xs, ctx: relu.relu_forward(xs[0], inplace=ctx.overwritable(layer) == 0)
BACKWARD["relu"] = lambda layer, gy, saved, ctx: [relu.relu_backward(gy, saved)]
_one_input("flatten", flatten.flatten_forward, flatten.flatten_backward)
_one_input("global_avgpool", pool.global_avgpool_forward, pool.global_avgpool_backward)
_one_input("maxpool2d", pool.maxpool2d_forward, pool.maxpool2d_backward, _pool_geometry)
_one_input("avgpool2d", pool.avgpool2d_forward, pool.avgpool2d_backward, _pool_geometry)
_many_inputs("concat", concat.concat_forward, concat.concat_backward)
FORWARD["add"] = lambda layer, xs, ctx: add.add_forward(xs, inplace=ctx.overwritable(layer))
BACKWARD["add"] = lambda layer, gy, saved, ctx: add.add_backward(gy, saved)


def _weighted(op, forward, backward, configure=None):
    """conv2d and linear: weight (and bias) from ``ctx.params``; ``gw`` written straight into ``ctx.grads``."""
    def run_forward(layer, xs, ctx):
        extra = () if configure is None else (configure(layer, ctx),)
        return forward(xs[0], _param(ctx, layer, "weight"), _param(ctx, layer, "bias"), *extra,
                       need_input_grad=ctx.needs_input_grad(layer))

    def run_backward(layer, gy, saved, ctx):
        gx, _, gb = backward(gy, saved, gw_out=ctx.grads[f"{layer.name}.weight"])
        if gb is not None:
            ctx.grads[f"{layer.name}.bias"][...] = gb
        return [gx]
    FORWARD[op], BACKWARD[op] = run_forward, run_backward


def _conv_geometry(layer, ctx):
    a = layer.attrs
    site = ctx.site(layer)
    return conv.ConvGeometry(site.stride(pair(a["stride"])), site.padding, a["dilation"])


_weighted("conv2d", conv.conv2d_forward, conv.conv2d_backward, _conv_geometry)
_weighted("linear", linear.linear_forward, linear.linear_backward)


def _batchnorm_forward(layer, xs, ctx):
    a = layer.attrs
    return batchnorm.batchnorm2d_forward(
        xs[0], _param(ctx, layer, "weight"), _param(ctx, layer, "bias"),
        ctx.buffers[f"{layer.name}.running_mean"], ctx.buffers[f"{layer.name}.running_var"],
        eps=a["eps"], momentum=a["momentum"], training=ctx.training,
        reduce=ctx.site(layer).reduce, count=ctx.site(layer).count)   # sums over the tiles with these channels


def _batchnorm_backward(layer, gy, saved, ctx):
    gx, ggamma, gbeta = batchnorm.batchnorm2d_backward(gy, saved)
    ctx.grads[f"{layer.name}.weight"][...] = ggamma
    ctx.grads[f"{layer.name}.bias"][...] = gbeta
    return [gx]


def _dropout_forward(layer, xs, ctx):
    if not ctx.training:
        return xs[0], None
    key = dropout.stream_key(ctx.seed, ctx.step, layer.name)
    site = ctx.site(layer)
    return dropout.dropout_forward(xs[0], layer.attrs["p"], key, start=site.start, global_shape=site.global_shape,
                                   inplace=ctx.overwritable(layer) == 0)


FORWARD["batchnorm2d"], BACKWARD["batchnorm2d"] = _batchnorm_forward, _batchnorm_backward
FORWARD["dropout"] = _dropout_forward
BACKWARD["dropout"] = lambda layer, gy, saved, ctx: [dropout.dropout_backward(gy, saved)]
FORWARD["softmax_cross_entropy"] = lambda layer, xs, ctx: loss.softmax_cross_entropy_forward(
    xs[0], ctx.labels, total=ctx.site(layer).total)
BACKWARD["softmax_cross_entropy"] = lambda layer, gy, saved, ctx: [loss.softmax_cross_entropy_backward(gy, saved)]
