"""Element-wise product of two tensors, the axes of size 1 of either broadcast over the other's, as PyTorch's
``a * b`` for tensors of one rank: squeeze-and-excitation's gate ``(N, C, 1, 1)`` over ``(N, C, H, W)``.

    y = a * b,    ga = gy * b  (summed over the axes a broadcasts),    gb = gy * a  (summed over b's)

A tile reads, of an input with an axis of size 1 where the output's is longer, that one element along it
(``tiling/fields.py``: ``READS_BROADCAST``); the gradient it returns for that input is its part of the sum over
the axis, which the exchange's adjoint adds up over the tiles that read the same element. Forward keeps both
inputs."""


def _summed_to(g, shape):
    """``g`` summed over the axes where ``shape`` has 1 and ``g`` more (kept, of size 1)."""
    axes = tuple(axis for axis, (have, want) in enumerate(zip(g.shape, shape)) if want == 1 and have != 1)
    return g.sum(axis=axes, keepdims=True) if axes else g


def mul_forward(a, b):
    """``(a * b, (a, b))``."""
    return a * b, (a, b)


def mul_backward(gy, saved, needs=(True, True)):
    """``[ga, gb]`` (None where ``needs`` says the input needs none), each of its input's shape."""
    a, b = saved
    return [_summed_to(gy * b, a.shape) if needs[0] else None, _summed_to(gy * a, b.shape) if needs[1] else None]
