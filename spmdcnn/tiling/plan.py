"""Plans (docs/formats.md#plan-files): a :class:`ParallelConfig` per layer, from a plan YAML file or a named strategy.

    format: spmdcnn-plan/1
    model: alexnet            # optional: checked against the model's name
    batch_size: 256           # optional: checked against the job's batch
    devices: 16
    default: {n: 16}          # optional: for layers not listed
    layers:
      conv5: {n: 1, h: 2, w: 2, devices: [4, 5, 6, 7]}

Omitted degrees are 1; devices default to ``0 .. product-1``. relu and dropout layers not listed inherit their
input's configuration; other layers not listed take ``default``, or run whole on device 0 when there is none.
Named strategies: ``data`` (every layer over n on all devices), ``model`` (every layer over c, flatten and the
loss over n), ``owt`` (data for the image layers, model for linear layers). A named strategy splits a dimension
shorter than the device count over as many devices as it has elements (a grouped convolution's channels over as
many as keep its groups whole). Every problem is reported with the
layer it concerns, before anything runs.
"""

import hashlib
import json

from ..io.yamlfile import FormatError, check_keys as _check_keys, load_yaml_text, read_yaml
from ..graph.optable import output_grain
from .config import SPATIAL, ParallelConfig, dims_of, keeps_groups, names_of, output_shape

FORMAT = "spmdcnn-plan/1"
NAMED = ("data", "model", "owt")
_PLAN_KEYS = {"format", "model", "batch_size", "devices", "default", "layers", "predicted", "model_file"}


class PlanError(FormatError):
    """A plan that does not fit the model, the batch or the job's devices."""


def check_keys(mapping, allowed, where, required=()):
    try:
        _check_keys(mapping, allowed, where, required)
    except FormatError as error:
        raise PlanError(str(error)) from None


class Plan:
    """The configuration of every layer; ``text`` is the canonical YAML (every layer listed)."""

    def __init__(self, graph, batch, devices, configs, source, predicted_s=None):
        self.graph, self.batch, self.devices, self.configs, self.source = graph, batch, devices, configs, source
        self.predicted_s = predicted_s      # the iteration time a planner predicted for it (a file's ``predicted``)
        # names are quoted (JSON strings are YAML): a layer called "null", "1" or "#fc" must read back as itself
        lines = [f"format: {FORMAT}", f"model: {json.dumps(graph.name)}", f"batch_size: {batch}",
                 f"devices: {devices}", "layers:"]
        lines += [f"  {json.dumps(name)}: {config.describe()}" for name, config in configs.items()]
        self.text = "\n".join(lines) + "\n"

    def __getitem__(self, name):
        return self.configs[name]

    def shape(self, name):
        """The global output shape that ``name``'s configuration splits."""
        return output_shape(self.graph.by_name[name], self.batch)

    def digest(self):
        return hashlib.sha256(self.text.encode()).hexdigest()

    def __repr__(self):
        return f"Plan({self.source}, {self.devices} devices)"


def _config(layer, spec, batch, devices, where):
    """A ParallelConfig from ``{n: .., c: .., h: .., w: .., devices: [..]}``, validated against the layer."""
    allowed = dims_of(layer)
    shape = output_shape(layer, batch)
    names = names_of(len(shape))
    absent = [name for name in SPATIAL if isinstance(spec, dict) and name in spec and name not in names]
    if absent:
        has = f"the spatial axes {', '.join(names[2:])}" if len(names) > 2 else "no spatial axes"
        raise PlanError(f"{where}: unknown key '{absent[0]}': its output {'x'.join(map(str, shape))} has {has} "
                        f"(the dimensions it may split: {', '.join(allowed)})")
    refused = [name for name in names if isinstance(spec, dict) and name in spec and name not in allowed]
    if refused:
        raise PlanError(f"{where}: {layer.op} does not split '{refused[0]}' (it splits {', '.join(allowed)})")
    check_keys(spec, set(allowed) | {"devices"}, where)
    degrees = []
    for name, extent in zip(names, shape):
        degree = spec.get(name, 1)
        if isinstance(degree, bool) or not isinstance(degree, int) or degree < 1:
            raise PlanError(f"{where}: degree {name} must be a positive integer, got {degree!r}")
        if degree > extent:
            what = {"n": "the batch", "c": "its output channels" if len(shape) > 2 else "its output features",
                    "d": "its output depth", "h": "its output height", "w": "its output width"}[name]
            raise PlanError(f"{where}: degree {name}={degree} exceeds {what} ({extent})")
        if name == "c" and not keeps_groups(layer, degree):
            fits = [d for d in range(2, extent + 1) if keeps_groups(layer, d)][:6]
            if not fits:
                raise PlanError(f"{where}: degree c={degree}: a grouped transposed convolution's channels are not "
                                "split (c must be 1)")
            raise PlanError(f"{where}: degree c={degree} cuts its {layer.attrs['groups']} groups of "
                            f"{output_grain(layer)} channels (a grouped convolution's tiles hold whole groups; "
                            f"c may be {', '.join(map(str, fits))}{', ...' if len(fits) == 6 else ''})")
        degrees.append(degree)
    count = 1
    for degree in degrees:
        count *= degree
    chosen = spec.get("devices", list(range(count)))
    if not isinstance(chosen, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in chosen):
        raise PlanError(f"{where}: devices must be a list of integers, got {chosen!r}")
    if len(chosen) != count:
        raise PlanError(f"{where}: {len(chosen)} devices listed, but the degrees make {count} tiles")
    if count > devices:
        raise PlanError(f"{where}: the degrees make {count} tiles but the plan has {devices} devices")
    bad = [d for d in chosen if not 0 <= d < devices]
    if bad:
        raise PlanError(f"{where}: device {bad[0]} is out of range (the plan has devices 0..{devices - 1})")
    if len(set(chosen)) != len(chosen):
        twice = next(d for d in chosen if chosen.count(d) > 1)
        raise PlanError(f"{where}: device {twice} is listed twice (a device holds at most one tile of a layer)")
    return ParallelConfig(tuple(degrees), tuple(chosen))


def inherits(layer, configs):
    """Whether ``layer`` takes its input's configuration (the op table's ``inherits``: relu, dropout) when it
    has none of its own, given the configurations ``configs`` has so far (its input must be among them)."""
    return layer.spec.inherits and layer.inputs[0] in configs


def from_mapping(data, graph, batch, devices, source):
    """Validate a parsed plan YAML against ``graph``, the job's ``batch`` and its ``devices``."""
    check_keys(data, _PLAN_KEYS, source, required=("format", "devices"))
    if data["format"] != FORMAT:
        raise PlanError(f"{source}: format must be {FORMAT!r}, got {data['format']!r}")
    if data.get("model") is not None and data["model"] != graph.name:
        raise PlanError(f"{source}: the plan is for model {data['model']!r}, but the job trains {graph.name!r}")
    if data.get("batch_size") is not None and data["batch_size"] != batch:
        raise PlanError(f"{source}: the plan is for batch_size {data['batch_size']!r}, but the job's is {batch}")
    planned = data["devices"]
    if isinstance(planned, bool) or not isinstance(planned, int) or planned < 1:
        raise PlanError(f"{source}: devices must be a positive integer, got {planned!r}")
    if devices is not None and planned != devices:
        raise PlanError(f"{source}: the plan is for {planned} device{'s' * (planned != 1)}, but the job runs on "
                        f"{devices} (ranks); run it with mpiexec -n {planned} or make a plan for {devices}")
    listed = data.get("layers") or {}
    if not isinstance(listed, dict):
        raise PlanError(f"{source}: 'layers' must map layer names to configurations, got {listed!r}")
    unknown = [name for name in listed if name not in graph.by_name]
    if unknown:
        raise PlanError(f"{source}: layer '{unknown[0]}' is not in model {graph.name!r}")
    default = data.get("default")
    configs = {}
    for layer in graph.layers:
        where = f"{source}: layer '{layer.name}'"
        if layer.name in listed:
            configs[layer.name] = _config(layer, listed[layer.name], batch, planned, where)
        elif inherits(layer, configs):
            configs[layer.name] = configs[layer.inputs[0]]
        elif default is not None:
            configs[layer.name] = _config(layer, default, batch, planned, f"{where} (from default)")
        else:
            configs[layer.name] = ParallelConfig((1,) * len(output_shape(layer, batch)), (0,))
    return Plan(graph, batch, planned, configs, source, _predicted(data.get("predicted"), source))


def _predicted(predicted, source):
    """``predicted.iteration_s`` of a plan file (``spmdcnn plan -o`` writes it), or None."""
    if predicted is None:
        return None
    seconds = predicted.get("iteration_s") if isinstance(predicted, dict) else None
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds <= 0:
        raise PlanError(f"{source}: predicted must hold iteration_s, a positive number of seconds, got "
                        f"{predicted!r}")
    return float(seconds)


def _split(layer, batch, devices, dim):
    """``dim`` split over as many of the devices as the output has elements along it (n where ``dim`` is not
    allowed for the op)."""
    shape = output_shape(layer, batch)
    axis = names_of(len(shape)).index(dim) if dim in dims_of(layer) else 0
    degree = min(devices, shape[axis])
    while axis == 1 and not keeps_groups(layer, degree):    # a grouped convolution: the most that keep groups whole
        degree -= 1
    degrees = tuple(degree if i == axis else 1 for i in range(len(shape)))
    return ParallelConfig(degrees, tuple(range(degree)))


def named(strategy, graph, batch, devices):
    """One of the baseline strategies ``data``, ``model`` or ``owt`` on ``devices`` devices."""
    configs = {}
    for layer in graph.layers:
        if inherits(layer, configs):
            configs[layer.name] = configs[layer.inputs[0]]
            continue
        dim = {"data": "n", "model": "c"}.get(strategy) or ("c" if layer.spec.dense else "n")
        configs[layer.name] = _split(layer, batch, devices, dim)
    return Plan(graph, batch, devices, configs, f"plan {strategy}")


def load_plan(spec, graph, batch, devices):
    """The plan a job names: ``data``, ``model``, ``owt``, or a plan YAML file (``auto`` is the planner's:
    ``runtime.autoplan``)."""
    if spec in NAMED:
        return named(spec, graph, batch, devices)
    if spec in (None, "auto"):
        raise PlanError("plan auto is found by the planner (spmdcnn.runtime.autoplan), not read from a file")
    data, _ = read_yaml(spec, "plan file")
    return from_mapping(data, graph, batch, devices, str(spec))


def parse_plan_text(text, graph, batch, devices=None, source="<plan>"):
    return from_mapping(load_yaml_text(text, source), graph, batch, devices, source)
