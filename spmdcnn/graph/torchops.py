"""torch.fx nodes to spmdcnn layers, for ``spmdcnn model import`` (``graph/torchimport.py``): one handler per
PyTorch module type (``graph/torchmodules.py``) and per function or tensor method (``graph/torchfunctions.py``),
each appending the layer entry its node becomes, or passing the value on (``nn.Identity``, a permute of the
channels to the last axis and back), or refusing the node in one message naming it and what spmdcnn takes
instead.

A value remembers whether its channels are last (after a permute): ConvNeXt's channels-last stretches become
channel ops (``layernorm`` over the channels, 1x1 convolutions for its linear layers, whose ``(out, in)`` weights
go in ``torch_shapes``); a parameter multiplied into a value (ConvNeXt's ``layer_scale``) becomes a ``layer_scale``
layer whose weight's PyTorch key goes in ``torch_names``. Layers are named by the module's path, or for a function
by its calling module's path and its own name (``features.2.0.add``), so tensors keep PyTorch's keys.
"""

import re

from ..io.yamlfile import FormatError
from .torchfunctions import FUNCTION_NAMES, FUNCTIONS
from .torchmodules import MODULES


class ImportFailure(FormatError):
    """A network that cannot be imported: one message naming the module or function and why."""


class _Value:
    """What a traced node stands for: an spmdcnn layer's output (``name``; ``last``: its channels are the last axis,
    after a permute), or a parameter (``param``: its qualified name)."""

    def __init__(self, name=None, last=False, param=None):
        self.name, self.last, self.param = name, last, param


class _Refused(Exception):
    """A node refused (its reason is in ``Converter.refusals``), or one reading a refused node's value."""


REFUSED = _Value("(refused)")        # what a refused node stands for: the nodes reading it are not refused again

LOSSES = ("cross_entropy", "dice_ce", "mse")    # --loss: what follows the network's output
UNKNOWN = "maps to no spmdcnn op"     # a module type or function with no handler: the message lists what maps


def main_output(result, fields=lambda value: value):
    """``(main output, what is left out)`` of what a network returns: itself, a dict's ``out`` (torchvision's
    segmentation models: ``aux`` left out), or a tuple's or list's first entry (auxiliary heads, deep supervision),
    nested ones followed; ``fields`` turns a traced named tuple into a tuple. Works on traced values and on tensors
    alike."""
    left_out = []
    while True:
        result = fields(result)
        if isinstance(result, dict) and result:
            key = "out" if "out" in result else next(iter(result))
            left_out += [f"output '{other}'" for other in result if other != key]
            result = result[key]
        elif isinstance(result, (tuple, list)) and result:
            left_out += [f"output {index}" for index in range(1, len(result))]
            result = result[0]
        else:
            return result, left_out


class Converter:
    """Maps one traced network to layer entries (module docstring)."""

    def __init__(self, graph, source, loss=None):
        if loss is not None and loss not in LOSSES:
            raise ImportFailure(f"--loss takes {', '.join(LOSSES)}, got '{loss}'")
        self.graph, self.source, self.loss = graph, source, loss
        self.refusals = []              # one line per node that maps to nothing, in the network's order
        self.left_out = []              # the outputs the model leaves out (auxiliary heads), and why
        self.modules = dict(graph.named_modules())
        self.layers, self.values, self.names = [], {}, set()
        self.torch_names, self.torch_shapes = {}, {}
        self.used_modules = set()
        self.shapes = {}                # layer name -> PyTorch's output shape for one sample, channels first

    # -- names and layers --------------------------------------------------------------------------------------

    def fresh(self, base):
        """``base``, or ``base_1``, ``base_2``... where a layer has it already (a module called twice)."""
        name, count = base, 0
        while name in self.names or name == "data" or name == "loss":
            count += 1
            name = f"{base}_{count}"
        self.names.add(name)
        return name

    def add(self, node, entry, inputs, name=None, last=False):
        """Append layer ``entry`` (op and attributes) named ``name`` (or the node's) reading ``inputs`` (values);
        the node then stands for it."""
        name = self.fresh(name or self._node_name(node))
        layer = {"name": name, **entry}
        names = [value.name for value in inputs]
        previous = self.layers[-1]["name"] if self.layers else "data"
        if names != [previous]:
            layer["inputs"] = names
        self.layers.append(layer)
        self.values[node] = _Value(name, last)
        shape = node.meta.get("shape")
        if shape is not None:           # one sample's, channels first: what the model must infer
            self.shapes[name] = (shape[-1],) + tuple(shape[1:-1]) if last else tuple(shape[1:])
        if node.op == "call_module" and name != node.target and \
                any(True for _ in self.modules[node.target].parameters()):
            self.torch_names[name] = node.target        # renamed (a module named data or loss): its keys stay
        return name

    def _node_name(self, node):
        """A module's path; for a function, the path of the module whose forward calls it and the function's name
        (``features.2.0.add``), or the node's name at the top level."""
        if node.op == "call_module":
            return node.target
        base = re.sub(r"_\d+$", "", node.name)
        stack = node.meta.get("nn_module_stack") or {}
        path = next(reversed(stack.values()))[0] if stack else ""
        if path.rsplit(".", 1)[-1] == base:         # a module that calls its function of the same name
            return path
        return f"{path}.{base}" if path else base

    def where(self, node):
        if node.op == "call_module":
            return f"module '{node.target}' ({type(self.modules[node.target]).__name__})"
        target = getattr(node.target, "__name__", str(node.target))
        return f"{node.op.replace('_', ' ')} '{target}' (node '{node.name}')"

    def refuse(self, node, why):
        self.refusals.append((self.where(node), node.name, why))
        raise _Refused()

    def shape(self, node):
        shape = node.meta.get("shape")
        if shape is None:
            self.refuse(node, "gives no single tensor (spmdcnn layers give one)")
        return shape

    def value(self, node, arg):
        if not hasattr(arg, "op") or arg not in self.values:
            self.refuse(node, f"takes {arg!r}, which is not a tensor spmdcnn computes")
        if self.values[arg] is REFUSED:
            raise _Refused()
        return self.values[arg]

    def tensors(self, node, args):
        values = [self.value(node, arg) for arg in args]
        if any(value.param for value in values):
            self.refuse(node, "reads a parameter directly; spmdcnn takes a parameter only as a layer scale")
        return values

    # -- the walk ------------------------------------------------------------------------------------------------

    def run(self):
        """The layer entries of the network's main output, with its loss; every node that maps to nothing is refused
        in one message, listing them all."""
        output = next(node for node in self.graph.graph.nodes if node.op == "output")
        result, self.left_out = main_output(output.args[0], self._fields)
        needed = self.needed = self._needed(result)
        for node in self.graph.graph.nodes:
            if node not in needed or node.op == "output":
                continue
            try:
                self._node(node)
            except _Refused:
                self.values[node] = REFUSED
        if not self.refusals:
            try:
                self._loss(output, result)
            except _Refused:
                pass
        if self.refusals:
            raise ImportFailure(self._refusal_message())
        return self.layers

    def _refusal_message(self):
        """One line naming every refused node: those refused for the same reason, of one function or module type,
        together (a few of their names, and how many); where some map to nothing, what does map, once."""
        known = ""
        if any(why == UNKNOWN for _, _, why in self.refusals):
            known = (f"; spmdcnn imports the modules {', '.join(sorted(MODULES))} and the functions "
                     + ", ".join(sorted(FUNCTION_NAMES)))
        if len(self.refusals) == 1:
            return f"{self.source}: {self.refusals[0][0]}: {self.refusals[0][2]}{known}"
        groups = {}
        for what, name, why in self.refusals:
            module = re.fullmatch(r"module '([^']*)' \((\w+)\)", what)
            kind = ("module", module.group(2)) if module else ("function", what.split(" (node")[0])
            groups.setdefault((kind, why), []).append(module.group(1) if module else name)
        parts = []
        for number, (((kind, label), why), names) in enumerate(groups.items(), 1):
            plural = "s" if len(names) > 1 else ""
            named = ", ".join(f"'{name}'" for name in names[:3]) + \
                (f" and {len(names) - 3} more" if len(names) > 3 else "")
            where = f"module{plural} {named} ({label})" if kind == "module" else f"{label} (node{plural} {named})"
            parts.append(f"({number}) {where}: {why}")
        return f"{self.source}: {len(self.refusals)} nodes are refused: " + "; ".join(parts) + known

    def _node(self, node):
        if node.op == "placeholder":
            if self.values:
                self.refuse(node, "is a second input; spmdcnn models take one")
            self.values[node] = _Value("data")
        elif node.op == "get_attr":
            self.values[node] = _Value(param=node.target)
        elif node.op == "call_module":
            self._module(node)
        elif node.op in ("call_function", "call_method"):
            self._function(node)

    @staticmethod
    def _fields(value):
        """A named tuple built in forward (GoogLeNet's outputs), as the tuple of its fields; any other value as is."""
        if hasattr(value, "op") and value.op == "call_function" and isinstance(value.target, type) and \
                issubclass(value.target, tuple):
            return tuple(value.args) + tuple(value.kwargs.values())
        return value

    def _needed(self, result):
        """The nodes the main output reads, directly or through others (the placeholder always)."""
        needed, stack = set(), [result] if hasattr(result, "op") else []
        while stack:
            node = stack.pop()
            if node in needed:
                continue
            needed.add(node)
            stack.extend(node.all_input_nodes)
        return needed | {node for node in self.graph.graph.nodes if node.op == "placeholder"}

    def _loss(self, output, result):
        """The loss after the main output: a cross-entropy of logits (N, K), per position of an output (N, K, S...)
        that keeps the input's spatial shape, or what ``--loss`` chose."""
        if not hasattr(result, "op"):
            self.refuse(output, f"the network returns {result!r}, not a tensor")
        value = self.value(output, result)
        shape = self.shape(result)
        data = next(node for node in self.graph.graph.nodes if node.op == "placeholder")
        spatial = tuple(self.shape(data)[2:])
        per_position = len(shape) > 2 and tuple(shape[2:]) == spatial
        if value.last or not (len(shape) == 2 or per_position):
            self.refuse(output, f"the network returns shape {shape}; spmdcnn imports classifiers returning logits "
                                f"(N, classes) and segmenters returning (N, classes, {', '.join(map(str, spatial))}) "
                                "at the input's positions, followed by their loss")
        loss = self.loss or "cross_entropy"
        if loss == "mse" and per_position:
            self.refuse(output, "--loss mse compares values per sample (N, K); this network returns values per "
                                "position")
        entry = {"name": "loss", "op": {"cross_entropy": "softmax_cross_entropy", "dice_ce": "dice_loss",
                                        "mse": "mse_loss"}[loss]}
        if loss == "dice_ce":               # MONAI's DiceCELoss(softmax=True, to_onehot_y=True) as it comes
            entry.update(dice=1.0, cross_entropy=1.0)
        if value.name != self.layers[-1]["name"]:
            entry["inputs"] = [value.name]
        self.layers.append(entry)

    def _module(self, node):
        module = self.modules[node.target]
        kind = type(module).__name__
        handler = MODULES.get(kind)
        if handler is None:
            self.refuse(node, UNKNOWN)
        if any(True for _ in module.parameters(recurse=False)) or any(True for _ in module.buffers(recurse=False)):
            if node.target in self.used_modules:
                self.refuse(node, "is called twice; spmdcnn layers do not share parameters")
            self.used_modules.add(node.target)
        if len(node.args) != 1 or node.kwargs:
            self.refuse(node, "is called with more than its input (an output size, a mask, a state): spmdcnn's "
                              "layers take their input alone")
        handler(self, node, module, self.tensors(node, node.args[:1]))

    def _function(self, node):
        target = node.target
        name = target if isinstance(target, str) else getattr(target, "__name__", str(target))
        handler = FUNCTIONS.get(name)
        if handler is None:
            self.refuse(node, UNKNOWN)
        handler(self, node)

    def alias(self, node, value, last=None):
        self.values[node] = _Value(value.name, value.last if last is None else last)
