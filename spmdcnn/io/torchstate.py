"""Weights to and from PyTorch: ``spmdcnn checkpoint export --torch`` and ``spmdcnn checkpoint import``.

A checkpoint's parameters and batch-norm statistics become a PyTorch state dict (``torch.save`` of a dict of
tensors): ``<module>.<tensor>``, where the module is the layer's name or the one the model's ``torch_names`` gives
it (torchvision's ``features.0`` for AlexNet's ``conv1``; or the tensor's own key, a bare parameter's), in the
shape the model's ``torch_shapes`` gives where PyTorch's differs (a linear layer run as a 1x1 convolution), and each batch-norm layer gains the
``num_batches_tracked`` PyTorch keeps (the checkpoint's step). The arrays' layouts are PyTorch's already (conv
weights ``(out, in, kh, kw)``, linear ``(out, in)``, flattening in (C, H, W) order), so ResNet-50 and Inception-v3
(torchvision's names), AlexNet and VGG-16 (``torch_names``) load into torchvision's models with
``load_state_dict``. Importing goes the other way (bfloat16 and float16 weights become float32), refusing a state
dict that lacks a tensor, has one the model does not (but batch norm's ``num_batches_tracked``, and what ``drop``
leaves out), or has one of another shape, and writes a checkpoint at step 0 for a job's ``init:``.

PyTorch is needed only here, and is imported only when these run.
"""

import numpy as np

from .checkpoint import CheckpointError, load_checkpoint, save_checkpoint

_TRACKED = "num_batches_tracked"


def _torch():
    try:
        import torch
    except ImportError:
        raise CheckpointError("exporting and importing PyTorch weights needs PyTorch: pip install torch") from None
    return torch


def torch_name(graph, name):
    """The PyTorch key of spmdcnn tensor ``name`` (``<layer>.<tensor>``)."""
    layer, tensor = name.rsplit(".", 1)
    mapped = graph.torch_names.get(layer, layer)
    if isinstance(mapped, dict):            # a key per tensor (a bare parameter's)
        return mapped.get(tensor, name)
    return f"{mapped}.{tensor}"


def aliases_of(graph, key):
    """The other keys PyTorch holds tensor ``key`` under, its module registered under several paths (the model's
    ``torch_aliases``)."""
    return [f"{other}{key[len(path):]}" for path, others in graph.torch_aliases.items()
            if key.startswith(path + ".") for other in others]


def state_dict(graph, params, buffers, step=0):
    """``{PyTorch key: array}`` of a model's tensors, in the order of its layers, in PyTorch's shapes (the
    model's ``torch_shapes``), each under its aliases too (``torch_aliases``)."""
    tensors = {**params, **buffers}
    out = {}
    for layer in graph.layers:
        for tensor in list(layer.params) + list(layer.buffers):
            name = f"{layer.name}.{tensor}"
            value = np.asarray(tensors[name])
            out[torch_name(graph, name)] = value.reshape(graph.torch_shapes.get(name, value.shape))
        if layer.spec.normalization:
            out[torch_name(graph, f"{layer.name}.{_TRACKED}")] = np.array(step, dtype=np.int64)
    for key in list(out):
        for alias in aliases_of(graph, key):
            out[alias] = out[key]
    return out


def export_torch(checkpoint_path, output, graph):
    """Write the weights of the checkpoint at ``checkpoint_path`` (of ``graph``) as a PyTorch state dict."""
    torch = _torch()
    ckpt = load_checkpoint(checkpoint_path)
    ckpt.check_model(graph)
    tensors = state_dict(graph, ckpt.params, ckpt.buffers, ckpt.step)
    torch.save({key: torch.from_numpy(np.ascontiguousarray(value)) for key, value in tensors.items()}, output)
    return len(tensors)


def import_torch(path, graph, output, drop=()):
    """Write the weights of the PyTorch state dict at ``path`` as a checkpoint of ``graph`` (step 0); tensors whose
    names start with one of ``drop`` are left out (torchvision's Inception-v3 carries ``AuxLogits.``)."""
    torch = _torch()
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: file not found") from None
    except Exception as error:       # torch raises many kinds for a file that is not a state dict
        raise CheckpointError(f"{path}: not a PyTorch state dict: {type(error).__name__}: {str(error)[:300]} "
                              "(save model.state_dict(), not the model)") from None
    if not isinstance(loaded, dict) or not all(isinstance(v, torch.Tensor) for v in loaded.values()):
        raise CheckpointError(f"{path}: expected a state dict (names to tensors), got {type(loaded).__name__}")
    loaded = {key: value for key, value in loaded.items() if not key.startswith(tuple(drop))}
    arrays = checkpoint_arrays(loaded, graph, path)
    write_checkpoint(output, graph, arrays)
    return len(arrays)


def checkpoint_arrays(loaded, graph, where):
    """``{spmdcnn tensor: float array}`` of the state dict ``loaded`` (PyTorch keys to tensors) for ``graph``, in
    its shapes; refuses a tensor missing, extra (but batch norm's ``num_batches_tracked``) or of another shape."""
    torch = _torch()
    ours = {**graph.param_shapes(), **graph.buffer_shapes()}
    expected = {name: graph.torch_shapes.get(name, shape) for name, shape in ours.items()}    # PyTorch's
    wanted = {torch_name(graph, name): name for name in expected}
    tracked = {torch_name(graph, f"{layer.name}.{_TRACKED}") for layer in graph.layers
               if layer.spec.normalization}
    aliases = {alias: key for key in set(wanted) | tracked for alias in aliases_of(graph, key)}
    missing = sorted(set(wanted) - set(loaded))
    extra = sorted(set(loaded) - set(wanted) - tracked - set(aliases))
    differing = sorted(alias for alias, key in aliases.items() if alias in loaded and key in loaded
                       and not torch.equal(loaded[alias], loaded[key]))
    if differing:
        raise CheckpointError(f"{where}: {differing[0]} and {aliases[differing[0]]} hold different tensors; model "
                              f"'{graph.name}' has them as one (torch_aliases)")
    wrong = sorted(key for key in set(wanted) & set(loaded) if tuple(loaded[key].shape) != tuple(expected[wanted[key]]))
    if missing or extra or wrong:
        details = ([f"missing {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}"] if missing else []) + \
                  ([f"unexpected {', '.join(extra[:3])}{' ...' if len(extra) > 3 else ''}"] if extra else []) + \
                  ([f"{wrong[0]} has shape {tuple(loaded[wrong[0]].shape)}, the model needs "
                    f"{tuple(expected[wanted[wrong[0]]])}"] if wrong else [])
        raise CheckpointError(f"{where}: the state dict does not fit model '{graph.name}' ({graph.source}): "
                              + "; ".join(details))
    arrays = {}
    for key, name in wanted.items():
        tensor = loaded[key].detach().cpu()
        if not tensor.is_floating_point():
            raise CheckpointError(f"{where}: {key} holds {tensor.dtype}, not floating-point weights")
        array = tensor.to(torch.float64 if tensor.dtype == torch.float64 else torch.float32).numpy()
        arrays[name] = array.reshape(ours[name])
    return arrays


def write_checkpoint(output, graph, arrays):
    """A checkpoint at step 0 of ``graph`` holding ``arrays`` (:func:`checkpoint_arrays`), for a job's ``init:``."""
    buffer_names = set(graph.buffer_shapes())
    save_checkpoint(output, model_text=graph.text, params={k: v for k, v in arrays.items() if k not in buffer_names},
                    buffers={k: v for k, v in arrays.items() if k in buffer_names}, step=0, epoch=0)
