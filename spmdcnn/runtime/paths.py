"""What a job reads and writes, checked whole before anything is written (docs/formats.md#job-files).

The files a job reads must exist (the model, a plan file, the machine, ``init``, the datasets), and the paths it
writes must be writable (the checkpoint, the metrics, the datasets ``data.make`` writes) without creating anything:
only once every rank has checked the job does rank 0 make the output folders and the data. A message names the key,
the file or ``--set`` that gave it, and the folder a relative path was looked for in.
"""

import os

from ..io.checkpoint import CheckpointError
from ..io.job import PLAN_NAMES
from ..io.yamlfile import FormatError


def data_to_make(job):
    """``data.make``: whether ``data.path`` or ``data.val`` is missing and is to be written."""
    spec = job["data"]
    return bool(spec["make"]) and not (os.path.exists(spec["path"]) and os.path.exists(spec["val"]))


def make_missing_data(job, log, graph=None):
    """``data.make``: write ``data.path`` and ``data.val`` when either is missing (rank 0 only): scikit-learn's
    digits, or universes (``cosmo``) or shapes to segment (``shapes``) of the size of ``graph``'s input,
    ``data.num_samples`` of them (1,024 universes or 512 shapes when not given) and a quarter as many held out."""
    spec = job["data"]
    if not data_to_make(job):
        return
    if spec["make"] == "cosmo":
        from ..io.cosmo import SAMPLES, SNAPSHOTS, make_cosmo
        shape = tuple(graph.input_shape)
        if shape[0] != len(SNAPSHOTS) or len(shape) != 4 or len(set(shape[1:])) != 1:
            raise FormatError(f"{_where(job, 'data.make')}: 'data.make: cosmo' writes universes of {len(SNAPSHOTS)} "
                              f"channels on a cube, [4, S, S, S]; model '{graph.name}' takes {list(shape)}")
        train, val = make_cosmo(spec["path"], spec["val"], size=shape[1], samples=spec["num_samples"] or SAMPLES,
                                seed=spec["seed"])
        log(f"data: wrote {spec['path']} ({train} universes) and {spec['val']} ({val} held out), Gaussian random "
            f"fields of {shape[1]}^3 (spmdcnn data cosmo)")
        return
    if spec["make"] == "shapes":
        from ..io.shapes import SAMPLES as SHAPES, make_shapes
        shape = tuple(graph.input_shape)
        if shape[0] != 1 or len(shape) not in (3, 4) or len(set(shape[1:])) != 1:
            raise FormatError(f"{_where(job, 'data.make')}: 'data.make: shapes' writes images [1, S, S] or volumes "
                              f"[1, S, S, S] of one channel; model '{graph.name}' takes {list(shape)}")
        train, val = make_shapes(spec["path"], spec["val"], size=shape[1], rank=len(shape) - 1,
                                 samples=spec["num_samples"] or SHAPES, seed=spec["seed"])
        log(f"data: wrote {spec['path']} ({train} samples) and {spec['val']} ({val} held out), discs, boxes and "
            f"rings of {'x'.join(map(str, shape[1:]))} to segment (spmdcnn data shapes)")
        return
    from ..io.digits import make_digits
    train, val = make_digits(spec["path"], spec["val"], seed=spec["seed"])
    log(f"data: wrote {spec['path']} ({train} samples) and {spec['val']} ({val} held out), scikit-learn's "
        "handwritten digits (spmdcnn data digits)")


def _where(job, key):
    """The file (or ``--set``) that gave ``key`` of ``job``."""
    return job.where(key) if hasattr(job, "where") else "job"


def check_inputs(job):
    """Every file the job reads exists: the model, a plan file, the machine, ``init``, the datasets (unless
    ``data.make`` writes them; ``init`` unless a checkpoint to resume wins over it). The message names the key,
    who gave it, and the folder it was looked for in."""
    keys = ["model", "machine"]
    ckpt = job["checkpoint"]["path"]
    if not (job["resume"] in ("auto", True) and ckpt and os.path.exists(ckpt)):    # a checkpoint wins over init
        keys.append("init")
    if job["plan"] is not None and job["plan"] not in PLAN_NAMES:
        keys.append("plan")
    if job["data"]["kind"] == "hdf5" and not data_to_make(job):
        keys += ["data.path", "data.val"]
    for key in keys:
        section, _, name = key.rpartition(".")
        path = (job[section] if section else job)[name]
        if path and not os.path.exists(path):
            folder = "" if os.path.isabs(path) else \
                f" (paths in a job are relative to the current folder, {os.getcwd()})"
            raise FormatError(f"{_where(job, key)}: '{key}' names {path}, which does not exist{folder}")


def _output_problem(path):
    """Why ``path`` cannot be written (without creating anything), or None."""
    if os.path.isdir(path):
        return "is a directory; give a file path"
    if os.path.exists(path):
        return None if os.access(path, os.W_OK) else "the file exists and is not writable"
    folder = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(folder):           # the nearest folder that exists: the rest will be created in it
        folder = os.path.dirname(folder)
    if not os.path.isdir(folder):
        return f"{folder} is not a folder"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"cannot write in {folder}"
    return None


def output_paths(job):
    """``{key: path}`` of what the job writes: the checkpoint, the metrics, and the datasets ``data.make`` makes."""
    paths = {"checkpoint.path": job["checkpoint"]["path"], "log.metrics": job["log"]["metrics"]}
    if data_to_make(job):
        paths.update({"data.path": job["data"]["path"], "data.val": job["data"]["val"]})
    return {key: path for key, path in paths.items() if path}


def check_outputs(job):
    """Fail before training, not hours later, when an output path cannot be written; nothing is created."""
    for key, path in output_paths(job).items():
        problem = _output_problem(path)
        if problem:
            raise CheckpointError(f"{key} {path} (from {_where(job, key)}): {problem}")


def prepare_outputs(job, log, graph=None):
    """Once the whole job is checked: the folders of its outputs, each tried with a file written and removed
    (permissions ``os.access`` cannot see, such as a read-only mount, show now, not at the first checkpoint), and
    the data ``data.make`` writes."""
    for key, path in output_paths(job).items():
        folder = os.path.dirname(os.path.abspath(path))
        try:
            os.makedirs(folder, exist_ok=True)
            probe = os.path.join(folder, f".spmdcnn-write-test-{os.getpid()}")
            with open(probe, "w", encoding="utf-8"):
                pass
            os.unlink(probe)
        except OSError as error:
            raise CheckpointError(f"{key} {path} (from {_where(job, key)}): cannot write there: {error}") from None
    make_missing_data(job, log, graph)
