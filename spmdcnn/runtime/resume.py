"""What makes a resumed run the continuation of the run that wrote its checkpoint.

A checkpoint's ``/state`` records the run's identity: the batch size, the seed (dropout masks) and what fixes
every batch of the data (kind, sample count and shape, data seed, shuffling, and the labels' checksum or the
synthetic signal). Resuming compares them, and the model's layers, with the job's, and refuses with one message
naming what changed. The optimizer's settings may change; the data's path is recorded for information only, so
a dataset copied to node-local scratch still resumes.
"""

import json
import os

from ..graph.graph import parse_model
from ..io.atomic import written_aside
from ..io.checkpoint import CheckpointError
from ..io.yamlfile import FormatError, load_yaml_text


def run_identity(job, data):
    return {"batch_size": job["batch_size"], "seed": job["seed"], **data.identity()}


def state_for(job, data, step, epoch):
    """The ``/state`` attributes of a checkpoint written at ``step``."""
    path = os.path.realpath(job["data"]["path"]) if job["data"]["kind"] == "hdf5" else ""
    return {"step": step, "epoch": epoch, **run_identity(job, data),
            "data.path": path.encode("utf-8", "backslashreplace").decode("utf-8")}


def _signature(graph):
    return [(layer.name, layer.op, sorted(layer.attrs.items()), list(layer.inputs)) for layer in graph.layers]


# what a checkpoint written before a key existed ran with
ABSENT = {"data.augment": "none"}


def check_resumable(ckpt, job, data, graph):
    """Refuse to resume when the job would not continue the run that wrote ``ckpt``."""
    expected = run_identity(job, data)
    recorded = {key: ckpt.state.get(key, ABSENT.get(key)) for key in expected}
    changed = [f"{key} {recorded[key]!r} -> {value!r}" for key, value in expected.items()
               if recorded[key] is not None and recorded[key] != value]
    try:
        written = parse_model(load_yaml_text(ckpt.model_text, f"{ckpt.path} (model)"), f"{ckpt.path} (model)")
        if _signature(written) != _signature(graph):
            changed.append(f"the model's layers ({graph.source} is not the model the run trained)")
    except FormatError:
        changed.append("the model (the checkpoint's model text no longer loads)")
    if changed:
        raise CheckpointError(f"{ckpt.path}: the job differs from the run that wrote this checkpoint in "
                              f"{'; '.join(changed)}. Resuming would not continue that run: restore those "
                              "settings, or start a new run from its weights with init: and another "
                              "checkpoint.path")


def trim_metrics(path, step):
    """Keep the metrics lines up to ``step`` (a crashed run may have logged past its last checkpoint); the
    file is rewritten aside and renamed, so a kill meanwhile loses nothing."""
    kept = []
    with open(path, encoding="utf-8", errors="replace") as previous:
        for line in previous:
            try:
                record = json.loads(line)
            except ValueError:           # a line cut short by a crash
                continue
            if isinstance(record, dict) and isinstance(record.get("step"), int) and record["step"] <= step:
                kept.append(json.dumps(record) + "\n")
    with written_aside(path) as temporary, open(temporary, "w", encoding="utf-8") as handle:
        handle.writelines(kept)
