"""Each op's forward and backward as the executor calls them: ``ops/`` functions bound to a layer's attributes,
parameters and gradients.

``forward(layer, xs, ctx) -> (y, saved)`` and ``backward(layer, gy, saved, ctx) -> [gx per input]``; a backward
writes parameter gradients into ``ctx.grads`` and returns None for inputs that need no gradient. ``ctx`` is the
executor: ``params``, ``grads``, ``buffers``, ``training``, ``step``, ``seed``, ``labels``, ``needs_input_grad``.
"""

from ..ops import add, batchnorm, concat, conv, dropout, flatten, linear, loss, pool, relu

FORWARD = {}
BACKWARD = {}


def _register(op):
    def wrap(pair):
        FORWARD[op], BACKWARD[op] = pair()
        return pair
    return wrap


def _param(ctx, layer, kind):
    name = f"{layer.name}.{kind}"
    return ctx.params[name] if name in ctx.params else None


@_register("conv2d")
def _conv():
    def forward(layer, xs, ctx):
        a = layer.attrs
        geometry = conv.ConvGeometry(a["stride"], a["padding"], a["dilation"])
        return conv.conv2d_forward(xs[0], _param(ctx, layer, "weight"), _param(ctx, layer, "bias"), geometry,
                                   need_input_grad=ctx.needs_input_grad(layer))

    def backward(layer, gy, saved, ctx):
        gx, _, gb = conv.conv2d_backward(gy, saved, gw_out=ctx.grads[f"{layer.name}.weight"])
        if gb is not None:
            ctx.grads[f"{layer.name}.bias"][...] = gb
        return [gx]
    return forward, backward


@_register("linear")
def _linear():
    def forward(layer, xs, ctx):
        return linear.linear_forward(xs[0], _param(ctx, layer, "weight"), _param(ctx, layer, "bias"),
                                     need_input_grad=ctx.needs_input_grad(layer))

    def backward(layer, gy, saved, ctx):
        gx, _, gb = linear.linear_backward(gy, saved, gw_out=ctx.grads[f"{layer.name}.weight"])
        if gb is not None:
            ctx.grads[f"{layer.name}.bias"][...] = gb
        return [gx]
    return forward, backward


@_register("maxpool2d")
def _maxpool():
    def forward(layer, xs, ctx):
        a = layer.attrs
        return pool.maxpool2d_forward(xs[0], pool.PoolGeometry(a["kernel"], a["stride"], a["padding"]))

    def backward(layer, gy, saved, ctx):
        return [pool.maxpool2d_backward(gy, saved)]
    return forward, backward


@_register("avgpool2d")
def _avgpool():
    def forward(layer, xs, ctx):
        a = layer.attrs
        return pool.avgpool2d_forward(xs[0], pool.PoolGeometry(a["kernel"], a["stride"], a["padding"]))

    def backward(layer, gy, saved, ctx):
        return [pool.avgpool2d_backward(gy, saved)]
    return forward, backward


@_register("global_avgpool")
def _global_avgpool():
    def forward(layer, xs, ctx):
        return pool.global_avgpool_forward(xs[0])

    def backward(layer, gy, saved, ctx):
        return [pool.global_avgpool_backward(gy, saved)]
    return forward, backward


@_register("relu")
def _relu():
    def forward(layer, xs, ctx):
        return relu.relu_forward(xs[0])

    def backward(layer, gy, saved, ctx):
        return [relu.relu_backward(gy, saved)]
    return forward, backward


@_register("batchnorm2d")
def _batchnorm():
    def forward(layer, xs, ctx):
        a = layer.attrs
        return batchnorm.batchnorm2d_forward(
            xs[0], _param(ctx, layer, "weight"), _param(ctx, layer, "bias"),
            ctx.buffers[f"{layer.name}.running_mean"], ctx.buffers[f"{layer.name}.running_var"],
            eps=a["eps"], momentum=a["momentum"], training=ctx.training)

    def backward(layer, gy, saved, ctx):
        gx, ggamma, gbeta = batchnorm.batchnorm2d_backward(gy, saved)
        ctx.grads[f"{layer.name}.weight"][...] = ggamma
        ctx.grads[f"{layer.name}.bias"][...] = gbeta
        return [gx]
    return forward, backward


@_register("dropout")
def _dropout():
    def forward(layer, xs, ctx):
        if not ctx.training:
            return xs[0], None
        key = dropout.stream_key(ctx.seed, ctx.step, layer.name)
        return dropout.dropout_forward(xs[0], layer.attrs["p"], key)

    def backward(layer, gy, saved, ctx):
        return [dropout.dropout_backward(gy, saved)]
    return forward, backward


@_register("flatten")
def _flatten():
    def forward(layer, xs, ctx):
        return flatten.flatten_forward(xs[0])

    def backward(layer, gy, saved, ctx):
        return [flatten.flatten_backward(gy, saved)]
    return forward, backward


@_register("concat")
def _concat():
    def forward(layer, xs, ctx):
        return concat.concat_forward(xs)

    def backward(layer, gy, saved, ctx):
        return concat.concat_backward(gy, saved)
    return forward, backward


@_register("add")
def _add():
    def forward(layer, xs, ctx):
        return add.add_forward(xs)

    def backward(layer, gy, saved, ctx):
        return add.add_backward(gy, saved)
    return forward, backward


@_register("softmax_cross_entropy")
def _loss():
    def forward(layer, xs, ctx):
        return loss.softmax_cross_entropy_forward(xs[0], ctx.labels)

    def backward(layer, gy, saved, ctx):
        return [loss.softmax_cross_entropy_backward(gy, saved)]
    return forward, backward
