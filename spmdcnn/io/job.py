"""Job YAML (docs/formats.md#job-files): loading, ``--set`` overrides, defaults and validation.

Every key is checked against the schema below; an unknown key or a value of the wrong type is refused with a
message naming the key, where it came from (the file, or the ``--set`` that gave it) and, for an unknown key,
the nearest known one.
"""

import copy
import difflib
import math
import os

import yaml

from .augment import Augment
from .yamlfile import FormatError, read_yaml

_REQUIRED = object()
PLAN_NAMES = ("auto", "data", "model", "owt")   # a plan file otherwise (spmdcnn/tiling/plan.py)
_NUMBER = (int, float)
_ANY_COUNT = (int, float, str, bool)    # auto or a count: checked (with its own message) in _check_data

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
        "num_samples": ((int, type(None)), None),    # synthetic data: samples per epoch (50,000); make: cosmo's
        "signal": (_NUMBER, 0.5),            # synthetic data: strength of the class patterns against unit noise
        "val": ((str, type(None)), None),    # held-out HDF5 dataset, evaluated every eval.every steps and at the end
        "make": ((str, type(None)), None),   # digits | cosmo | shapes: write path and val (spmdcnn data ...) when missing
        "augment": {                         # training samples only; data.val is center-cropped (io/augment.py)
            "crop": ((list, type(None)), None),     # [H, W] or [D, H, W] of a random crop of each stored sample
            "flip": ((bool, list), False),          # a random flip of the last axis, or of each axis listed (d, h, w)
        },
        "workers": (_ANY_COUNT, "auto"),     # processes reading ahead for each rank (0: read in the step)
        "prefetch": (_ANY_COUNT, "auto"),    # batches read ahead (auto: one per worker and one more)
        "timeout": (_NUMBER, 300.0),         # seconds a batch may take to read before the run stops
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
    "sync": {                                # how replica groups sum gradients (cost/buckets.py)
        "bucket_mb": (_NUMBER, 25.0),        # MiB per allreduce bucket (the first: at most 1 MiB), as DDP
        "overlap": (bool, True),             # a bucket's allreduce runs while backward goes on
    },
    "batchnorm": ((str, dict), "global"),    # global, or {group: G}: statistics over groups of G samples (ghost)
    "plan": ((str, type(None)), "auto"),
    "memory": ((str, int, float, type(None)), None),   # the most a device may hold: plan auto keeps to it
    "trials": {                              # plan auto times the model's best plans (runtime/trials.py)
        "plans": (int, 4),                   # how many, data parallelism among them (0 or 1: no trials)
        "steps": (int, 6),                   # timed steps each, half in each of two passes, after warmup
        "seconds": (_NUMBER, 1.0),           # at least this long each: more steps when a step is short
        "warmup": (int, 2),
        "share": (_NUMBER, 0.1),             # the most of the run's steps they may take
    },
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
    "watchdog": ((bool, dict), True),        # true, false, or {warn: S, abort: S} (comm/watchdog.py)
}
_CHOICES = {
    ("data", "kind"): ("hdf5", "synthetic"),
    ("data", "make"): ("digits", "cosmo", "shapes"),
    ("optimizer", "kind"): ("sgd",),
    ("optimizer", "schedule"): ("constant", "step", "cosine"),
    ("backend",): ("auto", "numpy", "cupy"),
    ("transport",): ("auto", "host", "cuda-mpi", "nccl"),
    ("dtype",): ("float32", "float64", "bfloat16"),
}


def _type_name(types):
    types = types if isinstance(types, tuple) else (types,)
    names = {int: "an integer", float: "a number", str: "a string", bool: "true or false", type(None): "null",
             list: "a list"}
    return " or ".join(names.get(t, t.__name__) for t in types)


class _Origins:
    """Where each key of a job came from: the ``--set`` item that last set it (or a section above it, or a key
    below it: ``--set optimiser.lr=1`` gives the section ``optimiser``), else the job file."""

    def __init__(self, source, overrides=()):
        self.source, self.items = source, []
        for item in overrides:
            if "=" in item:
                self.items.append((tuple(item.split("=", 1)[0].strip().split(".")), item))

    def _item(self, path):
        path = tuple(path.split(".")) if isinstance(path, str) else tuple(path)
        n = len(path)
        return next(((keys, item) for keys, item in reversed(self.items)
                     if path[:len(keys)] == keys or keys[:n] == path), None)

    def __call__(self, dotted):
        found = self._item(dotted)
        return f"--set {found[1]}" if found else self.source

    def full_key(self, path):
        """The dotted key an override gave below ``path`` (what its user meant to set), else ``path`` itself."""
        found = self._item(path)
        return found[0] if found and len(found[0]) > len(path) else tuple(path)


def _dotted_keys(schema=None, prefix=()):
    for key, rule in (schema or SCHEMA).items():
        if isinstance(rule, dict):
            yield from _dotted_keys(rule, prefix + (key,))
        else:
            yield ".".join(prefix + (key,))


def _nearest(word, choices):
    """`` (did you mean 'x'?)`` for the choice nearest to ``word``, or nothing."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


# words users mean for a key, from other tools (PyTorch's and Keras' argument names), and spmdcnn's key
SYNONYMS = {"learning_rate": "lr", "learningrate": "lr", "base_lr": "lr", "wd": "weight_decay",
            "num_workers": "workers", "batch": "batch_size", "batchsize": "batch_size",
            "num_epochs": "epochs", "max_epochs": "epochs", "lr_schedule": "schedule", "scheduler": "schedule",
            "warmup": "warmup_steps", "nesterov_momentum": "nesterov"}


def _nearest_key(path):
    """The suggestion for an unknown key: the key another tool's name for it means (``optimizer.learning_rate``:
    ``optimizer.lr``), the nearest known dotted key, or one with the same last name."""
    dotted = ".".join(map(str, path))
    known = list(_dotted_keys())
    meant = ".".join(map(str, path[:-1] + (SYNONYMS.get(str(path[-1]).lower(), ""),)))
    if meant in known:
        return f" (did you mean '{meant}'?)"
    hint = _nearest(dotted, known)
    if not hint:
        same = [key for key in known if key.rsplit(".", 1)[-1] == str(path[-1])]
        hint = f" (did you mean '{same[0]}'?)" if same else ""
    return hint


def _validate(values, schema, where, prefix=()):
    if not isinstance(values, dict):
        raise FormatError(f"{where(prefix or ('job',))}: '{'.'.join(prefix) or 'job'}' must be a mapping, "
                          f"got {values!r}")
    unknown = sorted(set(values) - set(schema))
    if unknown:
        path = prefix + (unknown[0],)
        allowed = ", ".join(sorted(schema))
        raise FormatError(f"{where(path)}: unknown key '{'.'.join(map(str, path))}'"
                          f"{_nearest_key(where.full_key(path))} "
                          f"(allowed here: {allowed})")
    out = {}
    for key, rule in schema.items():
        path = prefix + (key,)
        dotted = ".".join(path)
        if isinstance(rule, dict):
            section = values.get(key)
            out[key] = _validate({} if section is None else section, rule, where, path)
            continue
        types, default = rule
        if key not in values:
            if default is _REQUIRED:
                raise FormatError(f"{where(path)}: missing key '{dotted}'")
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
            raise FormatError(f"{where(path)}: '{dotted}' must be {_type_name(types)}, got {value!r}")
        choices = _CHOICES.get(path)
        if choices and value is not None and value not in choices:
            raise FormatError(f"{where(path)}: '{dotted}' must be one of {', '.join(choices)}, got {value!r}"
                              f"{_nearest(str(value), choices)}")
        out[key] = float(value) if accepted == _NUMBER else value
    return out


def _number(text):
    try:
        return float(text)
    except ValueError:
        return text


# keys of which a job gives exactly one: an override of one replaces the other of the job file
_ALTERNATIVES = (("steps", "epochs"),)


def apply_overrides(values, overrides, source="--set"):
    """Apply ``key.sub=value`` strings (values parsed as YAML) to a nested mapping, in order. Setting one of
    ``steps`` and ``epochs`` drops the other one that ``values`` gives (unless an override sets it too)."""
    values = copy.deepcopy(values)
    given = set()
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
        given.add(dotted.strip())
    for pair in _ALTERNATIVES:
        for key, other in (pair, pair[::-1]):
            if key in given and other not in given:
                values.pop(other, None)
    return values


class Job(dict):
    """A validated job: the mapping of its keys, and :meth:`where` a key came from (for messages)."""

    def __init__(self, values, origins):
        super().__init__(values)
        self.origins = origins

    def where(self, dotted):
        """The job file, or ``--set key=value`` when an override gave ``dotted`` (or a section above it)."""
        return self.origins(dotted)


def parse_job(values, source="<job>", overrides=()):
    """The validated :class:`Job` of the mapping ``values`` (read from ``source``) with ``overrides`` applied."""
    if values is None:
        values = {}
    if not isinstance(values, dict):
        raise FormatError(f"{source}: a job file must be a mapping of keys, got {type(values).__name__}")
    where = _Origins(source, overrides)
    job = _validate(apply_overrides(values, overrides), SCHEMA, where)

    def check(ok, key, message):
        if not ok:
            raise FormatError(f"{where(key)}: {message}")
    check(job["batch_size"] > 0, "batch_size", f"'batch_size' must be positive, got {job['batch_size']}")
    check((job["steps"] is None) != (job["epochs"] is None), "steps" if job["steps"] is not None else "epochs",
          "give exactly one of 'steps' and 'epochs'")
    for key, value in (("seed", job["seed"]), ("data.seed", job["data"]["seed"])):
        check(0 <= value < 2 ** 63, key, f"'{key}' must lie in [0, 2**63), got {value}")
    check(job["data"]["num_samples"] is None or job["data"]["num_samples"] > 0, "data.num_samples",
          f"'data.num_samples' must be positive, got {job['data']['num_samples']}")
    for key in ("steps", "epochs"):
        check(job[key] is None or job[key] >= 0, key, f"'{key}' must be non-negative, got {job[key]}")
    check(job["data"]["kind"] != "hdf5" or job["data"]["path"], "data.kind",
          "'data.path' is needed when data.kind is hdf5")
    for key in ("checkpoint.every", "log.every"):
        section, name = key.split(".")
        value = job[section][name]
        check(value is None or value > 0, key, f"'{key}' must be positive, got {value}")
    check(job["checkpoint"]["keep"] > 0, "checkpoint.keep",
          f"'checkpoint.keep' must be positive, got {job['checkpoint']['keep']}")
    check(job["resume"] in ("auto", True, False), "resume",
          f"'resume' must be auto, true or false, got {job['resume']!r}")
    check(job["log"]["progress"] in ("auto", True, False), "log.progress",
          f"'log.progress' must be auto, true or false, got {job['log']['progress']!r}")
    _check_batchnorm(job, where)
    _check_watchdog(job["watchdog"], where)
    check(job["sync"]["bucket_mb"] > 0, "sync.bucket_mb",
          f"'sync.bucket_mb' must be a positive number (MiB), got {job['sync']['bucket_mb']}")
    _check_plan(job["plan"], where)
    trials = job["trials"]
    for key in ("plans", "warmup"):
        check(trials[key] >= 0, f"trials.{key}", f"'trials.{key}' must be 0 or more, got {trials[key]}")
    check(trials["steps"] >= 2, "trials.steps",
          f"'trials.steps' must be 2 or more (half in each of two passes), got {trials['steps']}")
    check(math.isfinite(trials["seconds"]) and trials["seconds"] >= 0, "trials.seconds",
          f"'trials.seconds' must be 0 or more (seconds of steps each plan is timed for), got {trials['seconds']}")
    check(0 < trials["share"] <= 1, "trials.share",
          f"'trials.share' must be a fraction of the run's steps in (0, 1], got {trials['share']}")
    if job["memory"] is not None:
        from ..sizes import parse_size
        try:
            parse_size(job["memory"])
        except ValueError as error:
            raise FormatError(f"{where('memory')}: 'memory': {error}") from None
        check(job["plan"] == "auto", "memory", f"'memory' is the limit plan: auto keeps to; plan {job['plan']} is "
              "not searched (spmdcnn plan --memory tells whether a plan fits)")
    _check_data(job, where)
    _check_optimizer(job["optimizer"], where)
    return Job(job, where)


def _check_batchnorm(job, where):
    """``batchnorm``: ``global`` or ``{group: G}`` with G a positive integer dividing the batch."""
    spec = job["batchnorm"]
    if isinstance(spec, str):
        if spec != "global":
            raise FormatError(f"{where('batchnorm')}: 'batchnorm' must be global or {{group: G}}, got {spec!r}"
                              f"{_nearest(spec, ('global',))}")
        return
    unknown = sorted(set(spec) - {"group"})
    if unknown:
        raise FormatError(f"{where(('batchnorm', unknown[0]))}: unknown key 'batchnorm.{unknown[0]}'"
                          f"{_nearest(str(unknown[0]), ('group',))} (allowed here: group)")
    group = spec.get("group")
    if isinstance(group, bool) or not isinstance(group, int) or group < 1:
        raise FormatError(f"{where(('batchnorm', 'group'))}: 'batchnorm.group' must be a positive integer (samples "
                          f"per group), got {group!r}")
    if job["batch_size"] % group:
        raise FormatError(f"{where(('batchnorm', 'group'))}: 'batchnorm.group' ({group}) must divide "
                          f"'batch_size' ({job['batch_size']}): the groups are consecutive samples of the batch")


def _check_watchdog(spec, where):
    """``watchdog``: true, false, or ``{warn: S, abort: S}`` with S a positive number of seconds, auto or null
    (``abort: false``: warn only)."""
    if isinstance(spec, bool):
        return
    for key, value in spec.items():
        path = ("watchdog", key)
        if key not in ("warn", "abort"):
            raise FormatError(f"{where(path)}: unknown key 'watchdog.{key}'{_nearest(str(key), ('warn', 'abort'))} "
                              "(allowed here: abort, warn)")
        value = _number(value) if isinstance(value, str) and value != "auto" else value
        number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if not (value in (None, "auto") or (number and value > 0) or (key == "abort" and value is False)):
            allowed = "a positive number of seconds" + (", auto or false (warn only)" if key == "abort" else " or auto")
            raise FormatError(f"{where(path)}: 'watchdog.{key}' must be {allowed}, got {value!r}")
        spec[key] = float(value) if number else value


def _check_plan(plan, where):
    """A plan is a name or a file: a word that is neither is refused with the names (a typo of one, mostly)."""
    if plan is None or plan in PLAN_NAMES or os.path.exists(plan) or plan.endswith((".yaml", ".yml")) \
            or os.sep in plan:
        return
    raise FormatError(f"{where('plan')}: 'plan' must be one of {', '.join(PLAN_NAMES)} or a plan file, got "
                      f"{plan!r}{_nearest(plan, PLAN_NAMES)} (no such file)")


def _check_data(job, where):
    data, every = job["data"], job["eval"]["every"]
    crop, flip = data["augment"]["crop"], data["augment"]["flip"]
    if crop is not None:
        try:
            Augment.from_spec({"crop": crop})
        except FormatError:
            raise FormatError(f"{where('data.augment.crop')}: 'data.augment.crop' must be [H, W] (images) or "
                              f"[D, H, W] (volumes), positive integers, got {crop!r}") from None
    if isinstance(flip, list):
        try:
            Augment.from_spec({"flip": flip})
        except FormatError:
            raise FormatError(f"{where('data.augment.flip')}: 'data.augment.flip' must be true, false or a list of "
                              f"distinct axes among d, h, w, got {flip!r}") from None
    if data["kind"] != "hdf5" and (crop is not None or data["augment"]["flip"]):
        raise FormatError(f"{where('data.augment')}: 'data.augment' applies to stored samples: it needs data.kind "
                          f"hdf5, got {data['kind']}")
    for key in ("workers", "prefetch"):
        value = data[key]
        if value != "auto" and not (isinstance(value, int) and not isinstance(value, bool)
                                    and value >= (0 if key == "workers" else 1)):
            least = "0 (read in the step) or more" if key == "workers" else "1 or more"
            raise FormatError(f"{where('data.' + key)}: 'data.{key}' must be auto or an integer, {least}, got "
                              f"{value!r}{_nearest(value, ('auto',)) if isinstance(value, str) else ''}")
    if data["timeout"] <= 0:
        raise FormatError(f"{where('data.timeout')}: 'data.timeout' must be positive (seconds), got "
                          f"{data['timeout']}")
    if data["kind"] != "hdf5":
        for key in ("val", "make"):
            if data[key] is not None:
                raise FormatError(f"{where('data.' + key)}: 'data.{key}' needs data.kind hdf5, got {data['kind']}")
    if data["make"] and not data["val"]:
        raise FormatError(f"{where('data.make')}: 'data.make: {data['make']}' writes data.path and data.val: give "
                          "data.val")
    if every is not None and every <= 0:
        raise FormatError(f"{where('eval.every')}: 'eval.every' must be positive, got {every}")
    if every is not None and not data["val"]:
        raise FormatError(f"{where('eval.every')}: 'eval.every' evaluates data.val: give data.val")


def _check_optimizer(spec, where):
    def check(ok, key, message):
        if not ok:
            raise FormatError(f"{where('optimizer.' + key)}: {message}")
    check(spec["lr"] >= 0 and spec["min_lr"] >= 0, "lr" if spec["lr"] < 0 else "min_lr",
          "'optimizer.lr' and 'optimizer.min_lr' must be non-negative")
    check(0 < spec["gamma"] <= 1, "gamma", f"'optimizer.gamma' must lie in (0, 1], got {spec['gamma']}")
    check(spec["min_lr"] <= spec["lr"], "min_lr",
          f"'optimizer.min_lr' ({spec['min_lr']}) must not exceed 'optimizer.lr' ({spec['lr']})")
    check(spec["warmup_steps"] >= 0, "warmup_steps",
          f"'optimizer.warmup_steps' must be non-negative, got {spec['warmup_steps']}")
    check(spec["schedule"] != "step" or (spec["decay_every"] or 0) > 0, "decay_every",
          "'optimizer.schedule: step' needs a positive 'optimizer.decay_every' (steps between decays), got "
          f"{spec['decay_every']}")
    check(spec["schedule"] == "step" or spec["decay_every"] is None, "decay_every",
          f"'optimizer.decay_every' applies to schedule: step, not {spec['schedule']}")


def load_job(path, overrides=()):
    values, _ = read_yaml(path, "job file")
    return parse_job(values, str(path), overrides)
