"""SGD exactly as PyTorch's ``torch.optim.SGD`` (dampening 0):

    g = grad + weight_decay * w;   v = momentum * v + g;   w -= lr * v          (nesterov: w -= lr * (g + momentum * v))

It runs over the flat parameter array in cache-sized blocks, so each step reads w, grad and v once and writes
w and v once, whatever the number of tensors; on the host the blocks are shared out between threads.
"""

import numpy as np

from ..ops.cuda import kernels as cuda
from ..ops.parallel import parallel_for
from .params import FlatStore

BLOCK = 1 << 16


class SGD:
    def __init__(self, shapes, dtype, xp, lr=0.01, momentum=0.0, weight_decay=0.0, nesterov=False):
        if lr < 0 or momentum < 0 or weight_decay < 0:
            raise ValueError(f"optimizer: lr, momentum and weight_decay must be non-negative, got lr={lr}, "
                             f"momentum={momentum}, weight_decay={weight_decay}")
        if nesterov and momentum == 0:
            raise ValueError("optimizer: nesterov needs a momentum > 0")
        self.lr, self.momentum, self.weight_decay, self.nesterov = float(lr), float(momentum), \
            float(weight_decay), bool(nesterov)
        self.xp = xp
        self.velocity = FlatStore(shapes, dtype, xp) if momentum else None

    def step(self, weights, grads, lr=None, start=0, stop=None):
        """Update the flat array ``weights`` in place from the flat array ``grads``; only ``[start, stop)`` of
        them when given (an update is element-wise: slices updated one by one give the same bits)."""
        lr = self.lr if lr is None else float(lr)
        stop = weights.size if stop is None else stop
        if stop <= start:
            return
        if self.xp is np:
            blocks = -(-(stop - start) // BLOCK)
            parallel_for(lambda b0, b1: self._update(weights, grads, lr, start + b0 * BLOCK,
                                                     min(start + b1 * BLOCK, stop)), blocks, stop - start)
        else:                   # one fused kernel over the slice
            velocity = None if self.velocity is None else self.velocity.flat[start:stop]
            cuda.sgd_update(weights[start:stop], grads[start:stop], velocity, lr, self.momentum,
                            self.weight_decay, self.nesterov)

    def updater(self, weights, grads, lr=None):
        """``update(start, stop)``: :meth:`step` on a slice (the executor's backward calls it per bucket)."""
        return lambda start, stop: self.step(weights, grads, lr, start, stop)

    def _update(self, weights, grads, lr, begin, end, block=BLOCK):
        xp = self.xp
        mu, wd = self.momentum, self.weight_decay
        end = min(end, weights.size)
        g = xp.empty(min(block, max(end - begin, 0)), dtype=weights.dtype)
        for start in range(begin, end, block):
            stop = min(start + block, end)
            w, grad, gb = weights[start:stop], grads[start:stop], g[:stop - start]
            if wd:
                xp.multiply(w, wd, out=gb)
                gb += grad
            else:
                gb[...] = grad
            if mu:
                v = self.velocity.flat[start:stop]
                v *= mu
                v += gb
                if self.nesterov:
                    gb += mu * v
                else:
                    gb[...] = v
            gb *= lr
            w -= gb
