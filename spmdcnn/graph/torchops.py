"""torch.export's graph to spmdcnn layers, for ``spmdcnn model import`` (``graph/torchimport.py``): one handler per
ATen operator of the training graph (``graph/torchaten.py``), each appending the layer entry its node becomes, or
passing the value on (a permute of the channels to the last axis and back, a reshape to the same shape), or
refusing the node; every node refused is named in one message, with what spmdcnn maps instead.

The graph is the network's forward at one input shape, as it trains: dropout and stochastic depth are in it with
their probabilities, batch norm with its momentum. Its parameters and buffers are its inputs, under their
state-dict keys: a layer with tensors is named by their module's path (``features.1.0.block.0``), so its tensors
keep PyTorch's keys; a layer without is named by the module whose forward computes it (a ``torch.nn`` module's
path, or a function's module path and name: ``features.2.0.add``). An operator that writes into its input
(``relu_``, ``add_``) stands for that input from then on.

A value remembers whether its channels are last (after a permute): ConvNeXt's channels-last stretches become
channel ops (``layernorm`` over the channels, 1x1 convolutions for its linear layers, whose ``(out, in)`` weights
go in ``torch_shapes``); a parameter multiplied into a value (ConvNeXt's ``layer_scale``) becomes a ``layer_scale``
layer whose weight's PyTorch key goes in ``torch_names``. A module whose whole forward is one spmdcnn layer
(``torchaten.MODULES``: stochastic depth) becomes that layer, whatever operators spell it.
"""


from ..io.yamlfile import FormatError
from .torchargs import opname
from .torchaten import ATEN, MODULES
from .torchshapes import ATTENTION


class ImportFailure(FormatError):
    """A network that cannot be imported: one message naming every node that maps to nothing and why."""


class _Value:
    """What a graph node stands for: an spmdcnn layer's output (``name``; ``last``: its channels are the last axis,
    after a permute), or a parameter or buffer (``param``: its state-dict key; ``buffer``: it is a buffer).
    ``grouped``: the output's channels viewed as (groups, channels per group) on an axis of their own, ``(first,
    second, swapped)`` (ShuffleNet's reshape before its transpose, split attention's stacked paths; only the
    handlers that follow groups read it).
    ``view``: the shape a parameter is reshaped to (``gamma.reshape(1, -1, 1, 1)``), None for its own."""

    def __init__(self, name=None, last=False, param=None, buffer=False, grouped=None, view=None):
        self.name, self.last, self.param, self.buffer, self.grouped = name, last, param, buffer, grouped
        self.view = view


class _Refused(Exception):
    """A node refused (its reason is in ``Converter.refusals``), or one reading a refused node's value."""


class _Made:
    """A tensor the network makes from no input (``aten.zeros``: an LSTM's first state): refused where read."""

    def __init__(self, op):
        self.op = op


REFUSED = _Value("(refused)")        # what a refused node stands for: the nodes reading it are not refused again

LOSSES = ("cross_entropy", "dice_ce", "mse")    # --loss: what follows the network's output
UNKNOWN = "maps to no spmdcnn op"     # an operator with no handler: the message lists what maps


def main_output(result, fields=lambda value: value):
    """``(main output, what is left out)`` of what a network returns: itself, a dict's ``out`` (torchvision's
    segmentation models: ``aux`` left out), or a tuple's or list's first entry (auxiliary heads, deep supervision),
    nested ones followed; ``fields`` turns a value into a tuple where it stands for one. Works on graph nodes and
    on tensors alike."""
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


def _writes(node):
    """The argument an operator writes into (``relu_``'s input), or None."""
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return None
    for index, argument in enumerate(schema.arguments):
        if argument.alias_info is not None and argument.alias_info.is_write:
            return node.args[index] if index < len(node.args) else node.kwargs.get(argument.name)
    return None


class Converter:
    """Maps one exported network (``program``: ``torch.export.ExportedProgram`` of ``module``) to layer entries
    (module docstring)."""

    def __init__(self, program, module, source, loss=None):
        if loss is not None and loss not in LOSSES:
            raise ImportFailure(f"--loss takes {', '.join(LOSSES)}, got '{loss}'")
        self.program, self.module, self.source, self.loss = program, module, source, loss
        self.graph = program.graph
        self.refusals = []              # (where, node name, why, grouping key) per node that maps to nothing
        self.left_out = []              # the outputs the model leaves out (auxiliary heads)
        self.layers, self.values, self.names = [], {}, set()
        self.torch_names, self.torch_shapes = {}, {}
        self.owners = {}                # state-dict key -> the layer holding it (a tensor read twice is shared)
        self.shapes = {}                # layer name -> PyTorch's output shape for one sample, channels first
        self.inputs = {spec.arg.name: spec for spec in program.graph_signature.input_specs}
        self.tensors_by_key = {**dict(module.named_parameters(remove_duplicate=False)),
                               **dict(module.named_buffers(remove_duplicate=False))}
        self.collapsed, self.collapsed_output = self._collapsed()
        self._placeholders = {node.name: node for node in self.graph.nodes if node.op == "placeholder"}

    # -- names and layers --------------------------------------------------------------------------------------

    def fresh(self, base):
        """``base``, or ``base_1``, ``base_2``... where a layer has it already (a module called twice)."""
        name, count = base, 0
        while name in self.names or name == "data" or name == "loss":
            count += 1
            name = f"{base}_{count}"
        self.names.add(name)
        return name

    def add(self, node, entry, inputs, name=None, last=False, tensors=None):
        """Append layer ``entry`` (op and attributes) reading ``inputs`` (values); the node then stands for it.
        ``tensors`` (``{tensor: state-dict key}``, None for one it lacks) name it by their module; else it is
        named ``name`` or by the module whose forward computes it."""
        keys = {tensor: key for tensor, key in (tensors or {}).items() if key is not None}
        for key in keys.values():
            if key in self.owners:
                self.refuse(node, f"reads '{key}', which layer '{self.owners[key]}' reads too; spmdcnn layers do "
                                  "not share parameters")
        module = None
        if keys:
            prefixes = {key.rpartition(".")[0] for key in keys.values()}
            if len(prefixes) == 1 and all(key.rpartition(".")[2] == tensor for tensor, key in keys.items()):
                module = prefixes.pop()
        name = self.fresh(name or module or self.node_name(node))
        if keys and name != module:     # its tensors keep their keys: its module's, or each its own
            self.torch_names[name] = module if module else dict(keys)
        for key in keys.values():
            self.owners[key] = name
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
        return name

    @staticmethod
    def _stack(node):
        return list((node.meta.get("nn_module_stack") or {}).values())

    def node_name(self, node):
        """The path of the ``torch.nn`` module computing it; for a function, the path of the module whose forward
        calls it and the operator's name (``features.2.0.add``), or the operator's name at the top level."""
        base = opname(node).lstrip("_")
        stack = self._stack(node)
        if not stack or not stack[-1][0]:
            return base
        path, kind = stack[-1]
        if _leaf(kind) or path.rsplit(".", 1)[-1] == base:
            return path
        return f"{path}.{base}"

    def where(self, node):
        """``(where, grouping label)``: the operator and the module computing it."""
        stack = self._stack(node)
        op = f"aten.{opname(node)}" if hasattr(node.target, "_opname") else opname(node)
        if stack and stack[-1][0]:
            path, kind = stack[-1]
            kind = _short(kind)
            return f"{op} in module '{path}' ({kind})", (op, kind), path
        return f"{op} (node '{node.name}')", (op, None), node.name

    def refuse(self, node, why):
        where, label, name = self.where(node)
        self.refusals.append((where, label, name, why))
        raise _Refused()

    def shape(self, node):
        shape = node.meta.get("shape") if hasattr(node, "meta") else None
        if shape is None:
            self.refuse(node, "gives no single tensor (spmdcnn layers give one)")
        return shape

    def computed(self, arg):
        """Whether ``arg`` stands for an activation (a layer's output, the data, or a refused node's), not a
        parameter."""
        value = self.values.get(arg)
        return isinstance(value, _Value) and value.param is None

    def value(self, node, arg, several=False, grouped=False):
        """What ``arg`` stands for, as ``node`` reads it (``several``: it may be an operator's several outputs;
        ``grouped``: its channels may be viewed as groups)."""
        if not hasattr(arg, "op") or arg not in self.values:
            self.refuse(node, f"takes {arg!r}, which is not a tensor spmdcnn computes")
        value = self.values[arg]
        if value is REFUSED:
            raise _Refused()
        if isinstance(value, _Made):
            self.refuse(node, f"takes a tensor the network makes itself (aten.{value.op}), not one computed from its "
                              "input; spmdcnn's layers read their inputs and parameters")
        if isinstance(value, tuple) and not several:
            self.refuse(node, f"takes all of '{arg.name}', which gives several tensors")
        if isinstance(value, _Value) and value.grouped and not grouped:
            self.refuse(node, f"reads channels reshaped into groups {value.grouped[:2]} on an axis of their own; "
                              "spmdcnn follows such groups into a channel shuffle (a transpose and a reshape back), "
                              "a sum or a softmax over them, or a product with values grouped alike")
        return value

    def tensors(self, node, args, grouped=False):
        values = [self.value(node, arg, grouped=grouped) for arg in args]
        if any(value.param for value in values):
            self.refuse(node, "reads a parameter directly; spmdcnn takes a parameter only as a layer's weight, "
                              "bias or scale")
        return values

    def parameter(self, node, arg, buffer=False):
        """The state-dict key of a parameter (or with ``buffer``, a buffer) the node reads."""
        value = self.value(node, arg)
        if value.param is None or value.buffer != buffer:
            self.refuse(node, f"takes '{getattr(arg, 'name', arg)}' where spmdcnn takes "
                              f"{'a buffer' if buffer else 'a parameter'} of the network's")
        return value.param

    def tensor(self, key):
        return self.tensors_by_key[key]

    def owner_module(self, key):
        """The module holding state-dict entry ``key``, or None."""
        try:
            return self.module.get_submodule(key.rpartition(".")[0])
        except AttributeError:
            return None

    def viewed(self, node, value, shape):
        """The node stands for parameter ``value`` reshaped to ``shape``."""
        self.values[node] = _Value(param=value.param, buffer=value.buffer, view=tuple(shape))

    def alias(self, node, value, last=None, grouped=None):
        """The node stands for ``value`` (its channels last or not, as ``last`` says; ``grouped``: viewed as
        groups, a :class:`_Value`'s ``grouped``)."""
        self.values[node] = _Value(value.name, value.last if last is None else last, grouped=grouped)

    # -- the walk ------------------------------------------------------------------------------------------------

    def run(self):
        """The layer entries of the network's main output, with its loss; every node that maps to nothing is refused
        in one message, listing them all."""
        output = next(node for node in self.graph.nodes if node.op == "output")
        from torch.export.graph_signature import OutputKind
        from torch.utils._pytree import tree_unflatten
        leaves = [arg for arg, spec in zip(output.args[0], self.program.graph_signature.output_specs)
                  if spec.kind == OutputKind.USER_OUTPUT]
        result, self.left_out = main_output(tree_unflatten(leaves, self.program.call_spec.out_spec))
        needed = self.needed = self._needed(result)
        for node in self.graph.nodes:
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

    def state_keys(self):
        """The state-dict keys of the network's parameters and buffers, each tensor under one: the key the graph
        reads it by (a module registered under two paths, DynUNet's, has its tensors under both in the state dict
        and in the graph's inputs, and the graph reads one of them)."""
        read = {node.target for node in self.graph.nodes if node.op == "placeholder" and node.users}
        chosen = {}
        for spec in self.program.graph_signature.input_specs:
            if spec.kind.name in ("PARAMETER", "BUFFER"):
                tensor = id(self.tensors_by_key[spec.target])
                if tensor not in chosen or spec.arg.name in read:
                    chosen[tensor] = spec.target
        return set(chosen.values())

    def unread_keys(self):
        """The state-dict keys of the parameters no node of the graph reads (a module the forward never calls)."""
        keys = self.state_keys()
        return [spec.target for spec in self.program.graph_signature.input_specs
                if spec.kind.name == "PARAMETER" and spec.target in keys
                and not self._placeholders[spec.arg.name].users]

    def kept_keys(self):
        """The state-dict keys of the parameters the main output reads."""
        return [self.inputs[node.name].target for node in self.needed
                if node.op == "placeholder" and self.inputs[node.name].kind.name == "PARAMETER"]

    def _refusal_message(self):
        """One line naming every refused node: those refused for the same reason, of one operator and module type,
        together (a few of their names, and how many); where some map to nothing, what does map, once."""
        attention = [(label, name) for _, label, name, why in self.refusals if why == ATTENTION]
        if attention:                   # a transformer: that, not each of its other operators, is what to say
            modules = sorted({label[1] or "" for label, _ in attention} - {""})
            return (f"{self.source}: it is built on attention over activations ({len(attention)} nodes, in "
                    f"{', '.join(modules) or 'its forward'}): spmdcnn imports convolutional networks")
        known = ""
        if any(why == UNKNOWN for *_, why in self.refusals):
            known = "; spmdcnn maps the ATen operators " + ", ".join(sorted(ATEN)) + \
                " and the modules " + ", ".join(sorted(MODULES))
        if len(self.refusals) == 1:
            return f"{self.source}: {self.refusals[0][0]}: {self.refusals[0][3]}{known}"
        groups = {}
        for _, label, name, why in self.refusals:
            groups.setdefault((label, why), []).append(name)
        parts = []
        for number, (((op, kind), why), names) in enumerate(groups.items(), 1):
            plural = "s" if len(names) > 1 else ""
            named = ", ".join(f"'{name}'" for name in names[:3]) + \
                (f" and {len(names) - 3} more" if len(names) > 3 else "")
            where = f"{op} in module{plural} {named} ({kind})" if kind else f"{op} (node{plural} {named})"
            parts.append(f"({number}) {where}: {why}")
        return f"{self.source}: {len(self.refusals)} nodes are refused: " + "; ".join(parts) + known

    def _node(self, node):
        if node.op == "placeholder":
            spec = self.inputs[node.name]
            kind = spec.kind.name
            if kind == "USER_INPUT":
                if any(value.name == "data" for value in self.values.values() if isinstance(value, _Value)):
                    self.refuse(node, "is a second input; spmdcnn models take one")
                self.values[node] = _Value("data")
            elif kind in ("PARAMETER", "BUFFER"):
                self.values[node] = _Value(param=spec.target, buffer=kind == "BUFFER")
            else:
                self.values[node] = _Value(param=spec.target, buffer=True)
        elif node in self.collapsed:
            self._collapse(node)
        elif node.op == "call_function" and not node.all_input_nodes and hasattr(node.target, "_schema"):
            self.values[node] = _Made(opname(node))     # zeros, empty, arange: refused where a layer reads it
        elif node.op == "call_function":
            handler = ATEN.get(opname(node))
            if handler is None:
                self.refuse(node, UNKNOWN)
            handler(self, node)
            written = _writes(node)
            if written is not None and written in self.values:    # in place: the input is the result now
                self.values[written] = self.values[node]
        else:
            self.refuse(node, f"is a '{node.op}' node, which spmdcnn does not import")

    def _collapsed(self):
        """``({node: module path}, {module path: its output node})`` of the nodes computed by a module of
        ``MODULES`` (the outermost such module), and each such module's output: the last of its nodes."""
        collapsed, output = {}, {}
        for node in self.graph.nodes:
            for path, kind in self._stack(node):
                if _short(kind) in MODULES and path:
                    collapsed[node] = path
                    output[path] = node
                    break
        return collapsed, output

    def _collapse(self, node):
        """A node of a module of ``MODULES``: its output becomes the module's layer, its other nodes nothing."""
        path = self.collapsed[node]
        if self.collapsed_output[path] is not node:
            return
        inside = {other for other, owner in self.collapsed.items() if owner == path}
        outside = []
        for member in inside:
            for arg in member.all_input_nodes:
                if arg not in inside and arg not in outside and isinstance(self.values.get(arg), _Value) and \
                        self.values[arg].param is None:
                    outside.append(arg)
        kind = next(kind for owner, kind in self._stack(node) if owner == path)
        if len(outside) != 1:
            self.refuse(node, f"module '{path}' ({_short(kind)}) reads {len(outside)} tensors; it is imported as "
                              "one layer of one input")
        value = self.value(node, outside[0])
        module = self.module.get_submodule(path)
        entry = MODULES[_short(kind)](self, path, module, value)
        if isinstance(entry, str):
            self.refuse(node, entry)
        tensors = {name: f"{path}.{name}" for name, tensor in module.named_parameters(recurse=False)
                   if tensor is not None}       # its own parameters (a norm's weight), under their keys
        name = self.add(node, entry, [value], name=path, last=value.last, tensors=tensors)
        inside = self.shape(outside[0])
        if len(self.shape(node)) != len(inside):        # it flattens what it keeps the shape of (RadixSoftmax)
            self.shapes[name] = tuple(inside[1:])

    def _needed(self, result):
        """The nodes the main output reads, directly or through others, with the operators writing into them (the
        network's input always)."""
        needed = set()

        def close(nodes):
            stack = list(nodes)
            while stack:
                node = stack.pop()
                if node in needed:
                    continue
                needed.add(node)
                stack.extend(node.all_input_nodes)
        close([result] if hasattr(result, "op") else [])
        grown = True
        while grown:                    # an operator writing into a needed value is needed
            grown = False
            for node in self.graph.nodes:
                if node not in needed and node.op == "call_function" and _writes(node) in needed:
                    close([node])
                    grown = True
        return needed | {node for node in self.graph.nodes if node.op == "placeholder"
                         and self.inputs[node.name].kind.name == "USER_INPUT"}

    def _loss(self, output, result):
        """The loss after the main output: a cross-entropy of logits (N, K), per position of an output (N, K, S...)
        that keeps the input's spatial shape, or what ``--loss`` chose."""
        if not hasattr(result, "op"):
            self.refuse(output, f"the network returns {result!r}, not a tensor")
        value = self.value(output, result)
        shape = self.shape(result)
        data = next(node for node in self.graph.nodes if node.op == "placeholder"
                    and self.inputs[node.name].kind.name == "USER_INPUT")
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


def _short(kind):
    """A module type's name from export's module stack (``torch.nn.modules.conv.Conv2d`` -> ``Conv2d``)."""
    name = kind if isinstance(kind, str) else kind.__qualname__
    return name.rsplit(".", 1)[-1]


def _leaf(kind):
    """Whether a module type is one of ``torch.nn``'s own (not a container): its path names what it computes."""
    name = kind if isinstance(kind, str) else f"{kind.__module__}.{kind.__qualname__}"
    return name.startswith("torch.nn.modules.") and ".container." not in name
