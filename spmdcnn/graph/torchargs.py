"""Reading ``torch.export``'s ATen nodes for ``spmdcnn model import``'s handlers (``graph/torchaten.py``,
``graph/torchshapes.py``): an operator's arguments by name, its name, and the checks every handler makes."""


def arguments(node):
    """``{name: value}`` of an ATen node's arguments, by its operator's schema, defaults filled in; its first is
    ``input`` and ``self`` too, whichever the operator calls it (``dropout`` and ``dropout_`` differ)."""
    got = {}
    for index, argument in enumerate(node.target._schema.arguments):
        if index < len(node.args):
            got[argument.name] = node.args[index]
        elif argument.name in node.kwargs:
            got[argument.name] = node.kwargs[argument.name]
        else:
            got[argument.name] = argument.default_value if argument.has_default_value() else None
    first = next(iter(got.values()), None)
    got.setdefault("input", first)
    got.setdefault("self", first)
    return got


def pair_list(values):
    values = list(values) if isinstance(values, (tuple, list)) else [values]
    return values[0] if len(set(values)) == 1 else values


def spatial_rank(converter, node, value):
    """The spatial axes of the node's first argument (``value``), refusing what is not (N, C, S...)."""
    shape = converter.shape(arguments(node)["input"])
    rank = len(shape) - 2
    if value.last or rank not in (1, 2, 3):
        converter.refuse(node, f"runs on shape {shape}; spmdcnn takes (N, C, W), (N, C, H, W) or (N, C, D, H, W) "
                               "with the channels second")
    return rank


def first_input(converter, node, grouped=False):
    """What the node's first argument stands for (a layer's output or the data, never a parameter; ``grouped``:
    perhaps with its channels viewed as groups, where the node is a reshape or a transpose)."""
    (value,) = converter.tensors(node, [arguments(node)["input"]], grouped=grouped)
    return value


def opname(node):
    """The operator's name without its overload and in-place mark: ``aten.relu_.default`` -> ``relu``."""
    target = node.target
    name = getattr(target, "_opname", None) or getattr(target, "__name__", str(target))
    return name[:-1] if name.endswith("_") and not name.endswith("__") else name
