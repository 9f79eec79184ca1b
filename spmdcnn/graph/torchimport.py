"""``spmdcnn model import``: a PyTorch network as a model YAML (and its weights as a checkpoint), through
``torch.export``.

The source is ``torchvision:NAME`` (a model of torchvision's classification, segmentation or video zoos) or
``FILE.py:CALLABLE`` (a function or class whose call returns a ``torch.nn.Module``). The network's forward is
captured by ``torch.export`` at the given input size, in training mode (so its dropout, stochastic depth and batch
norm are there as they train; shapes, ``size()`` and control flow on them are resolved by PyTorch, while a forward
that branches on a tensor's values cannot be imported), and every ATen operator of the graph is mapped to one
spmdcnn layer or to none (``graph/torchops.py``, ``graph/torchaten.py``):

- layers keep PyTorch's names: a layer with tensors is named by their module's path (``features.1.0.block.0``), so
  its tensors are PyTorch's keys (``features.1.0.block.0.weight``); a function's layer by its module's path and
  name (``features.1.0.add``);
- channels-last stretches (ConvNeXt's block: permute to (N, H, W, C), ``LayerNorm``, ``Linear``, GELU, ``Linear``,
  permute back) become channel ops: ``layernorm`` over the channels, 1x1 convolutions for the linear layers (their
  ``(out, in)`` weights in the model's ``torch_shapes``);
- a parameter multiplied into a tensor (ConvNeXt's ``layer_scale``) becomes a ``layer_scale`` layer whose weight
  is that parameter (``torch_names`` gives its key, ``torch_shapes`` its shape);
- the network's main output is followed by its loss (``--loss``; by default a cross-entropy of logits, or per
  position of a segmenter's output); its other outputs (auxiliary heads) are left out, and said.

Every node that maps to nothing is named in one message with what spmdcnn maps instead; nothing is written then.
PyTorch is needed only here (and torchvision for its models).
"""

import contextlib
import importlib.util
import io
import logging
import math
import re
import sys
import warnings
from pathlib import Path

import yaml

from .torchblocks import blocked
from .torchops import Converter, ImportFailure


def _torch():
    try:
        import torch
        import torch.export  # noqa: F401
    except ImportError:
        raise ImportFailure("importing a PyTorch model needs PyTorch: pip install torch (and torchvision for "
                            "torchvision's models)") from None
    return torch


_DECLARED = None        # the library declaring torchvision's operators where its own do not load


def load_torchvision():
    """torchvision, imported for its models. Where its compiled operators do not load against the installed
    PyTorch (a CPU-only torch beside a torchvision built for CUDA), its import stops at registering them; the
    models need none of them, so they are declared empty and the import retried."""
    global _DECLARED
    torch = _torch()
    for _ in range(32):
        try:
            import torchvision
            return torchvision
        except ImportError:
            raise ImportFailure("torchvision:NAME needs torchvision: pip install torchvision") from None
        except RuntimeError as error:
            missing = re.search(r"operator torchvision::(\w+) does not exist", str(error))
            if missing is None:
                raise
            _DECLARED = _DECLARED or torch.library.Library("torchvision", "DEF")      # kept: the ops live with it
            _DECLARED.define(f"{missing.group(1)}(Tensor x) -> Tensor")
            for name in [name for name in sys.modules if name == "torchvision" or name.startswith("torchvision.")]:
                del sys.modules[name]
    raise ImportFailure("torchvision does not import with this PyTorch")


TORCHVISION_KINDS = ("", "segmentation", "video")     # torchvision.models and its subpackages model import takes
DEFAULT_INPUTS = {"inception_v3": (3, 299, 299)}        # one sample's shape where --input is not given


def torchvision_names():
    """``{name: kind}`` of the models of torchvision's classification, segmentation and video zoos."""
    torchvision = load_torchvision()
    names = {}
    for kind in TORCHVISION_KINDS:
        package = getattr(torchvision.models, kind) if kind else torchvision.models
        names.update({name: kind for name in torchvision.models.list_models(module=package)})
    return names


def default_input(name, kind):
    """One sample's default shape for torchvision's model ``name`` of zoo ``kind``: 3x224x224 (Inception-v3
    3x299x299), a video clip of 16 frames of 3x112x112 for the ResNet-based video models (``r3d_18``, ``mc3_18``,
    ``r2plus1d_18``), of 3x224x224 for the others (S3D, MViT, Video Swin), as torchvision's weights take them."""
    if kind == "video":
        return (3, 16, 112, 112) if name in ("r3d_18", "mc3_18", "r2plus1d_18") else (3, 16, 224, 224)
    return DEFAULT_INPUTS.get(name, (3, 224, 224))


def build_torchvision(name, kind):
    """torchvision's model ``name`` of zoo ``kind``, untrained (a segmentation model's backbone too: nothing is
    downloaded)."""
    torchvision = load_torchvision()
    if kind == "segmentation":
        return torchvision.models.get_model(name, weights=None, weights_backbone=None)
    return torchvision.models.get_model(name)


def randomized(module, seed=0):
    """``module`` with every floating-point parameter and buffer drawn at random, in place (running variances and
    layer scales in [0.5, 1.5), the rest uniform within the inverse square root of their fan-in): an import is
    compared with its network on these, so that their outputs, not their initial near-uniform logits, agree."""
    torch = _torch()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for key, tensor in module.state_dict().items():
            if not tensor.is_floating_point():
                continue
            values = torch.rand(tensor.shape, generator=generator, dtype=tensor.dtype)
            if key.endswith(("running_var", "layer_scale")):
                tensor.copy_(0.5 + values)
            else:
                fan_in = max(tensor[0].numel(), 1) if tensor.dim() > 1 else 4
                tensor.copy_((values - 0.5) * (2.0 / fan_in ** 0.5))
    return module


def load_module(source):
    """``(module, name)`` of ``torchvision:NAME`` or ``FILE.py:CALLABLE``."""
    torch = _torch()
    kind, _, rest = source.partition(":")
    if kind == "torchvision" and rest:
        names = torchvision_names()
        if rest not in names:
            raise ImportFailure(f"{source}: torchvision has no classification, segmentation or video model "
                                f"'{rest}' (it has {', '.join(sorted(names))})")
        return build_torchvision(rest, names[rest]), rest
    path, _, attribute = source.rpartition(":")
    if not path.endswith(".py") or not attribute:
        raise ImportFailure(f"{source}: expected torchvision:NAME or FILE.py:CALLABLE")
    if not Path(path).is_file():
        raise ImportFailure(f"{path}: file not found")
    spec = importlib.util.spec_from_file_location(f"spmdcnn_import_{Path(path).stem}", path)
    code = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(code)
    except Exception as error:
        raise ImportFailure(f"{path}: running it failed: {type(error).__name__}: {error}") from None
    if not callable(getattr(code, attribute, None)):
        raise ImportFailure(f"{path}: has no function or class '{attribute}'")
    try:
        module = getattr(code, attribute)()
    except Exception as error:
        raise ImportFailure(f"{source}: calling {attribute}() failed: {type(error).__name__}: {error}") from None
    if not isinstance(module, torch.nn.Module):
        raise ImportFailure(f"{source}: returned {type(module).__name__}, not a torch.nn.Module")
    return module, attribute


def _first_line(error):
    return (str(error).strip().splitlines() or [""])[0]


def _check_input(module, source, input_shape, example):
    """Run the network on ``example`` (evaluation mode, no gradients: nothing of it changes) and name the module
    where an input of ``input_shape`` does not fit; where it fits, nothing (the capture failed for another
    reason)."""
    torch = _torch()
    running = []

    def enter(child, _inputs):
        running.append(names[child])

    def leave(child, _inputs, _output):
        running.pop()
    names = {child: path for path, child in module.named_modules() if path}
    handles = [child.register_forward_pre_hook(enter) for child in names] + \
        [child.register_forward_hook(leave) for child in names]
    training = module.training
    module.eval()
    try:
        with torch.no_grad():
            module(example)
    except Exception as error:
        where = f": at '{running[-1]}'" if running else ""
        raise ImportFailure(f"{source}: the network cannot take an input of {'x'.join(map(str, input_shape))}"
                            f"{where}: {type(error).__name__}: {_first_line(error)}") from None
    finally:
        module.train(training)
        for handle in handles:
            handle.remove()


_EXPORT_LOGGERS = ("torch.fx.experimental.symbolic_shapes", "torch._export", "torch.export", "torch._dynamo")


def capture(module, source, input_shape):
    """The network's forward for a batch of two inputs of ``input_shape``, as it trains, captured by
    ``torch.export`` (its ATen graph, with each node's output shape in ``node.meta['shape']``, None for what is
    not a tensor). The module is left as it was: its mode, parameters and statistics."""
    torch = _torch()
    example = torch.zeros((2,) + tuple(input_shape))
    training = module.training
    module.train()
    quiet = [logging.getLogger(name) for name in _EXPORT_LOGGERS]
    disabled = [logger.disabled for logger in quiet]
    try:
        for logger in quiet:            # its warnings dump the graph; the message below says what stopped it
            logger.disabled = True
        with contextlib.redirect_stderr(io.StringIO()), warnings.catch_warnings():   # it prints the graph where
            warnings.simplefilter("ignore")                                         # it stops, and warns
            program = torch.export.export(module, (example,))
    except Exception as error:
        module.train(training)
        _check_input(module, source, input_shape, example)     # an input that does not fit: say where
        line = re.search(r"The following call raised this error:\s*File \"([^\"]+)\", line (\d+)[^\n]*\n\s*([^\n]*)",
                         str(error))
        where = f" at {line.group(1)}:{line.group(2)} ({line.group(3).split('#')[0].strip()})" if line else ""
        raise ImportFailure(f"{source}: torch.export cannot capture its forward{where}: {type(error).__name__}: "
                            f"{_first_line(error)} (spmdcnn imports networks whose forward does not branch on "
                            "tensor values; make such a choice a constructor argument)") from None
    finally:
        module.train(training)
        for logger, was in zip(quiet, disabled):
            logger.disabled = was
    for node in program.graph.nodes:
        value = node.meta.get("val")
        node.meta["shape"] = tuple(int(size) for size in value.shape) if isinstance(value, torch.Tensor) else None
    return program


# -- the YAML -----------------------------------------------------------------------------------------------------

def _flow(value):
    text = yaml.safe_dump(value, default_flow_style=True, width=math.inf, sort_keys=False)
    return text[:-len("...\n")].strip() if text.endswith("...\n") else text.strip()


def module_aliases(module, keys):
    """``{path: [other paths]}`` of the modules registered under several paths whose tensors the model keeps under
    ``path`` (``keys``: the state-dict keys it keeps): the shortest paths, not each of their submodules'."""
    paths = {}
    for path, child in module.named_modules(remove_duplicate=False):
        paths.setdefault(id(child), []).append(path)
    aliases = {}
    for group in paths.values():
        kept = [path for path in group if any(key.startswith(path + ".") for key in keys)]
        if len(group) < 2 or len(kept) != 1:
            continue
        path = kept[0]
        if any(path.startswith(outer + ".") or path == outer for outer in aliases):
            continue                        # inside a module already aliased
        aliases = {outer: others for outer, others in aliases.items() if not outer.startswith(path + ".")}
        aliases[path] = [other for other in group if other != path]
    return aliases


def model_text(name, input_shape, layers, torch_names, torch_shapes, source, count, blocks=None, aliases=None):
    """The model YAML: its blocks (``graph/torchblocks.py``), then one layer or block instance a line, in the
    network's order."""
    lines = [f"# {name} ({count:,} parameters), written by: spmdcnn model import {source} "
             f"--input {' '.join(map(str, input_shape))}",
             "# Layers carry PyTorch's module names, so checkpoint import/export move its state dicts as they are.",
             f"name: {name}", f"input: {_flow(list(input_shape))}"]
    if blocks:
        lines.append("blocks:")
        for block, body in blocks.items():
            lines.append(f"  {block}:")
            if "args" in body:
                lines.append(f"    args: {_flow(body['args'])}")
            if "inputs" in body:
                lines.append(f"    inputs: {_flow(body['inputs'])}")
            lines.append("    layers:")
            lines += [f"      - {_flow(layer)}" for layer in body["layers"]]
    lines.append("layers:")
    lines += [f"  - {_flow(layer)}" for layer in layers]
    if torch_names:
        lines.append("torch_names:")
        lines += [f"  {_flow(key)}: {_flow(value)}" for key, value in torch_names.items()]
    if torch_shapes:
        lines.append("torch_shapes:")
        lines += [f"  {_flow(key)}: {_flow(value)}" for key, value in torch_shapes.items()]
    if aliases:
        lines.append("torch_aliases:")
        lines += [f"  {_flow(key)}: {_flow(value)}" for key, value in aliases.items()]
    return "\n".join(lines) + "\n"


def _module_kinds(module):
    """``{path: type name}`` of the module's submodules that have children, but plain containers."""
    torch = _torch()
    containers = (torch.nn.Sequential, torch.nn.ModuleList, torch.nn.ModuleDict)
    return {path: type(child).__name__ for path, child in module.named_modules()
            if path and type(child) not in containers and any(True for _ in child.children())}


def _layers(graph):
    """What a graph computes, layer by layer: to check that blocks wrote the flat model."""
    return [(layer.name, layer.op, repr(sorted(layer.attrs.items())), tuple(layer.inputs)) for layer in graph.layers]


def import_model(source, output, input_shape=None, weights=None, name=None, loss=None, say=None, check=None):
    """Write the model YAML of ``source`` at ``output`` (and with ``weights``, the module's weights as a checkpoint
    there); returns the parsed :class:`~spmdcnn.graph.graph.Graph`. ``loss``: what follows the output (``LOSSES``;
    by default a cross-entropy of logits, or per position of a segmenter's output). ``say`` (a function of one
    line) hears what the model leaves out (auxiliary outputs). ``check(module, graph, arrays, input_shape)``, where
    given, runs before anything is written (``runtime/torchcheck.py``'s, with ``--check``) and stops the import by
    raising :class:`ImportFailure`. Nothing is written when anything fails."""
    module, stem = load_module(source)
    if input_shape is None:
        if not source.startswith("torchvision:"):
            raise ImportFailure(f"{source}: give the input's shape with --input C H W (or C D H W, C W)")
        input_shape = default_input(stem, torchvision_names()[stem])
    return import_module(module, output, input_shape, source=source, weights=weights, name=name or stem, loss=loss,
                         say=say, check=check)


def import_module(module, output, input_shape, source, weights=None, name=None, loss=None, say=None, check=None):
    """:func:`import_model` of a ``torch.nn.Module`` built already (``source`` names it in messages and in the
    file's first line)."""
    from ..io.yamlfile import load_yaml_text
    from .graph import parse_model
    program = capture(module, source, input_shape)
    converter = Converter(program, module, source, loss)
    layers = converter.run()
    model_name = name or type(module).__name__
    count = total = sum(p.numel() for p in module.parameters())
    state = dict(module.state_dict())
    named = converter.state_keys()      # a module registered twice (DynUNet's bottleneck) under the path export took
    state = {key: value for key, value in state.items() if key in named}
    kept = converter.kept_keys()
    count = sum(converter.tensor(key).numel() for key in kept)
    if count != total:                  # the auxiliary heads', or unused modules', parameters and statistics stay
        owners = {key.rpartition(".")[0] for key in kept}
        state = {key: value for key, value in state.items() if key.rpartition(".")[0] in owners}
        unread = converter.unread_keys()
        unread_count = sum(converter.tensor(key).numel() for key in unread)
        if say is not None and converter.left_out:
            say(f"model import: {source} returns more than its main output; the model leaves out "
                f"{', '.join(converter.left_out)} (the layers only they read: "
                f"{total - count - unread_count:,} parameters)")
        if say is not None and unread:
            modules = sorted({key.rpartition(".")[0] for key in unread})
            say(f"model import: {source} never reads {unread_count:,} of its parameters (in "
                f"{', '.join(modules[:3])}{f' and {len(modules) - 3} more modules' if len(modules) > 3 else ''}); "
                "the model leaves them out")
    names = converter.torch_names, converter.torch_shapes
    aliases = module_aliases(module, state)
    flat = model_text(model_name, input_shape, layers, *names, source, count)
    blocks, entries = blocked(layers, _module_kinds(module))
    text = model_text(model_name, input_shape, entries, *names, source, count, blocks, aliases)
    graph = parse_model(load_yaml_text(text, str(output)), str(output), text)
    if _layers(graph) != _layers(parse_model(load_yaml_text(flat, str(output)), str(output), flat)):
        raise ImportFailure(f"{source}: internal error: the model written with blocks is not the network")
    for layer in graph.layers:          # every layer gives the shape PyTorch gave: nothing mapped differently
        expected = converter.shapes.get(layer.name)
        if expected is not None and tuple(layer.out_shape) != expected:
            ours, theirs = ("x".join(map(str, shape)) for shape in (layer.out_shape, expected))
            raise ImportFailure(f"{source}: layer '{layer.name}' ({layer.op}) gives {ours} where PyTorch gives "
                                f"{theirs}: it computes something spmdcnn's {layer.op} does not")
    if graph.num_params != count:
        raise ImportFailure(f"{source}: the model has {graph.num_params:,} parameters, the module {count:,}: "
                            "some of its parameters are used in ways spmdcnn does not import")
    arrays = None
    if weights is not None or check is not None:
        from ..io.torchstate import checkpoint_arrays
        arrays = checkpoint_arrays(state, graph, f"{source}'s weights")
    if check is not None:
        check(module, graph, arrays, input_shape)
    Path(output).parent.mkdir(parents=True, exist_ok=True)
    Path(output).write_text(text)
    if weights is not None:
        from ..io.torchstate import write_checkpoint
        write_checkpoint(weights, graph, arrays)
    return graph
