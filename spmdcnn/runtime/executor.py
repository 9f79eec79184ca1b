"""The single-device executor: runs a Graph's forward and backward passes on whole tensors.

Activations are dropped as soon as their last consumer has run (backward keeps only what each op saved);
gradients of tensors read by several layers are summed; layers whose inputs need no gradient (the first
convolution) skip computing it.
"""

import numpy as np

from ..graph.blocks import DATA
from . import kernels
from .params import FlatStore, initial_value


INPLACE_OPS = ("relu", "dropout", "add")


def _overwritable_input(graph, layer):
    """The first input of an in-place-capable layer that is produced by a layer and read by no other."""
    if layer.op not in INPLACE_OPS:
        return None
    for index, ref in enumerate(layer.inputs):
        if ref != DATA and len(graph.consumers[ref]) == 1:
            return index
    return None


class Executor:
    """Parameters, gradients and buffers of one model, and its forward and backward passes."""

    def __init__(self, graph, xp=np, dtype=np.float32, seed=0):
        self.graph = graph
        self.xp = xp
        self.dtype = np.dtype(dtype)
        self.seed = seed
        self.params = FlatStore(graph.param_shapes(), self.dtype, xp)
        self.grads = FlatStore(graph.param_shapes(), self.dtype, xp)
        self.buffers = FlatStore(graph.buffer_shapes(), self.dtype, xp)
        self.training = True
        self.step = 0
        self.labels = None
        self._saved = {}
        self._requires_grad = {DATA: False}
        for layer in graph.layers:
            self._requires_grad[layer.name] = bool(layer.params) or any(
                self._requires_grad[ref] for ref in layer.inputs)
        self._overwritable = {layer.name: _overwritable_input(graph, layer) for layer in graph.layers}
        self._keep = ()
        self.reset_parameters(seed)

    def reset_parameters(self, seed):
        """PyTorch's default initialisation, keyed by (seed, tensor name)."""
        for layer in self.graph.layers:
            for kind in list(layer.params) + list(layer.buffers):
                store = self.params if kind in layer.params else self.buffers
                store[f"{layer.name}.{kind}"][...] = self.xp.asarray(initial_value(layer, kind, seed), self.dtype)

    def needs_input_grad(self, layer):
        return any(self._requires_grad[ref] for ref in layer.inputs)

    def overwritable(self, layer):
        """Index of an input ``layer`` may overwrite with its output (read by no one else), or None."""
        # outputs handed back through ``keep`` (tests) must stay as computed, views included: no overwriting then
        return None if self._keep else self._overwritable[layer.name]

    def forward(self, images, labels, step=0, training=True, keep=()):
        """Run the network; returns ``(loss, correct, kept)`` where ``correct`` counts right predictions and
        ``kept`` maps each name in ``keep`` to that layer's output."""
        graph = self.graph
        self.training, self.step = training, step
        self.labels = labels
        remaining = {name: len(users) for name, users in graph.consumers.items()}
        outputs = {DATA: images}
        kept = {}
        self._keep = keep
        self._saved = {}
        loss = correct = None
        for layer in graph.layers:
            xs = [outputs[ref] for ref in layer.inputs]
            if layer is graph.loss:
                logits = xs[0]
                correct = int((logits.argmax(axis=1) == labels).sum())
            y, saved = kernels.FORWARD[layer.op](layer, xs, self)
            if training and self._requires_grad[layer.name]:
                self._saved[layer.name] = saved
            outputs[layer.name] = y
            if layer.name in keep:
                kept[layer.name] = y
            for ref in layer.inputs:
                remaining[ref] -= 1
                if remaining[ref] == 0:
                    del outputs[ref]
            if layer is graph.loss:
                loss = y
        return loss, correct, kept

    def backward(self, keep=()):
        """Backpropagate from the loss of the last :meth:`forward`; fills ``self.grads``.

        Returns the gradients of the outputs named in ``keep`` (for tests)."""
        graph = self.graph
        pending = {graph.loss.name: 1.0}
        kept = {}
        for layer in reversed(graph.layers):
            saved = self._saved.pop(layer.name, None)
            if layer.name not in pending:
                continue
            gy = pending.pop(layer.name)
            if layer.name in keep:
                kept[layer.name] = gy
            gxs = kernels.BACKWARD[layer.op](layer, gy, saved, self)
            for ref, gx in zip(layer.inputs, gxs):
                if gx is None or not self._requires_grad[ref]:
                    continue
                pending[ref] = gx if ref not in pending else pending[ref] + gx
        self._saved = {}
        return kept
