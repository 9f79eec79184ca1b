"""The Graph: a model's layers in execution order with global shapes, parameters, buffers and FLOPs."""

from dataclasses import dataclass, field
from functools import cached_property
from math import prod

from ..io.yamlfile import FormatError, check_keys, read_yaml
from . import opkeys, opspec
from .optable import ANSWERS_TARGETS, OPS, channels_whole, needs_gradient, window
from .blocks import DATA, expand_layers

_MODEL_KEYS = {"name", "input", "layers", "blocks", "description", "torch_names", "torch_shapes", "torch_aliases"}


@dataclass
class Layer:
    """One layer; ``in_shapes`` and ``out_shape`` are per sample (no batch dimension)."""

    name: str
    op: str
    attrs: dict
    inputs: list
    in_shapes: list
    out_shape: tuple
    params: dict = field(default_factory=dict)
    buffers: dict = field(default_factory=dict)
    flops: int = 0
    group: str = ""      # the top-level entry of the model file (a block instance) this layer comes from
    input_grads: tuple = None   # per input: whether it needs a gradient (parse_model: optable.needs_gradient)
    needs_grad: bool = True     # whether the layer's output needs a gradient (its backward runs)

    def __post_init__(self):
        if self.input_grads is None:        # a layer made alone (tests): every input but the data
            self.input_grads = tuple(ref != DATA for ref in self.inputs)
        self.spec = OPS[self.op]            # the op's row of the op table (OpSpec); read per layer and step

    @property
    def spatial_rank(self):
        """The spatial axes of its (first) input: 3 for a volume, 2 for an image, 1 for a sequence, 0 for features."""
        return max(len(self.in_shapes[0]) - 1, 0) if self.in_shapes else 0

    @cached_property
    def window(self):
        """A window op's :class:`~spmdcnn.graph.optable.Window` (one value per spatial axis, padding per side)."""
        return window(self.attrs, self.spatial_rank, self.in_shapes[0][1:])

    def param_axis(self, kind):
        """The axis of parameter or buffer ``kind`` that holds the output channels, which a tile of some channels
        holds a part of: the first, but where the op table's ``param_axes`` says otherwise (a transposed
        convolution's weight, PyTorch's ``(C_in, C_out, k...)``)."""
        return self.spec.param_axis(kind)

    def shard_rows(self, kind, channels):
        """The rows along parameter or buffer ``kind``'s channel axis that a tile holding output ``channels``
        ``(c0, c1)`` holds: those channels, or the whole axis where it holds no row per channel (a grouped
        transposed convolution's weight, ``(C_in, C_out / groups, k...)``, a PReLU's shared slope: its channels are
        never split)."""
        shape, axis = self.params.get(kind, self.buffers.get(kind)), self.param_axis(kind)
        if channels_whole(self):
            return 0, shape[axis]
        return tuple(channels)

    def shard_shape(self, kind, channels):
        """The shape of the part of parameter or buffer ``kind`` a tile holding output ``channels`` ``(c0, c1)``
        holds."""
        shape = list(self.params.get(kind, self.buffers.get(kind)))
        r0, r1 = self.shard_rows(kind, channels)
        shape[self.param_axis(kind)] = r1 - r0
        return tuple(shape)

    @property
    def input_grad(self):
        """Whether the layer computes the gradient of any of its inputs."""
        return any(self.input_grads)

    @cached_property
    def signature(self):
        """What the layer computes, without its name: equal for the repeated layers of a network (the cost
        model works each such layer out once)."""
        return (self.op, repr(sorted(self.attrs.items())), tuple(map(tuple, self.in_shapes)), tuple(self.out_shape),
                DATA in self.inputs, self.input_grads, self.needs_grad)

    @property
    def num_params(self):
        total = 0
        for shape in self.params.values():
            count = 1
            for extent in shape:
                count *= extent
            total += count
        return total


class Graph:
    """A validated model. ``layers`` is in execution order (producers before consumers)."""

    def __init__(self, name, input_shape, layers, source="<model>", text="", torch_names=None, torch_shapes=None,
                 torch_aliases=None):
        self.name = name
        self.torch_aliases = dict(torch_aliases or {})  # PyTorch module path -> the other paths it is registered
        #                                                 under (its state dict holds its tensors under each)
        self.torch_names = dict(torch_names or {})     # layer name -> its module's name in PyTorch (torchvision), or
        #                                                  {tensor: its PyTorch key} (a bare nn.Parameter's)
        self.torch_shapes = dict(torch_shapes or {})   # tensor name -> its shape in PyTorch, where it differs
        self.input_shape = tuple(input_shape)
        self.layers = layers
        self.source = source
        self.text = text
        self.by_name = {layer.name: layer for layer in layers}
        self.consumers = {layer.name: [] for layer in layers}
        self.consumers[DATA] = []
        for layer in layers:
            for producer in layer.inputs:
                self.consumers[producer].append(layer.name)

    @property
    def loss(self):
        return self.layers[-1]

    @property
    def num_outputs(self):
        """What the loss reads per sample (or per position): the classes of softmax cross-entropy, the targets
        of mse_loss."""
        return self.loss.in_shapes[0][0]

    @property
    def dense_labels(self):
        """Whether the loss compares every position with a label (a mask (S...) per sample): segmentation."""
        return len(self.loss.in_shapes[0]) > 1

    @property
    def classes_scored(self):
        """Whether evaluation counts per class (IoU and Dice): for a loss per position."""
        return self.dense_labels

    def loss_table(self, batch):
        """The shape of the numbers per sample and class the loss's tiles add up over a batch of ``batch`` in the
        step's one reduction (Dice's intersection, prediction and label sums: ``ops/dice.py``); (0,): none."""
        sums = self.loss.spec.class_sums
        return (sums, batch, self.num_classes) if sums else (0,)

    @property
    def answer_shape(self):
        """The answers of one sample: () for a label, (S...) for a mask, (K,) for targets."""
        if self.regression:
            return (self.num_outputs,)
        return tuple(self.loss.in_shapes[0][1:])

    @property
    def num_classes(self):
        return self.num_outputs

    @property
    def answers(self):
        """What the loss compares the output with: ``labels`` (a class per sample) or ``targets`` (K values)."""
        return self.loss.spec.answers

    @property
    def regression(self):
        """Whether the loss regresses targets (mse_loss) rather than classifying."""
        return self.answers == ANSWERS_TARGETS

    @property
    def spatial_rank(self):
        """The spatial axes of a sample: 3 for volumes, 2 for images, 1 for sequences."""
        return len(self.input_shape) - 1

    @property
    def num_params(self):
        return sum(layer.num_params for layer in self.layers)

    def flops(self, batch=1):
        """Forward FLOPs for a batch."""
        return batch * sum(layer.flops for layer in self.layers)

    def param_shapes(self):
        """``{"<layer>.<name>": shape}`` for every parameter, in execution order."""
        return {f"{l.name}.{p}": shape for l in self.layers for p, shape in l.params.items()}

    def buffer_shapes(self):
        return {f"{l.name}.{b}": shape for l in self.layers for b, shape in l.buffers.items()}

    def __repr__(self):
        return f"Graph({self.name!r}, {len(self.layers)} layers, {self.num_params:,} parameters)"


def _check_input_shape(shape, source):
    if (not isinstance(shape, list) or not 2 <= len(shape) <= 4
            or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in shape)):
        raise FormatError(f"{source}: 'input' must be [C, H, W] for images, [C, D, H, W] for volumes or [C, W] for "
                          f"sequences, with positive integers, got {shape!r}")
    return tuple(shape)


def _execution_order(flat, source):
    """Topological order of the flat layers (stable: file order where the file allows); rejects cycles."""
    names = set()
    for entry in flat:
        if entry["name"] in names:
            raise FormatError(f"{source}: layer '{entry['name']}': two layers have this name")
        names.add(entry["name"])
    for entry in flat:
        for ref in entry["inputs"]:
            if ref != DATA and ref not in names:
                raise FormatError(f"{source}: layer '{entry['name']}': unknown input {ref!r}")
    by_name = {entry["name"]: entry for entry in flat}
    done, order = {DATA}, []
    for root in flat:
        # depth-first from each layer in file order, with an explicit stack (no recursion limit)
        if root["name"] in done:
            continue
        path, on_path = [(root["name"], iter(root["inputs"]))], {root["name"]}
        while path:
            name, pending = path[-1]
            ref = next(pending, None)
            if ref is None:
                path.pop()
                on_path.discard(name)
                done.add(name)
                order.append(by_name[name])
            elif ref in on_path:
                cycle = [n for n, _ in path][[n for n, _ in path].index(ref):] + [ref]
                raise FormatError(f"{source}: layer '{ref}': its inputs form a cycle ({' -> '.join(cycle)})")
            elif ref not in done:
                path.append((ref, iter(by_name[ref]["inputs"])))
                on_path.add(ref)
    return order


def parse_model(data, source="<model>", text=""):
    """Build and validate a Graph from a parsed model YAML mapping."""
    check_keys(data, _MODEL_KEYS, source, required=("name", "input", "layers"))
    if not isinstance(data["name"], str):
        raise FormatError(f"{source}: 'name' must be a string, got {data['name']!r}")
    input_shape = _check_input_shape(data["input"], source)
    expanded = expand_layers(data, source)
    groups = {entry["name"]: group for entry, group in expanded}
    flat = _execution_order([entry for entry, _ in expanded], source)
    shapes = {DATA: input_shape}
    needs = {DATA: False}
    layers = []
    for entry in flat:
        name, op = entry["name"], entry.get("op")
        where = f"{source}: layer '{name}'"
        given = {k: v for k, v in entry.items() if k not in ("name", "op", "inputs")}
        in_shapes = [shapes[ref] for ref in entry["inputs"]]
        op, given = opkeys.unaliased(op, given, in_shapes, where)
        if not isinstance(op, str) or op not in OPS:
            known = ", ".join(sorted(OPS | dict.fromkeys(opkeys.ALIASES)))
            raise FormatError(f"{where}: unknown op {op!r} (known ops: {known})")
        rank = OPS[op].spatial or len(in_shapes[0]) - 1     # how many values kernel, stride, ... may list
        attrs = opkeys.normalise(op, given, where, rank)
        out_shape, params, buffers, flops = opspec.infer(op, attrs, in_shapes, where)
        shapes[name] = tuple(out_shape)
        input_grads = tuple(needs[ref] for ref in entry["inputs"])
        needs[name] = needs_gradient(params, input_grads)
        layers.append(Layer(name, op, attrs, list(entry["inputs"]), in_shapes, tuple(out_shape),
                            params, buffers, flops, groups[name], input_grads, needs[name]))
    losses = [layer.name for layer in layers if layer.spec.loss]
    if losses != [layers[-1].name]:
        *others, last = [name for name, spec in OPS.items() if spec.loss]
        raise FormatError(f"{source}: the model needs exactly one loss layer ({', '.join(others)} or {last}), "
                          f"and it must be the last one to run (found: {', '.join(losses) or 'none'})")
    unused = [layer.name for layer in layers[:-1] if not any(layer.name in l.inputs for l in layers)]
    if unused:
        raise FormatError(f"{source}: layer '{unused[0]}': its output is used by no layer "
                          "(every layer must lead to the loss)")
    return Graph(data["name"], input_shape, layers, source, text, _torch_names(data.get("torch_names"), layers, source),
                 _torch_shapes(data.get("torch_shapes"), layers, source), _torch_aliases(data.get("torch_aliases"),
                                                                                         source))


def _torch_aliases(aliases, source):
    """``torch_aliases``: ``{module path: [other paths]}`` of PyTorch modules registered under several paths
    (MONAI's DynUNet holds its encoder's blocks in ``skip_layers`` too): its state dict holds each tensor under
    every path, so ``checkpoint export --torch`` writes them under each and ``import`` takes them."""
    if aliases is None:
        return {}
    if not isinstance(aliases, dict) or not all(
            isinstance(k, str) and k and isinstance(v, list) and v and all(isinstance(a, str) and a for a in v)
            for k, v in aliases.items()):
        raise FormatError(f"{source}: 'torch_aliases' must map PyTorch module paths to lists of the other paths "
                          "each is registered under")
    return {key: list(value) for key, value in aliases.items()}


def _torch_names(names, layers, source):
    """``torch_names``: the PyTorch module name of layers whose names differ there (torchvision's ``features.0``
    for AlexNet's ``conv1``), or for a layer whose tensors are not ``<module>.<tensor>`` there, each tensor's
    PyTorch key (ConvNeXt's layer scale, a bare parameter: ``{weight: features.1.0.layer_scale}``); used by
    ``spmdcnn checkpoint export --torch`` and ``import``."""
    if names is None:
        return {}

    def key_map(value):
        return isinstance(value, dict) and value and all(isinstance(k, str) and isinstance(v, str) and v
                                                         for k, v in value.items())
    if not isinstance(names, dict) or not all(isinstance(k, str) and (isinstance(v, str) and v or key_map(v))
                                              for k, v in names.items()):
        raise FormatError(f"{source}: 'torch_names' must map layer names to PyTorch module names (strings), or to "
                          "{tensor: PyTorch key}")
    by_name = {layer.name: layer for layer in layers if layer.params or layer.buffers}
    unknown = sorted(set(names) - set(by_name))
    if unknown:
        raise FormatError(f"{source}: torch_names: '{unknown[0]}' is not a layer with parameters")
    keys = []
    for name, layer in by_name.items():
        value = names.get(name, name)
        tensors = list(layer.params) + list(layer.buffers)
        if isinstance(value, dict):
            strange = sorted(set(value) - set(tensors))
            if strange:
                raise FormatError(f"{source}: torch_names: layer '{name}' has no tensor '{strange[0]}' (it has "
                                  f"{', '.join(tensors)})")
            keys += [value.get(tensor, f"{name}.{tensor}") for tensor in tensors]
        else:
            keys += [f"{value}.{tensor}" for tensor in tensors]
    if len(set(keys)) != len(keys):
        raise FormatError(f"{source}: torch_names: two layers would share a PyTorch name")
    return names


def _torch_shapes(shapes, layers, source):
    """``torch_shapes``: ``{tensor: shape}`` of tensors PyTorch holds in another shape of as many elements (a
    linear layer's ``(out, in)`` weight over channels, run here as a 1x1 convolution's ``(out, in, 1, 1)``)."""
    if shapes is None:
        return {}
    ours = {f"{layer.name}.{tensor}": shape for layer in layers
            for tensor, shape in {**layer.params, **layer.buffers}.items()}
    if not isinstance(shapes, dict):
        raise FormatError(f"{source}: 'torch_shapes' must map tensor names (layer.tensor) to shapes")
    result = {}
    for name, shape in shapes.items():
        if name not in ours:
            raise FormatError(f"{source}: torch_shapes: '{name}' is not a tensor of the model")
        if not isinstance(shape, list) or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                                                  for v in shape) or prod(shape) != prod(ours[name]):
            raise FormatError(f"{source}: torch_shapes: '{name}' must be a list of positive sizes holding its "
                              f"{prod(ours[name])} elements ({'x'.join(map(str, ours[name]))} here), got {shape!r}")
        result[name] = tuple(shape)
    return result


def load_model(path):
    """Read, expand and validate a model YAML file."""
    data, text = read_yaml(path, "model file")
    return parse_model(data, str(path), text)

