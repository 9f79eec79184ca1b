"""How far a float32 result may lie from the exact one, derived from the sums that compute it.

Rounding error enters a network through its sums (dot products, reductions); a sum of K terms computed in
floating point errs relative to its magnitude ``M = sum |terms|``:

- worst case, in any order of summation (any BLAS kernel, blocking or thread split): each term goes through at
  most K roundings (its product and K - 1 additions; adding an exact zero rounds nothing), each a factor
  (1 + d) with |d| <= u, so ``|computed - exact| <= gamma_K * M``, ``gamma_K = K u / (1 - K u)`` (Higham,
  *Accuracy and Stability of Numerical Algorithms*, 2nd ed., 2002, Lemma 3.1 and §3.1). The single-op tests
  (tests/ops/test_ops_vs_torch.py) use this bound, which no implementation of the sum can break.
- in practice: the roundings are independent and of either sign; they add up like a random walk and the error
  stays within about ``sqrt(K) u M``, beyond a small multiple of that only with a probability exponentially
  small in the multiple (Higham & Mary, "A new approach to probabilistic rounding error analysis", SIAM J. Sci.
  Comput. 41(5), 2019). Through a network, each sum's error is carried forward by the layers after it the way
  values are, so that it stays within its share ``sqrt(K) u`` of the final value's magnitude; the error of the
  value is then at most ``u * S * M`` with ``S = sum of sqrt(K)`` over the sums on its way, its *budget*. The
  whole-network tests (tests/runtime/test_models_vs_torch.py) use this bound and measure the margin it leaves;
  the worst case (``sum of K``) would be thousands of times looser and let real faults through.

``u`` is the unit roundoff of float32. The lengths K come from the graph: layers' ops, attributes and shapes.
"""

import math

UNIT_ROUNDOFF = 2.0 ** -24          # float32: half the distance from 1 to the next float (np.finfo(float32).eps/2)


def gamma(K, u=UNIT_ROUNDOFF):
    """``gamma_K = K u / (1 - K u)``: the worst-case relative error of a sum of K rounded terms (Higham, Lemma
    3.1), for any order of summation."""
    assert K * u < 1, f"gamma_{K} is undefined for u = {u}"
    return K * u / (1 - K * u)


def conv_lengths(x_shape, w_shape, y_shape):
    """Terms in the sum behind one element of each result of a convolution over any spatial rank (padding's zero
    terms included):

    ``y``: C*prod(k) (channels times kernel positions); ``gx``: K*prod(k) (an input element is read by at most
    every kernel position of every output channel); ``gw`` and ``gb``: N*prod(O) (every output position)."""
    N, C = x_shape[:2]
    K, taps = w_shape[0], math.prod(w_shape[2:])
    positions = y_shape[0] * math.prod(y_shape[2:])
    return {"y": C * taps, "gx": K * taps, "gw": positions, "gb": positions}


def linear_lengths(x_shape, w_shape):
    """Terms in the sum behind one element of each result of ``y = x w^T + b``: ``y`` F_in, ``gx = gy w`` F_out,
    ``gw = gy^T x`` and ``gb`` the batch N."""
    N, F_in = x_shape
    F_out, _ = w_shape
    return {"y": F_in, "gx": F_out, "gw": N, "gb": N}


def _windows_per_input(window):
    """How many pooling windows read one input element at most: ceil(k / s) per dimension."""
    return math.prod(math.ceil(k / s) for k, s in zip(window.kernel, window.stride))


def layer_sums(layer, batch):
    """``(forward, backward, params)``: the lengths of the sums ``layer`` computes for a batch of ``batch``:
    on the way to its output, on the way to its input gradient, and ``{param: length}`` for its parameters'
    gradients. A bias adds one term to its layer's output sum."""
    op = layer.spec.family
    bias = int("bias" in layer.params)
    if op == "conv":
        n = conv_lengths((batch,) + tuple(layer.in_shapes[0]), layer.params["weight"],
                         (batch,) + tuple(layer.out_shape))
        return [n["y"] + bias], [n["gx"]], {"weight": n["gw"], "bias": n["gb"]}
    if op == "linear":
        n = linear_lengths((batch,) + tuple(layer.in_shapes[0]), layer.params["weight"])
        return [n["y"] + bias], [n["gx"]], {"weight": n["gw"], "bias": n["gb"]}
    if op == "batchnorm":
        M = batch * math.prod(layer.in_shapes[0][1:])
        # forward: the mean, then the variance; backward: sum(gy) and sum(gy * xhat), both in gx
        return [M, M], [M, M], {"weight": M, "bias": M}
    if op == "avgpool":
        return [math.prod(layer.window.kernel)], [_windows_per_input(layer.window)], {}
    if op == "maxpool":
        return [], [_windows_per_input(layer.window)], {}
    if op == "global_avgpool":
        return [math.prod(layer.in_shapes[0][1:])], [], {}
    if op == "add":
        return [len(layer.inputs)], [], {}
    if op == "softmax_cross_entropy":
        classes, = layer.in_shapes[0]
        return [classes, batch], [], {}     # the sum of exponentials, the mean over the batch
    if op == "dice_loss":
        classes, *spatial = layer.in_shapes[0]
        # the sum of exponentials, Dice's sums over a sample's positions, the means over the batch
        return [classes, math.prod(spatial), batch * classes, batch * math.prod(spatial)], [], {}
    if op == "mse_loss":
        outputs, = layer.in_shapes[0]
        return [outputs * batch], [], {}    # the sum of squares over the batch and the outputs
    return [], [], {}                       # element-wise, dropout, flatten, concat: no sums


def budget(lengths):
    """``sum of sqrt(K)`` over sums of the given lengths."""
    return sum(math.sqrt(K) for K in lengths)


def forward_budget(graph, batch, upto):
    """The budget of the forward sums of every layer up to and including ``upto`` (in execution order)."""
    total = 0.0
    for layer in graph.layers:
        total += budget(layer_sums(layer, batch)[0])
        if layer.name == upto:
            return total
    raise KeyError(upto)


def gradient_budgets(graph, batch):
    """``{param: S}``: the budget of every sum on the way to that parameter's gradient.

    The loss depends on every layer's forward sums; the gradient then comes back through the backward sums of
    the layers after the parameter's own (in execution order: a superset of those it flows through), and of the
    gradients added where a tensor has several consumers, and ends in the parameter's own sum."""
    forward = forward_budget(graph, batch, graph.loss.name)
    budgets, backward = {}, 0.0
    for layer in reversed(graph.layers):
        _, back, params = layer_sums(layer, batch)
        consumers = len(graph.consumers[layer.name])
        backward += math.sqrt(consumers) if consumers > 1 else 0.0     # this layer's gy, summed over them
        for kind, length in params.items():
            if kind in layer.params:
                budgets[f"{layer.name}.{kind}"] = forward + backward + math.sqrt(length)
        backward += budget(back)
    return budgets
