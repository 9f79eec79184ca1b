"""Job YAML (DESIGN.md §3.3): loading, ``--set`` overrides, defaults and validation.

Every key is checked against the schema below; an unknown key or a value of the wrong type is refused with a
message naming the key and the file.
"""

import copy

import yaml

from .yamlfile import FormatError, read_yaml

_REQUIRED = object()
_NUMBER = (int, float)

# key -> (accepted types, default); a nested dict is a sub-schema.
SCHEMA = {
    "model": (str, _REQUIRED),
    "batch_size": (int, _REQUIRED),
    "steps": ((int, type(None)), None),
    "epochs": ((int, type(None)), None),
    "data": {
        "kind": (str, "synthetic"),
        "path": ((str, type(None)), None),
        "shuffle": (bool, True),
        "seed": (int, 0),
        "num_samples": (int, 50_000),        # synthetic data: samples per epoch
        "signal": (_NUMBER, 0.5),            # synthetic data: strength of the class patterns against unit noise
        "val": ((str, type(None)), None),    # held-out HDF5 dataset, evaluated every eval.every steps and at the end
        "make": ((str, type(None)), None),   # digits: write path and val with `spmdcnn data digits` when missing
    },
    "optimizer": {
        "kind": (str, "sgd"),
        "lr": (_NUMBER, 0.01),
        "momentum": (_NUMBER, 0.0),
        "weight_decay": (_NUMBER, 0.0),
        "nesterov": (bool, False),
        "schedule": (str, "constant"),       # constant | step | cosine, after warmup_steps of linear warm-up
        "warmup_steps": (int, 0),
        "decay_every": ((int, type(None)), None),    # step: multiply by gamma every decay_every steps
        "gamma": (_NUMBER, 0.1),
        "min_lr": (_NUMBER, 0.0),            # cosine: the rate it ends at
    },
    "plan": ((str, type(None)), "auto"),
    "machine": ((str, type(None)), None),
    "backend": (str, "auto"),
    "dtype": (str, "float32"),
    "transport": (str, "auto"),              # auto | host | cuda-mpi | nccl (comm/transport.py)
    "share_gpus": (bool, False),             # let more ranks than GPUs share a node's GPUs
    "tf32": (bool, False),                   # cupy, float32: convolutions and matmuls may round inputs to TF32
    "init": ((str, type(None)), None),
    "checkpoint": {
        "path": ((str, type(None)), None),
        "every": ((int, type(None)), None),
        "keep": (int, 1),                    # checkpoints kept: the newest, and with keep > 1 numbered ones
    },
    "resume": ((str, bool), "auto"),         # auto: resume when checkpoint.path exists; true: it must exist
    "seed": (int, 0),
    "log": {
        "every": (int, 10),
        "metrics": ((str, type(None)), None),
        "progress": ((str, bool), "auto"),   # a progress bar: auto (on a terminal), true, false
    },
    "eval": {
        "every": ((int, type(None)), None),  # steps between evaluations of data.val (and always at the end)
    },
}
_CHOICES = {
    ("data", "kind"): ("hdf5", "synthetic"),
    ("data", "make"): ("digits",),
    ("optimizer", "kind"): ("sgd",),
    ("optimizer", "schedule"): ("constant", "step", "cosine"),
    ("backend",): ("auto", "numpy", "cupy"),
    ("transport",): ("auto", "host", "cuda-mpi", "nccl"),
    ("dtype",): ("float32", "float64", "bfloat16"),
}


def _type_name(types):
    types = types if isinstance(types, tuple) else (types,)
    names = {int: "an integer", float: "a number", str: "a string", bool: "true or false", type(None): "null"}
    return " or ".join(names.get(t, t.__name__) for t in types)


def _validate(values, schema, source, prefix=()):
    if not isinstance(values, dict):
        raise FormatError(f"{source}: '{'.'.join(prefix) or 'job'}' must be a mapping, got {values!r}")
    unknown = sorted(set(values) - set(schema))
    if unknown:
        key = ".".join(prefix + (unknown[0],))
        allowed = ", ".join(sorted(schema))
        raise FormatError(f"{source}: unknown key '{key}' (allowed here: {allowed})")
    out = {}
    for key, rule in schema.items():
        path = prefix + (key,)
        dotted = ".".join(path)
        if isinstance(rule, dict):
            section = values.get(key)
            out[key] = _validate({} if section is None else section, rule, source, path)
            continue
        types, default = rule
        if key not in values:
            if default is _REQUIRED:
                raise FormatError(f"{source}: missing key '{dotted}'")
            out[key] = default
            continue
        value = values[key]
        accepted = types if isinstance(types, tuple) else (types,)
        if accepted == _NUMBER and isinstance(value, str):
            value = _number(value)          # YAML 1.1 reads 1e-3 (no dot) as a string
        if isinstance(value, bool) and bool not in accepted:
            ok = False
        else:
            ok = isinstance(value, accepted)
        if not ok:
            raise FormatError(f"{source}: '{dotted}' must be {_type_name(types)}, got {value!r}")
        choices = _CHOICES.get(path)
        if choices and value is not None and value not in choices:
            raise FormatError(f"{source}: '{dotted}' must be one of {', '.join(choices)}, got {value!r}")
        out[key] = float(value) if accepted == _NUMBER else value
    return out


def _number(text):
    try:
        return float(text)
    except ValueError:
        return text


def apply_overrides(values, overrides, source="--set"):
    """Apply ``key.sub=value`` strings (values parsed as YAML) to a nested mapping, in order."""
    values = copy.deepcopy(values)
    for item in overrides:
        if "=" not in item:
            raise FormatError(f"{source}: expected key=value, got {item!r}")
        dotted, text = item.split("=", 1)
        keys = dotted.strip().split(".")
        try:
            value = yaml.safe_load(text) if text.strip() else None
        except yaml.YAMLError as error:
            raise FormatError(f"{source} {item!r}: the value is not valid YAML: {error}") from None
        node = values
        for key in keys[:-1]:
            if not isinstance(node.get(key), dict):
                node[key] = {}
            node = node[key]
        node[keys[-1]] = value
    return values


def parse_job(values, source="<job>", overrides=()):
    if values is None:
        values = {}
    if not isinstance(values, dict):
        raise FormatError(f"{source}: a job file must be a mapping of keys, got {type(values).__name__}")
    job = _validate(apply_overrides(values, overrides), SCHEMA, source)
    if job["batch_size"] <= 0:
        raise FormatError(f"{source}: 'batch_size' must be positive, got {job['batch_size']}")
    if (job["steps"] is None) == (job["epochs"] is None):
        raise FormatError(f"{source}: give exactly one of 'steps' and 'epochs'")
    for key, value in (("seed", job["seed"]), ("data.seed", job["data"]["seed"])):
        if not 0 <= value < 2 ** 63:
            raise FormatError(f"{source}: '{key}' must lie in [0, 2**63), got {value}")
    if job["data"]["num_samples"] <= 0:
        raise FormatError(f"{source}: 'data.num_samples' must be positive, got {job['data']['num_samples']}")
    for key in ("steps", "epochs"):
        if job[key] is not None and job[key] < 0:
            raise FormatError(f"{source}: '{key}' must be non-negative, got {job[key]}")
    if job["data"]["kind"] == "hdf5" and not job["data"]["path"]:
        raise FormatError(f"{source}: 'data.path' is needed when data.kind is hdf5")
    if job["checkpoint"]["every"] is not None and job["checkpoint"]["every"] <= 0:
        raise FormatError(f"{source}: 'checkpoint.every' must be positive, got {job['checkpoint']['every']}")
    if job["checkpoint"]["keep"] <= 0:
        raise FormatError(f"{source}: 'checkpoint.keep' must be positive, got {job['checkpoint']['keep']}")
    if job["log"]["every"] <= 0:
        raise FormatError(f"{source}: 'log.every' must be positive, got {job['log']['every']}")
    if job["resume"] not in ("auto", True, False):
        raise FormatError(f"{source}: 'resume' must be auto, true or false, got {job['resume']!r}")
    if job["log"]["progress"] not in ("auto", True, False):
        raise FormatError(f"{source}: 'log.progress' must be auto, true or false, got {job['log']['progress']!r}")
    _check_data(job, source)
    _check_optimizer(job["optimizer"], source)
    return job


def _check_data(job, source):
    data, every = job["data"], job["eval"]["every"]
    if data["kind"] != "hdf5":
        for key in ("val", "make"):
            if data[key] is not None:
                raise FormatError(f"{source}: 'data.{key}' needs data.kind hdf5, got {data['kind']}")
    if data["make"] and not data["val"]:
        raise FormatError(f"{source}: 'data.make: {data['make']}' writes data.path and data.val: give data.val")
    if every is not None and every <= 0:
        raise FormatError(f"{source}: 'eval.every' must be positive, got {every}")
    if every is not None and not data["val"]:
        raise FormatError(f"{source}: 'eval.every' evaluates data.val: give data.val")


def _check_optimizer(spec, source):
    if spec["lr"] < 0 or spec["min_lr"] < 0:
        raise FormatError(f"{source}: 'optimizer.lr' and 'optimizer.min_lr' must be non-negative")
    if not 0 < spec["gamma"] <= 1:
        raise FormatError(f"{source}: 'optimizer.gamma' must lie in (0, 1], got {spec['gamma']}")
    if spec["min_lr"] > spec["lr"]:
        raise FormatError(f"{source}: 'optimizer.min_lr' ({spec['min_lr']}) must not exceed 'optimizer.lr' "
                          f"({spec['lr']})")
    if spec["warmup_steps"] < 0:
        raise FormatError(f"{source}: 'optimizer.warmup_steps' must be non-negative, got {spec['warmup_steps']}")
    if spec["schedule"] == "step" and not (spec["decay_every"] or 0) > 0:
        raise FormatError(f"{source}: 'optimizer.schedule: step' needs a positive 'optimizer.decay_every' "
                          f"(steps between decays), got {spec['decay_every']}")
    if spec["schedule"] != "step" and spec["decay_every"] is not None:
        raise FormatError(f"{source}: 'optimizer.decay_every' applies to schedule: step, not "
                          f"{spec['schedule']}")


def load_job(path, overrides=()):
    values, _ = read_yaml(path, "job file")
    return parse_job(values, str(path), overrides)
