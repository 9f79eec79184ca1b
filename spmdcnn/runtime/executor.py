"""The executor: runs this rank's tiles of a Graph under a Plan, forward and backward.

Per layer, in execution order, every rank takes part in the layer's exchange (sending the parts of its producer
tiles others need, assembling the input boxes its own tile reads) and then, if it holds a tile, computes it.
Backward runs the layers in reverse: the tile's backward, then the exchange's adjoint, which sums input-box
gradients into the producer tiles. Each replica group sums its parameter gradients in buckets: a bucket's
allreduce starts as soon as backward has made its last gradient (with ``sync.overlap``; otherwise after
backward) and runs while backward goes on, MPI driven between layers; the update of a bucket's parameters
waits for that bucket only. On a machine of ``sync: parameter-server`` each layer's gradients are summed through
their group's server right after its backward, before backward goes on.

Activations are dropped as soon as the last consumer's exchange has run (backward keeps only what each op
saved); layers whose inputs need no gradient (the first convolution) skip computing it; relu, dropout and add
write over an input nobody else reads. With no plan, the executor runs the whole network in this process (one
tile per layer), for any batch size.
"""

from dataclasses import dataclass
from time import perf_counter

import numpy as np

from .. import backend
from ..comm import World
from ..cost.buckets import SyncOptions
from ..graph.blocks import DATA
from ..graph.optable import ANSWERS_LABELS, KEEPS_OUTPUT
from ..io.batch import Batch
from ..ops.loss import scores
from ..ops.mse import absolute_errors
from ..tiling.boxes import relative
from ..tiling.ghost import ghost_group
from ..tiling.plan import named
from . import kernels
from .params import FlatStore, initial_value
from .program import Program

def overwritable_inputs(graph):
    """``{layer: index of the input it may overwrite, or None}`` for every layer.

    An in-place layer (the op table's ``inplace``) may overwrite input ``i`` when no one else can see that memory:
    the tensor has this layer as its only consumer, and so has every tensor it may share memory with, back through
    layers that may return their input (``view``: flatten, dropout) and through earlier in-place layers, to a
    layer's own output (never the data), and no layer along the way keeps its output for backward (tanh)."""
    result = {}

    def exclusive(ref):
        while True:
            if ref == DATA or len(graph.consumers[ref]) != 1:
                return False
            producer = graph.by_name[ref]
            if producer.spec.keeps == KEEPS_OUTPUT:
                return False
            index = 0 if producer.spec.view else result.get(ref)
            if index is None:
                return True
            ref = producer.inputs[index]

    for layer in graph.layers:
        result[layer.name] = None
        if layer.spec.inplace:
            result[layer.name] = next((i for i, ref in enumerate(layer.inputs) if exclusive(ref)), None)
    return result


def _score(layer, output, answers, classes):
    """What the loss layer's tile adds to the batch's score: ``(right predictions, per-class table or None)``
    against labels (``ops/loss.scores``; the table with ``classes``), or ``(sum of absolute errors, None)``
    against targets."""
    if layer.spec.answers == ANSWERS_LABELS:
        return scores(output, answers, layer.attrs["ignore_index"], classes)
    return absolute_errors(output, answers), None


@dataclass
class Tally:
    """What the last :meth:`Executor.forward` counted over the global batch: the ``counted`` elements its loss
    averaged over (labelled samples or positions, or target values) and, for a loss per position in evaluation
    (``training=False``), ``classes``: a (3, K) array of, per class, the positions predicted right, predicted as it
    and labelled as it."""

    counted: float = 0.0
    classes: object = None


def array_batch(images, answers):
    """A :class:`~spmdcnn.io.batch.Batch` held whole in memory: the global ``images`` (N, C, S...) and
    ``answers`` ((N,) labels, (N, S...) masks or (N, K) targets) arrays; each tile reads its box of them."""
    whole = tuple((0, extent) for extent in images.shape)
    return Batch(len(answers), lambda box, steps: images[relative(box, whole, steps)],
                 lambda box: answers[tuple(slice(lo, hi) for lo, hi in box)])


class Executor:
    """Parameters, gradients and buffers of this rank's shards, and the forward and backward passes.

    ``plan=None`` runs the whole model in this process (batch size free); otherwise ``plan`` and ``world``
    (a :class:`~spmdcnn.comm.World`) fix the tiles of this rank. ``overwrite=False`` keeps every layer from
    writing over its inputs (the results are the same; tests compare the two). ``sync``: the job's ``sync``
    mapping or a :class:`~spmdcnn.cost.buckets.SyncOptions` (bucket size, overlap, and the machine's mode:
    gradients through parameter servers, layer by layer on the critical path). ``batchnorm``: the job's
    ``batchnorm`` key (``global`` or None, or ``{group: G}``: ghost batch norm over groups of G samples).
    """

    def __init__(self, graph, xp=np, dtype=np.float32, seed=0, plan=None, world=None, overwrite=True, sync=None,
                 batchnorm=None):
        self.graph = graph
        self.xp = xp
        self.dtype = np.dtype(dtype)                       # activations and their gradients
        self.param_dtype = backend.master_dtype(dtype)      # parameters, gradients, buffers (bfloat16: float32)
        self.seed = seed
        self.world = world or World(None)
        self.plan = plan
        self.sync = SyncOptions.of(sync)
        self.batchnorm = ghost_group(batchnorm)
        self.trace = None           # a runtime.trace.Tracer while a step is traced (spmdcnn bench --trace)
        self.tally = Tally()        # what the last forward counted
        self._gloss = 0.0           # where the loss's backward starts (kernels.finish_loss)
        self.overwritable = overwritable_inputs(graph) if overwrite else {layer.name: None for layer in graph.layers}
        self.program = self._program(plan or named("data", graph, 1, 1), fresh=True)
        self._saved = {}
        self.reset_parameters(seed)

    def _program(self, plan, fresh):
        """The :class:`~spmdcnn.runtime.program.Program` of ``plan``, bound to new flat stores laid out by it when
        ``fresh``, else to the executor's own (the same shards: the whole model at another batch size)."""
        group = self.batchnorm
        if group is not None and plan.batch % group:
            if self.plan is not None:
                raise ValueError(f"batchnorm.group {group} does not divide the batch of {plan.batch}")
            group = None        # without a plan, any batch evaluates; training refuses it (forward)
        program = Program(self.graph, plan, self.world, self.dtype, self.xp, self.sync, group)
        if fresh:
            self.params = FlatStore(program.shapes(param=True), self.param_dtype, self.xp)
            self.grads = FlatStore(program.shapes(param=True), self.param_dtype, self.xp)
            self.buffers = FlatStore(program.shapes(param=False), self.param_dtype, self.xp)
        program.bind(self.params, self.grads, self.buffers, self.seed, self.overwritable)
        return program

    @property
    def shards(self):
        """``{name: index}``: the slices of each global tensor this rank holds (its output channels' part, along
        the first axis, or the axis the op table gives: :class:`~.program.Shard`)."""
        return {name: shard.index for name, shard in self.program.layout.items()}

    def reset_parameters(self, seed):
        """PyTorch's default initialisation, keyed by (seed, tensor name), sliced to this rank's shards."""
        for name, shard in self.program.layout.items():
            layer = self.graph.by_name[shard.layer]
            store = self.params if shard.param else self.buffers
            store[name][...] = self.xp.asarray(initial_value(layer, shard.kind, seed, shard.rows, shard.axis),
                                               self.param_dtype)

    def site(self, layer):
        """This rank's :class:`~spmdcnn.runtime.program.Site` of ``layer`` (its box, needs, kernel, ...)."""
        return self.program.sites[layer.name]

    def data_reads(self, batch=None):
        """The ``(box, steps)`` of the data this rank's tiles read of every batch (global batch coordinates), of
        ``batch`` samples when given (without a plan the executor takes any batch size)."""
        if batch is not None:
            self._batch_program(batch)
        reads = []
        for site in self.program.sites.values():
            if site.box is not None:
                reads += [(site.needs[slot].box, site.needs[slot].steps)
                          for slot, ref in enumerate(site.layer.inputs) if ref == DATA]
        return reads

    def _batch_program(self, size):
        if self.plan is None and self.program.plan.batch != size:
            self.program = self._program(named("data", self.graph, size, 1), fresh=False)
        elif self.plan is not None and size != self.plan.batch:
            raise ValueError(f"the plan is for batch {self.plan.batch}, got a batch of {size}")

    def forward(self, images, labels=None, step=0, training=True, keep=(), also=None):
        """Run the network on a batch: ``images, labels`` arrays of the global batch, or a
        :class:`~spmdcnn.io.batch.Batch` (each tile reads only its box).

        Returns ``(loss, score, kept)``: the global mean loss, its score over the global batch (the number of right
        predictions, of samples or of labelled positions, or for a regression loss the sum of absolute errors over
        samples and targets: padding samples count in neither), and ``{name: this rank's tile}`` for the layers
        named in ``keep`` that it holds (those are left as computed: no layer writes over them); :attr:`tally`
        then holds what it counted (:class:`Tally`). ``also``: a float64 array of this rank's numbers to sum over
        the ranks with the loss, in place (the trainer's signal flags ride on the loss's sum rather than cost the
        step a meeting of their own)."""
        batch = images if labels is None else array_batch(images, labels)
        if training and self.batchnorm is not None and batch.size % self.batchnorm:
            raise ValueError(f"batchnorm.group {self.batchnorm} does not divide the batch of {batch.size}")
        self._batch_program(batch.size)
        self.program.finish_deferred()          # a forward with no backward after it left some
        run = kernels.Run(training, step, overwrite=not keep)
        remaining = {name: len(users) for name, users in self.graph.consumers.items()}
        outputs, kept = {}, {}
        self._saved = {}
        loss = counted = correct = 0.0
        loss_layer = self.graph.loss
        loss_table = np.zeros(self.graph.loss_table(batch.size))
        per_class = self.graph.classes_scored and not training      # IoU and Dice: evaluation's alone
        table = np.zeros((3, self.graph.num_classes if per_class else 0))
        board = self.world.board        # where this rank is, for the stall watchdog (comm/watchdog.py)
        for site in self.program.sites.values():
            layer = site.layer
            board.at("forward", layer.name, "its input exchange" if site.exchange is not None else None)
            started = perf_counter()
            inputs = self._gather_inputs(site, outputs, batch)
            if self.trace is not None and site.exchange is not None:
                self.trace.span(layer.name, "exchange", started)
            for ref in layer.inputs:
                remaining[ref] -= 1
                if remaining[ref] == 0:
                    outputs.pop(ref, None)
            if site.kernel is None:
                continue
            xs = [inputs[slot] for slot in range(len(layer.inputs))]
            is_loss = layer is loss_layer
            if is_loss:
                answers = self.xp.asarray(batch.answers(site.box[:1] + site.box[2:]))     # no channel axis
                correct, classes = _score(layer, xs[0], answers, per_class)
                if classes is not None:
                    table = backend.to_numpy(classes)
                xs.append(answers)
            board.note("computing")
            started = perf_counter()
            y, saved = site.kernel.forward(xs, run)
            if self.trace is not None:
                self.trace.span(layer.name, "forward", started)
            if training and layer.needs_grad:
                self._saved[layer.name] = saved
            if is_loss:
                loss, counted = y.sum, y.counted
                if y.table is not None:
                    loss_table = y.table
            else:
                outputs[layer.name] = y
            if layer.name in keep:
                kept[layer.name] = y
        extra = () if also is None else also.tolist()
        board.at("loss")
        loss, counted, correct, *summed = self.world.sum_scalars(loss, counted, correct, *table.ravel().tolist(),
                                                                 *loss_table.ravel().tolist(), *extra)
        if also is not None:
            also[:] = summed[table.size + loss_table.size:]
        self.tally = Tally(counted, np.array(summed[:table.size]).reshape(table.shape) if per_class else None)
        summed_table = np.array(summed[table.size:table.size + loss_table.size]).reshape(loss_table.shape)
        loss, self._gloss = kernels.finish_loss(loss_layer, loss, counted, summed_table)
        return loss, correct if self.graph.regression else int(round(correct)), kept

    def _gather_inputs(self, site, outputs, batch):
        """``{slot: input box array}`` for this rank's tile of the site's layer (empty when it holds none)."""
        inputs = {}
        layer = site.layer
        if site.exchange is not None:
            sources = {slot: outputs[ref] for slot, ref in enumerate(layer.inputs) if ref in outputs}
            inputs = site.exchange.forward(sources, site.exchanged)
        if site.box is not None:
            for slot, ref in enumerate(layer.inputs):
                if ref == DATA:
                    need = site.needs[slot]
                    images = batch.images(need.box, need.steps)
                    inputs[slot] = self.xp.ascontiguousarray(self.xp.asarray(images, dtype=self.dtype))
        return inputs

    def backward(self, keep=(), update=None):
        """Backpropagate from the loss of the last :meth:`forward`; fills ``self.grads`` (summed over replica
        groups). ``update(start, stop)``, when given, is called on every slice of the flat gradient array once it
        is final: the slices no bucket sums first, then each bucket as its sum completes (the optimizer's update
        of those parameters). Returns ``{name: gradient of this rank's tile}`` for the outputs named in ``keep``."""
        graph, program = self.graph, self.program
        flat = self.grads.flat
        overlapping = self.sync.overlapping
        pending, kept, inflight = {}, {}, []
        board = self.world.board
        if program.sites[graph.loss.name].box is not None:
            pending[graph.loss.name] = self._gloss
        for site in reversed(program.sites.values()):
            layer = site.layer
            saved = self._saved.pop(layer.name, None)
            if not layer.needs_grad:
                continue
            slots = site.grad_slots
            gxs = {}
            board.at("backward", layer.name, "computing" if site.kernel is not None else None)
            if site.kernel is not None:
                gy = pending.pop(layer.name)
                if layer.name in keep:
                    kept[layer.name] = gy
                started = perf_counter()
                gxs = dict(enumerate(site.kernel.backward(gy, saved)))
                if self.trace is not None:
                    self.trace.span(layer.name, "backward", started)
                if overlapping and layer.name in program.ready:
                    board.note("starting its gradient sums")    # a server's push is done when it returns
                    inflight += [(b, b.start_sum(flat[b.start:b.stop])) for b in program.ready[layer.name]]
            for _, sum_ in inflight:
                sum_.test()             # lets MPI progress them between layers
            if not slots:
                continue
            board.note("its gradient exchange")
            started = perf_counter()
            back = site.exchange.adjoint({s: gxs[s] for s in slots if s in gxs}, site.input_tiles, slots)
            if self.trace is not None:
                self.trace.span(layer.name, "exchange", started)
            for slot, gx in back.items():
                ref = layer.inputs[slot]
                pending[ref] = gx if ref not in pending else pending[ref] + gx
        self._saved = {}
        if not overlapping:
            inflight = [(b, b.start_sum(flat[b.start:b.stop])) for b in program.buckets]
        if update is not None and self.trace is not None:
            update = self.trace.timed(update, "update")
        board.at("gradients")
        if update is not None:
            for start, stop in program.local:
                update(start, stop)
        for number, (bucket, sum_) in enumerate(inflight, 1):
            board.note(f"bucket {number} of {len(inflight)}")
            sum_.wait()
            if update is not None:
                update(bucket.start, bucket.stop)
        program.finish_deferred()
        return kept
