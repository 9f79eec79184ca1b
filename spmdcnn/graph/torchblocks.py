"""Blocks for ``spmdcnn model import``'s YAML: the repeated structure of the PyTorch module, written once.

A module type the network uses more than once with layers of its own (torchvision's ``MBConv``, ``CNBlock``,
``Bottleneck``, ``InvertedResidual``, ``Conv2dNormActivation``...) is a candidate; its outermost instances whose
layers are contiguous, and whose inner layers nobody outside reads but the last, become block instances. The
instances of one type whose layers have the same names, ops, keys and wiring share a block (a type wired two ways,
with and without its residual sum, gives two); every value that differs between them is an argument
(``$block_0_0_out_channels``; values equal in every instance, as a block's width in several layers, share one),
the others are written in the block. An instance named by the module's path expands
to the layers' PyTorch names again (``features.1.0`` + ``block.0``: docs/formats.md#model-blocks), so the model
is the flat one; :func:`blocked` is checked against it where it is written.
"""

import re


def _formal(index, count):
    return "in" if count == 1 else f"in{index}"


def _snake(name):
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


def _argument_name(local, key):
    return re.sub(r"\W", "_", f"{local}_{key}")


class _Instance:
    """One candidate instance: its path, its layers' span in the flat list, and its template (local layers with
    inputs named locally or by formals) and the outside layers it reads."""

    def __init__(self, path, kind, layers, start, stop, inputs):
        self.path, self.kind, self.start, self.stop = path, kind, start, stop
        prefix = path + "."
        inside = {layer["name"] for layer in layers[start:stop]}
        self.outside = []                              # the layers outside it reads, in order: its inputs
        self.template = []
        for layer, refs in zip(layers[start:stop], inputs[start:stop]):
            local = {k: v for k, v in layer.items() if k != "inputs"}
            local["name"] = layer["name"][len(prefix):]
            for ref in refs:
                if ref not in inside and ref not in self.outside:
                    self.outside.append(ref)
            local["inputs"] = [(ref in inside, ref) for ref in refs]
            self.template.append(local)
        formals = {ref: _formal(i, len(self.outside)) for i, ref in enumerate(self.outside)}
        previous = formals[self.outside[0]] if self.outside else None
        for local in self.template:
            local["inputs"] = [ref[len(prefix):] if inner else formals[ref] for inner, ref in local["inputs"]]
            if local["inputs"] == [previous]:
                del local["inputs"]
            previous = local["name"]
        self.output = layers[stop - 1]["name"]

    def signature(self):
        return self.kind, tuple((layer["name"], layer["op"], tuple(sorted(layer)), tuple(layer.get("inputs", ())))
                                for layer in self.template), len(self.outside)


def _resolved_inputs(layers):
    """Each layer's inputs, the implicit one (the layer before, or the data) written out."""
    previous, result = "data", []
    for layer in layers:
        result.append(list(layer.get("inputs", [previous])))
        previous = layer["name"]
    return result


def _groups(layers, module_kinds):
    """The instances that become blocks, as groups of one signature (module docstring), outermost first: a
    candidate whose instances share no signature leaves its children to be candidates (RegNet's stages differ in
    depth; their blocks repeat). ``module_kinds`` maps each module path with children to its type's name."""
    counts = {}
    for kind in module_kinds.values():
        counts[kind] = counts.get(kind, 0) + 1
    inputs = _resolved_inputs(layers)
    readers = {}
    for index, refs in enumerate(inputs):
        for ref in refs:
            readers.setdefault(ref, []).append(index)
    groups, taken = [], []
    names = {layer["name"] for layer in layers}
    for depth in sorted({path.count(".") for path in module_kinds}):
        level = {}
        for path, kind in module_kinds.items():
            if path.count(".") != depth or counts[kind] < 2 or any(path.startswith(p + ".") for p in taken):
                continue
            span = [i for i, layer in enumerate(layers) if layer["name"].startswith(path + ".")]
            if not span or span != list(range(span[0], span[-1] + 1)) or path in names:
                continue                # not contiguous, or a layer has its name (timm's BatchNormAct2d)
            start, stop = span[0], span[-1] + 1
            inner = {layers[i]["name"] for i in span[:-1]}
            if any(reader not in range(start, stop) for name in inner for reader in readers.get(name, ())):
                continue                # an inner layer read from outside: not one output
            instance = _Instance(path, kind, layers, start, stop, inputs)
            level.setdefault(instance.signature(), []).append(instance)
        for members in level.values():
            if len(members) >= 2:
                groups.append(sorted(members, key=lambda member: member.start))
                taken += [member.path for member in members]
    return groups


def blocked(layers, module_kinds):
    """``(blocks, entries)``: the model's ``blocks`` mapping and its top-level ``layers`` with the repeated
    structure as block instances (module docstring); ``({}, layers)`` where nothing repeats."""
    groups = _groups(layers, module_kinds)
    blocks, chosen = {}, {}
    for members in groups:
        signature = members[0].signature()
        base = _snake(signature[0])
        name = base if base not in blocks else f"{base}_{sum(b.startswith(base) for b in blocks) + 1}"
        template = [dict(layer) for layer in members[0].template]
        args, columns = {}, {}          # values equal in every instance share one argument (a block's width)
        for index, layer in enumerate(template):
            for key in layer:
                if key in ("name", "inputs"):
                    continue
                values = tuple(repr(member.template[index][key]) for member in members)
                if any(value != values[0] for value in values):
                    arg = columns.get(values)
                    if arg is None:     # a name of its own, though "a.b"/"c" and "a_b"/"c" spell alike
                        arg = _argument_name(layer["name"], key)
                        while arg in args:
                            arg += "_"
                        columns[values] = arg
                    layer[key] = f"${arg}"
                    if arg not in args:
                        args[arg] = None
                        for member in members:
                            chosen.setdefault(member.path, {})[arg] = member.template[index][key]
        block = {"layers": template}
        if args:
            block["args"] = args
        if signature[2] != 1:
            block["inputs"] = [_formal(i, signature[2]) for i in range(signature[2])]
        blocks[name] = block
        for member in members:
            chosen.setdefault(member.path, {})
            member.block = name
    used = [instance for members in groups for instance in members]
    if not used:
        return {}, layers
    output_of = {}                      # an instance's last layer: outside, the instance's name stands for it
    for instance in used:
        output_of[instance.output] = instance.path
    entries, index, previous = [], 0, "data"
    by_start = {instance.start: instance for instance in used}
    inputs = _resolved_inputs(layers)
    while index < len(layers):
        instance = by_start.get(index)
        if instance is not None:
            refs = [output_of.get(ref, ref) for ref in instance.outside]
            entry = {"name": instance.path, "block": instance.block}
            if chosen[instance.path]:
                entry["args"] = chosen[instance.path]
            if refs != [previous]:
                entry["inputs"] = refs
            entries.append(entry)
            previous, index = instance.path, instance.stop
            continue
        layer = {k: v for k, v in layers[index].items() if k != "inputs"}
        refs = [output_of.get(ref, ref) for ref in inputs[index]]
        if refs != [previous]:
            layer["inputs"] = refs
        entries.append(layer)
        previous, index = layer["name"], index + 1
    return blocks, entries
