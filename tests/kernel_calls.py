"""A record of every bound kernel's calls (``runtime/kernels.py``), to compare what training runs with what the
profiler times, kernel call for kernel call."""

import numpy as np

from spmdcnn.runtime import kernels


def _padded(kernel, x):
    """The shape of a window op's first input with the padding its tile adds: what the window slides over."""
    return x.shape[:2] + tuple(size + before + after for size, (before, after) in zip(x.shape[2:],
                                                                                       kernel.tile.padding))


def recording(monkeypatch):
    """Record every bound kernel's calls into the returned list: ``(op, "forward", output shape, computes its
    input gradient, geometry)`` where a window op's geometry is its padded input's shape and the stride it
    applies, and ``(op, "backward", which input gradients it returned)``. Bind the kernels after calling this."""
    calls = []
    for op, bind in list(kernels.BIND.items()):
        def traced(kernel, _bind=bind):
            forward, backward = _bind(kernel)
            layer = kernel.layer

            def run_forward(xs, run):
                geometry = (_padded(kernel, xs[0]), kernel.tile.stride(layer.window.stride)) \
                    if layer.spec.window else None
                y, saved = forward(xs, run)
                calls.append((layer.op, "forward", tuple(np.shape(y)), kernel.input_grad, geometry))
                return y, saved

            def run_backward(gy, saved):
                gxs = backward(gy, saved)
                calls.append((layer.op, "backward", tuple(g is not None for g in gxs)))
                return gxs
            return run_forward, run_backward
        monkeypatch.setitem(kernels.BIND, op, traced)
    return calls
