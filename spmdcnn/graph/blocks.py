"""Blocks: named templates of layers, expanded into the flat layer list before anything else sees the model.

    blocks:
      basic_conv:                       # a template
        args: {out: null, kernel: 1}    # null: the instance must give it
        layers:
          - {name: conv, op: conv2d, out_channels: $out, kernel: $kernel, bias: false}
          - {name: bn, op: batchnorm2d, eps: 0.001}
      ...
    layers:
      - {name: Conv2d_1a_3x3, block: basic_conv, args: {out: 32, kernel: 3}}

An instance named ``b`` of a block expands to layers named ``b.<local name>`` (nested blocks nest the names,
``Mixed_5b.branch1x1.conv``), so parameter names follow torchvision's (``Mixed_5b.branch1x1.conv.weight``).
Inside a block, ``inputs`` name sibling layers or the block's own inputs (``in`` unless the block lists
``inputs:``); the block's output is its last layer unless it names one with ``output:``. Referring to an
instance elsewhere refers to its output. A value ``$arg`` anywhere in a layer is replaced by the argument.
"""

from ..io.yamlfile import FormatError, check_keys

DATA = "data"
_BLOCK_KEYS = {"args", "layers", "inputs", "output"}
_INSTANCE_KEYS = {"name", "block", "args", "inputs"}


def _substitute(value, args, where):
    if isinstance(value, str) and value.startswith("$"):
        name = value[1:]
        if name not in args:
            raise FormatError(f"{where}: '{value}' names no argument of the block (arguments: "
                              f"{', '.join(sorted(args)) or 'none'})")
        return args[name]
    if isinstance(value, list):
        return [_substitute(v, args, where) for v in value]
    if isinstance(value, dict):
        return {k: _substitute(v, args, where) for k, v in value.items()}
    return value


class Expander:
    def __init__(self, blocks, source):
        self.source = source
        self.blocks = blocks if blocks is not None else {}
        if not isinstance(self.blocks, dict):
            raise FormatError(f"{source}: 'blocks' must be a mapping of block name to definition")
        for name, block in self.blocks.items():
            where = f"{source}: block '{name}'"
            check_keys(block, _BLOCK_KEYS, where, required=("layers",))
            if not isinstance(block["layers"], list) or not block["layers"]:
                raise FormatError(f"{where}: 'layers' must be a non-empty list")
            if not isinstance(block.get("args") or {}, dict):
                raise FormatError(f"{where}: 'args' must be a mapping of argument name to default, "
                                  f"got {block['args']!r}")
            formals = block.get("inputs", ["in"])
            if not isinstance(formals, list) or not formals or not all(isinstance(f, str) for f in formals):
                raise FormatError(f"{where}: 'inputs' must be a list of names, got {formals!r}")
            if "output" in block and not isinstance(block["output"], str):
                raise FormatError(f"{where}: 'output' must be a layer name, got {block['output']!r}")
        self.flat = []
        for name in self.blocks:
            self._check_not_recursive(name, ())

    def _check_not_recursive(self, name, stack):
        if name in stack:
            raise FormatError(f"{self.source}: block '{name}' contains itself ({' -> '.join(stack + (name,))})")
        for inner in self.blocks[name]["layers"]:
            if isinstance(inner, dict) and inner.get("block") in self.blocks:
                self._check_not_recursive(inner["block"], stack + (name,))

    def _entry_name(self, entry, index, prefix):
        where = f"{self.source}: layer #{index + 1}" + (f" of '{prefix.rstrip('.')}'" if prefix else "")
        if not isinstance(entry, dict):
            raise FormatError(f"{where}: expected a mapping, got {entry!r}")
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            raise FormatError(f"{where}: every layer needs a 'name' (a non-empty string)")
        if name == DATA:
            raise FormatError(f"{where}: the layer name {DATA!r} is reserved for the network's input")
        if "/" in name or any(ch.isspace() for ch in name):
            raise FormatError(f"{where}: layer name {name!r} may not contain '/' or spaces (it names HDF5 groups)")
        return name

    def _output_of(self, entry, full):
        """Full name of the layer whose output an entry (layer or block instance) produces."""
        if "block" not in entry:
            return full
        block = self._block(entry, full)
        layers = block["layers"]
        local = block.get("output", layers[-1].get("name") if isinstance(layers[-1], dict) else None)
        for inner in layers:
            if isinstance(inner, dict) and inner.get("name") == local:
                return self._output_of(inner, f"{full}.{local}")
        raise FormatError(f"{self.source}: block '{entry['block']}': output {local!r} is not one of its layers")

    def _block(self, entry, full):
        name = entry["block"]
        if name not in self.blocks:
            raise FormatError(f"{self.source}: layer '{full}': unknown block {name!r} "
                              f"(blocks: {', '.join(sorted(self.blocks)) or 'none'})")
        return self.blocks[name]

    def expand(self, entries, prefix, formals, group_of=None):
        """Append ``(layer, top-level entry name)`` for the flat layers of ``entries`` (one scope)."""
        if not isinstance(entries, list) or not entries:
            raise FormatError(f"{self.source}: 'layers' must be a non-empty list")
        names = [self._entry_name(e, i, prefix) for i, e in enumerate(entries)]
        seen = set()
        for name in names:
            if name in seen:
                raise FormatError(f"{self.source}: layer '{prefix}{name}': the name is used twice")
            seen.add(name)
        scope = dict(formals)
        for name, entry in zip(names, entries):
            scope[name] = self._output_of(entry, prefix + name)
        previous = next(iter(formals.values()))
        for name, entry in zip(names, entries):
            full = prefix + name
            where = f"{self.source}: layer '{full}'"
            inputs = entry.get("inputs")
            if inputs is None:
                resolved = [previous]
            else:
                if isinstance(inputs, str):
                    inputs = [inputs]
                if not isinstance(inputs, list) or not inputs or not all(isinstance(i, str) for i in inputs):
                    raise FormatError(f"{where}: 'inputs' must be a list of layer names, got {entry['inputs']!r}")
                resolved = []
                for ref in inputs:
                    if ref not in scope:
                        known = ", ".join(sorted(scope))
                        raise FormatError(f"{where}: unknown input {ref!r} (known here: {known})")
                    resolved.append(scope[ref])
            group = group_of or name
            if "block" in entry:
                check_keys(entry, _INSTANCE_KEYS, where, required=("block",))
                self._instance(entry, full, resolved, group)
            else:
                layer = {k: v for k, v in entry.items() if k != "inputs"}
                layer["name"] = full
                layer["inputs"] = resolved
                self.flat.append((layer, group))
            previous = scope[name]

    def _instance(self, entry, full, resolved, group):
        where = f"{self.source}: layer '{full}'"
        block_name = entry["block"]
        block = self._block(entry, full)
        given = entry.get("args") or {}
        if not isinstance(given, dict):
            raise FormatError(f"{where}: 'args' must be a mapping, got {given!r}")
        declared = block.get("args") or {}
        unknown = sorted(set(given) - set(declared))
        if unknown:
            raise FormatError(f"{where}: block '{block_name}' has no argument {', '.join(map(repr, unknown))} "
                              f"(arguments: {', '.join(sorted(declared)) or 'none'})")
        args = {**declared, **given}
        missing = sorted(k for k, v in args.items() if v is None)
        if missing:
            raise FormatError(f"{where}: block '{block_name}' needs argument {', '.join(map(repr, missing))}")
        formal_names = block.get("inputs", ["in"])
        if len(formal_names) != len(resolved):
            raise FormatError(f"{where}: block '{block_name}' takes {len(formal_names)} input(s), "
                              f"got {len(resolved)}")
        layers = _substitute(block["layers"], args, f"{where} (block '{block_name}')")
        self.expand(layers, full + ".", dict(zip(formal_names, resolved)), group)


def expand_layers(model, source):
    """The model's flat layer list: every block instance replaced by its layers, every input resolved.

    Returns ``(layer mapping, group)`` pairs; ``group`` names the top-level entry the layer came from."""
    expander = Expander(model.get("blocks"), source)
    expander.expand(model.get("layers"), "", {DATA: DATA})
    return expander.flat
