"""Checkpoint HDF5 (docs/formats.md#checkpoint-files): global arrays, written aside and renamed into place.

    /                        attrs: format, step, epoch, model (YAML text), plan (YAML text), spmdcnn_version, created
    /params/<layer>/<name>   /buffers/<layer>/<name>   /optimizer/momentum/<layer>/<name>
    /state                   attrs: data cursor, RNG state

A file that is truncated, corrupt, of another format or of another model is refused with a message that says
which; the file at ``path`` is replaced only by a complete new one, so a crash while writing never destroys it.
"""

import datetime
import os
import re
import shutil

import h5py
import numpy as np

from .. import __version__
from .atomic import written_aside

FORMAT = "spmdcnn-checkpoint/1"


class CheckpointError(ValueError):
    pass


def _split(name):
    layer, kind = name.rsplit(".", 1)
    return layer, kind


def _write_group(group, arrays):
    for name, array in arrays.items():
        layer, kind = _split(name)
        group.require_group(layer).create_dataset(kind, data=np.asarray(array))


def save_checkpoint(path, *, model_text, params, buffers=None, momentum=None, step=0, epoch=0, plan_text="",
                    state=None, keep=1):
    """Write a checkpoint atomically: into a temporary file beside ``path``, fsync, then rename over it.

    With ``keep`` > 1 it is written as :func:`numbered` ``(path, step)`` and ``path`` becomes a hard link to that
    file (a copy where the file system has no links), renamed into place as atomically. Numbered files of later
    steps than ``step`` belong to a run this one replaced (a new run, or a resume from an older checkpoint) and
    go; of the rest, the ``keep`` of the highest steps stay."""
    target = numbered(path, step) if keep > 1 else path
    with written_aside(target) as temporary, h5py.File(temporary, "w") as f:
        f.attrs.update(format=FORMAT, step=int(step), epoch=int(epoch), model=model_text, plan=plan_text or "",
                       spmdcnn_version=__version__,
                       created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
        _write_group(f.create_group("params"), params)
        _write_group(f.create_group("buffers"), buffers or {})
        _write_group(f.create_group("optimizer").create_group("momentum"), momentum or {})
        f.create_group("state").attrs.update(state or {})
    if keep > 1:
        with written_aside(path) as temporary:
            os.unlink(temporary)
            try:
                os.link(target, temporary)
            except OSError:
                shutil.copyfile(target, temporary)
        found = kept_checkpoints(path)
        for _, old in [f for f in found if f[0] > step] + [f for f in found if f[0] <= step][:-keep]:
            os.unlink(old)


def numbered(path, step):
    """Where ``checkpoint.keep`` keeps the checkpoint of ``step``: ``run.h5`` -> ``run-step00000110.h5``."""
    stem, extension = os.path.splitext(os.fspath(path))
    return f"{stem}-step{int(step):08d}{extension}"


def kept_checkpoints(path):
    """``[(step, path)]`` of the numbered checkpoints beside ``path``, oldest first."""
    stem, extension = os.path.splitext(os.path.basename(os.fspath(path)))
    directory = os.path.dirname(os.path.abspath(path))
    pattern = re.compile(re.escape(stem) + r"-step(\d{8,})" + re.escape(extension) + "$")
    found = [(int(m.group(1)), os.path.join(directory, name))
             for name in (os.listdir(directory) if os.path.isdir(directory) else ())
             if (m := pattern.match(name))]
    return sorted(found)


class Checkpoint:
    """A checkpoint read into memory: ``params``, ``buffers``, ``momentum`` map ``"<layer>.<name>"`` to arrays."""

    def __init__(self, path, attrs, params, buffers, momentum, state):
        self.path = path
        self.attrs = attrs
        self.params, self.buffers, self.momentum, self.state = params, buffers, momentum, state

    step = property(lambda self: int(self.attrs["step"]))
    epoch = property(lambda self: int(self.attrs["epoch"]))
    model_text = property(lambda self: self.attrs["model"])
    plan_text = property(lambda self: self.attrs.get("plan", ""))

    def check_model(self, graph):
        """Refuse a checkpoint whose tensors do not fit ``graph`` (another model, another size)."""
        expected = {**graph.param_shapes(), **graph.buffer_shapes()}
        found = {**self.params, **self.buffers}
        missing = sorted(set(expected) - set(found))
        extra = sorted(set(found) - set(expected))
        wrong = sorted(name for name in set(expected) & set(found) if tuple(found[name].shape) != expected[name])
        if missing or extra or wrong:
            details = []
            if missing:
                details.append(f"missing {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}")
            if extra:
                details.append(f"unexpected {', '.join(extra[:3])}{' ...' if len(extra) > 3 else ''}")
            if wrong:
                name = wrong[0]
                details.append(f"{name} has shape {tuple(found[name].shape)}, the model needs {expected[name]}")
            raise CheckpointError(f"{self.path}: checkpoint does not fit model '{graph.name}' ({graph.source}): "
                                  + "; ".join(details))


def _read_group(group, where):
    if not isinstance(group, h5py.Group):
        raise CheckpointError(f"/{where} is a dataset where a group of layers belongs")
    arrays = {}
    for layer, sub in group.items():
        if not isinstance(sub, h5py.Group):
            raise CheckpointError(f"/{where}/{layer} is a dataset where a group of tensors belongs")
        for kind, dataset in sub.items():
            if not isinstance(dataset, h5py.Dataset):
                raise CheckpointError(f"/{where}/{layer}/{kind} is a group where an array belongs")
            arrays[f"{layer}.{kind}"] = dataset[()]
    return arrays


def load_checkpoint(path):
    """Read a whole checkpoint; a clear :class:`CheckpointError` for anything that is not a complete one."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise CheckpointError(f"{path}: checkpoint not found")
    try:
        with h5py.File(path, "r") as f:
            attrs = {key: _plain(value) for key, value in f.attrs.items()}
            if attrs.get("format") != FORMAT:
                raise CheckpointError(f"{path}: not an spmdcnn checkpoint (format {attrs.get('format')!r}, "
                                      f"expected {FORMAT!r})")
            for key in ("step", "epoch", "model"):
                if key not in attrs:
                    raise CheckpointError(f"{path}: checkpoint lacks the attribute {key!r}")
            if "params" not in f:
                raise CheckpointError("it has no /params group")
            params = _read_group(f["params"], "params")
            buffers = _read_group(f["buffers"], "buffers") if "buffers" in f else {}
            momentum = _read_group(f["optimizer/momentum"], "optimizer/momentum") if "optimizer/momentum" in f else {}
            state = {key: _plain(value) for key, value in f["state"].attrs.items()} if "state" in f else {}
    except CheckpointError as error:
        message = str(error)
        if message.startswith(path):
            raise
        raise CheckpointError(f"{path}: not a valid spmdcnn checkpoint: {message}") from None
    except Exception as error:  # h5py reports damage as OSError, RuntimeError, KeyError, TypeError, ...
        raise CheckpointError(f"{path}: cannot read checkpoint (truncated or corrupt?): "
                              f"{type(error).__name__}: {error}") from None
    return Checkpoint(path, attrs, params, buffers, momentum, state)


def _plain(value):
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, np.generic):
        return value.item()
    return value


def describe(path):
    """A human-readable summary of a checkpoint."""
    ckpt = load_checkpoint(path)
    count = sum(int(np.prod(a.shape)) for a in ckpt.params.values())
    size = os.path.getsize(path)
    lines = [f"checkpoint   {path} ({size / 1e6:.1f} MB)",
             f"format       {ckpt.attrs['format']}, written by spmdcnn {ckpt.attrs.get('spmdcnn_version', '?')} "
             f"at {ckpt.attrs.get('created', '?')}",
             f"model        {_model_name(ckpt.model_text)}",
             f"step         {ckpt.step} (epoch {ckpt.epoch})",
             f"parameters   {count:,} in {len(ckpt.params)} tensors; {len(ckpt.buffers)} buffers; "
             f"momentum {'yes' if ckpt.momentum else 'no'}",
             f"plan         {_plan_summary(ckpt.plan_text)}"]
    if ckpt.state:
        lines.append("state        " + ", ".join(f"{k}={v}" for k, v in sorted(ckpt.state.items())))
    return "\n".join(lines)


def _plan_summary(text):
    import yaml
    if not text:
        return "none (written by no training run: imported weights)"
    try:
        plan = yaml.safe_load(text) or {}
    except yaml.YAMLError:
        return "unreadable"
    devices = plan.get("devices", 1) if isinstance(plan, dict) else 1
    return "single device" if devices == 1 else f"{devices} devices"


def _model_name(text):
    import yaml
    try:
        return yaml.safe_load(text).get("name", "?")
    except Exception:  # a description must not fail on an odd model text
        return "?"
