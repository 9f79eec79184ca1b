"""Checkpoint HDF5 (docs/formats.md#checkpoint-files): round trip, exact layout, atomic writes, refusal of anything incomplete."""

import datetime
import os
import shutil
import stat

import h5py
import numpy as np
import pytest

import spmdcnn
from spmdcnn.graph import load_model
from spmdcnn.io import checkpoint as checkpoint_module
from spmdcnn.io.checkpoint import FORMAT, CheckpointError, describe, load_checkpoint, save_checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(ROOT, "models", "tiny_cnn.yaml")
SMALL_RESNET = os.path.join(ROOT, "models", "small_resnet.yaml")

# Dots inside the layer part, as block instances produce them (small_resnet, torchvision's ResNet).
PARAMS = {"layer1.0.conv1.weight": (4, 3, 3, 3), "layer1.0.conv1.bias": (4,),
          "layer2.0.downsample.0.weight": (6, 4, 1, 1), "fc.weight": (5, 6)}
BUFFERS = {"layer1.0.bn1.running_mean": (4,), "layer1.0.bn1.running_var": (4,)}
MODEL_TEXT = "name: dotted\ninput: [3, 8, 8]\nlayers: []\n"
PLAN_TEXT = "format: spmdcnn-plan/1\nmodel: dotted\n"
STATE = {"step": 7, "epoch": 2, "seed": 3, "shuffle": True, "rng": np.array([11, 22, 33], dtype=np.int64),
         "cursor": "epoch 2, batch 1"}


def arrays(shapes, seed, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(shape).astype(dtype) for name, shape in shapes.items()}


def save_dotted(path, step=7, seed=0):
    params, buffers, momentum = arrays(PARAMS, seed), arrays(BUFFERS, seed + 1), arrays(PARAMS, seed + 2)
    save_checkpoint(path, model_text=MODEL_TEXT, params=params, buffers=buffers, momentum=momentum, step=step,
                    epoch=2, plan_text=PLAN_TEXT, state=STATE)
    return params, buffers, momentum


def save_tiny(path, step=3):
    graph = load_model(TINY)
    save_checkpoint(path, model_text=graph.text, params=arrays(graph.param_shapes(), 0),
                    buffers=arrays(graph.buffer_shapes(), 1), momentum=arrays(graph.param_shapes(), 2),
                    step=step, epoch=0, state={"step": step})
    return graph


def leftovers(directory, keep):
    return sorted(name for name in os.listdir(directory) if name not in keep)


# --- round trip and layout ----------------------------------------------------------------------------------------

def test_round_trip_keeps_every_array_attribute_and_state(tmp_path):
    path = tmp_path / "run.h5"
    params, buffers, momentum = save_dotted(path)
    ckpt = load_checkpoint(path)
    for found, expected in ((ckpt.params, params), (ckpt.buffers, buffers), (ckpt.momentum, momentum)):
        assert sorted(found) == sorted(expected)
        for name in expected:
            assert found[name].dtype == expected[name].dtype
            np.testing.assert_array_equal(found[name], expected[name])
    assert ckpt.step == 7 and ckpt.epoch == 2
    assert ckpt.model_text == MODEL_TEXT
    assert ckpt.plan_text == PLAN_TEXT
    assert ckpt.path == str(path)
    assert sorted(ckpt.state) == sorted(STATE)
    for key in ("step", "epoch", "seed", "shuffle", "cursor"):
        assert ckpt.state[key] == STATE[key], key
    np.testing.assert_array_equal(ckpt.state["rng"], STATE["rng"])


def test_round_trip_of_float64_and_scalar_shapes(tmp_path):
    params = {"fc.weight": np.arange(6, dtype=np.float64).reshape(2, 3), "fc.bias": np.array([1.5, -2.5])}
    save_checkpoint(tmp_path / "c.h5", model_text="name: m\n", params=params)
    ckpt = load_checkpoint(tmp_path / "c.h5")
    assert ckpt.params["fc.weight"].dtype == np.float64
    np.testing.assert_array_equal(ckpt.params["fc.weight"], params["fc.weight"])
    np.testing.assert_array_equal(ckpt.params["fc.bias"], params["fc.bias"])
    assert ckpt.buffers == {} and ckpt.momentum == {} and ckpt.state == {}
    assert ckpt.step == 0 and ckpt.epoch == 0 and ckpt.plan_text == ""


def test_file_layout_is_the_documented_one(tmp_path):
    path = tmp_path / "run.h5"
    before = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    params, buffers, momentum = save_dotted(path)
    after = datetime.datetime.now(datetime.timezone.utc)
    with h5py.File(path, "r") as f:
        assert set(f.attrs) >= {"format", "step", "epoch", "model", "plan", "spmdcnn_version", "created"}
        assert f.attrs["format"] == FORMAT == "spmdcnn-checkpoint/1"
        assert int(f.attrs["step"]) == 7 and int(f.attrs["epoch"]) == 2
        assert f.attrs["model"] == MODEL_TEXT
        assert f.attrs["plan"] == PLAN_TEXT
        assert f.attrs["spmdcnn_version"] == spmdcnn.__version__
        created = datetime.datetime.fromisoformat(f.attrs["created"])
        assert created.tzinfo is not None
        assert before <= created <= after
        assert set(f) == {"params", "buffers", "optimizer", "state"}
        assert set(f["optimizer"]) == {"momentum"}
        # /params/<layer>/<name>: the layer part keeps its dots, the name is the last component.
        assert set(f["params"]) == {"layer1.0.conv1", "layer2.0.downsample.0", "fc"}
        assert set(f["params/layer1.0.conv1"]) == {"weight", "bias"}
        for group, expected in (("params", params), ("buffers", buffers), ("optimizer/momentum", momentum)):
            for name, array in expected.items():
                layer, kind = name.rsplit(".", 1)
                dataset = f[group][layer][kind]
                assert isinstance(dataset, h5py.Dataset)
                np.testing.assert_array_equal(dataset[()], array)
            count = sum(len(sub) for sub in f[group].values())
            assert count == len(expected), group
        assert set(f["buffers"]) == {"layer1.0.bn1"}
        assert set(f["buffers/layer1.0.bn1"]) == {"running_mean", "running_var"}
        state = f["state"]
        assert isinstance(state, h5py.Group) and len(state) == 0
        assert set(state.attrs) == set(STATE)
        assert int(state.attrs["step"]) == 7 and bool(state.attrs["shuffle"]) is True


def test_a_new_save_replaces_the_old_file(tmp_path):
    path = tmp_path / "run.h5"
    save_dotted(path, step=1, seed=0)
    params, _, _ = save_dotted(path, step=2, seed=10)
    ckpt = load_checkpoint(path)
    assert ckpt.step == 2
    np.testing.assert_array_equal(ckpt.params["fc.weight"], params["fc.weight"])
    assert leftovers(tmp_path, {"run.h5"}) == []


def test_save_creates_missing_directories(tmp_path):
    path = tmp_path / "a" / "b" / "run.h5"
    save_dotted(path)
    assert load_checkpoint(path).step == 7


def test_checkpoint_is_created_with_the_usual_permissions(tmp_path):
    """A checkpoint is an ordinary file: its mode follows the umask like any file the user creates (other tools
    and users read it), not the private 0600 of a temporary file."""
    path = tmp_path / "run.h5"
    save_dotted(path)
    reference = tmp_path / "reference"
    reference.write_text("x")
    assert stat.S_IMODE(os.stat(path).st_mode) == stat.S_IMODE(os.stat(reference).st_mode)


# --- atomic writes ----------------------------------------------------------------------------------------------

def test_an_unwritable_array_leaves_the_previous_file_and_no_temporary(tmp_path):
    path = tmp_path / "run.h5"
    save_dotted(path, step=1)
    before = path.read_bytes()
    bad = {"fc.weight": np.zeros((2, 2), dtype=np.float32), "fc.bias": np.array([object(), object()])}
    with pytest.raises(TypeError):
        save_checkpoint(path, model_text=MODEL_TEXT, params=bad, step=2)
    assert path.read_bytes() == before
    assert load_checkpoint(path).step == 1
    assert leftovers(tmp_path, {"run.h5"}) == []


def test_a_crash_while_writing_leaves_the_previous_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "run.h5"
    save_dotted(path, step=1)
    before = path.read_bytes()
    real_write_group = checkpoint_module._write_group
    calls = []

    def crash_after_params(group, arrays_):
        calls.append(group.name)
        if group.name != "/params":
            raise KeyboardInterrupt  # not an Exception: the cleanup must still run
        real_write_group(group, arrays_)

    monkeypatch.setattr(checkpoint_module, "_write_group", crash_after_params)
    with pytest.raises(KeyboardInterrupt):
        save_dotted(path, step=2)
    assert calls == ["/params", "/buffers"]
    assert path.read_bytes() == before
    assert leftovers(tmp_path, {"run.h5"}) == []


def test_a_failing_hdf5_library_leaves_the_previous_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "run.h5"
    save_dotted(path, step=1)
    before = path.read_bytes()
    real_file = h5py.File

    class FailingFile(real_file):
        def create_group(self, name, *args, **kwargs):
            if name == "optimizer":
                raise OSError("disk full (simulated)")
            return super().create_group(name, *args, **kwargs)

    monkeypatch.setattr(checkpoint_module.h5py, "File", FailingFile)
    with pytest.raises(OSError, match="simulated"):
        save_dotted(path, step=2)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert load_checkpoint(path).step == 1
    assert leftovers(tmp_path, {"run.h5"}) == []


def test_the_file_appears_only_by_renaming_a_complete_temporary_beside_it(tmp_path, monkeypatch):
    path = tmp_path / "run.h5"
    real_replace = os.replace
    seen = []

    def checking_replace(source, target):
        source, target = os.fspath(source), os.fspath(target)
        seen.append((source, target))
        assert not os.path.exists(target)
        assert os.path.dirname(os.path.abspath(source)) == str(tmp_path)
        with h5py.File(source, "r") as f:  # complete and closed before it is renamed
            assert f.attrs["format"] == FORMAT and "params" in f
        real_replace(source, target)

    monkeypatch.setattr(checkpoint_module.os, "replace", checking_replace)
    save_dotted(path)
    assert len(seen) == 1 and seen[0][1] == str(path)
    assert load_checkpoint(path).step == 7


def test_a_failing_rename_leaves_the_previous_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "run.h5"
    save_dotted(path, step=1)
    before = path.read_bytes()

    def failing_replace(source, target):
        raise OSError("rename failed (simulated)")

    monkeypatch.setattr(checkpoint_module.os, "replace", failing_replace)
    with pytest.raises(OSError, match="simulated"):
        save_dotted(path, step=2)
    assert path.read_bytes() == before
    assert leftovers(tmp_path, {"run.h5"}) == []


# --- refusing what is not a complete checkpoint -------------------------------------------------------------------

def test_missing_file(tmp_path):
    path = str(tmp_path / "nothing.h5")
    with pytest.raises(CheckpointError, match="not found") as info:
        load_checkpoint(path)
    assert path in str(info.value)


@pytest.mark.parametrize("fraction", [0.5, 0.1, 0.95])
def test_a_truncated_file_is_refused_naming_the_path(tmp_path, fraction):
    good = tmp_path / "good.h5"
    save_dotted(good)
    truncated = tmp_path / "truncated.h5"
    shutil.copyfile(good, truncated)
    size = os.path.getsize(truncated)
    with open(truncated, "r+b") as stream:
        stream.truncate(int(size * fraction))
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(truncated)
    assert str(truncated) in str(info.value)
    assert load_checkpoint(good).step == 7  # the copy's source is untouched


def test_a_file_that_is_not_hdf5_is_refused(tmp_path):
    path = tmp_path / "notes.h5"
    path.write_text("this is not an HDF5 file\n" * 20)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    assert str(path) in str(info.value)


def test_an_empty_file_is_refused(tmp_path):
    path = tmp_path / "empty.h5"
    path.write_bytes(b"")
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    assert str(path) in str(info.value)


def test_hdf5_without_the_format_attribute_is_refused(tmp_path):
    path = tmp_path / "other.h5"
    with h5py.File(path, "w") as f:
        f.attrs["step"] = 1
        f.attrs["epoch"] = 0
        f.attrs["model"] = MODEL_TEXT
        f.create_group("params").create_group("fc").create_dataset("weight", data=np.zeros((2, 2)))
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    message = str(info.value)
    assert str(path) in message and "not an spmdcnn checkpoint" in message and FORMAT in message


def test_hdf5_of_another_format_version_is_refused(tmp_path):
    path = tmp_path / "future.h5"
    save_dotted(path)
    with h5py.File(path, "r+") as f:
        f.attrs["format"] = "spmdcnn-checkpoint/99"
    with pytest.raises(CheckpointError, match="spmdcnn-checkpoint/99") as info:
        load_checkpoint(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("attribute", ["step", "epoch", "model"])
def test_a_checkpoint_without_a_required_attribute_is_refused(tmp_path, attribute):
    path = tmp_path / "partial.h5"
    save_dotted(path)
    with h5py.File(path, "r+") as f:
        del f.attrs[attribute]
    with pytest.raises(CheckpointError, match=repr(attribute)) as info:
        load_checkpoint(path)
    assert str(path) in str(info.value)


def test_a_checkpoint_without_params_is_refused(tmp_path):
    path = tmp_path / "noparams.h5"
    save_dotted(path)
    with h5py.File(path, "r+") as f:
        del f["params"]
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("where", ["params", "params/fc", "buffers/layer1.0.bn1"])
def test_a_checkpoint_with_a_dataset_where_a_group_belongs_is_refused(tmp_path, where):
    """A structurally corrupt checkpoint (a dataset where the layout has a group) is refused with
    CheckpointError, not an AttributeError from inside the reader."""
    path = tmp_path / "corrupt.h5"
    save_dotted(path)
    with h5py.File(path, "r+") as f:
        del f[where]
        f.create_dataset(where, data=np.zeros(3))
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    assert str(path) in str(info.value)


def test_corrupted_bytes_give_a_checkpoint_or_a_checkpoint_error(tmp_path):
    """Overwrite blocks of a valid file (metadata included): every load either succeeds or raises
    CheckpointError naming the path -- never another exception (docs/formats.md#checkpoint-files: a corrupt file is refused with a
    clear error). HDF5 does not checksum raw data, so some corruptions load."""
    good = tmp_path / "good.h5"
    save_dotted(good)
    data = good.read_bytes()
    corrupt = tmp_path / "corrupt.h5"
    failures = []
    for offset in range(0, len(data), 509):
        damaged = bytearray(data)
        damaged[offset:offset + 48] = b"\xff" * len(damaged[offset:offset + 48])
        corrupt.write_bytes(bytes(damaged))
        try:
            load_checkpoint(corrupt)
        except CheckpointError as error:
            assert str(corrupt) in str(error)
        except Exception as error:  # noqa: BLE001 -- the point of the test
            failures.append(f"offset {offset}: {type(error).__name__}: {error}")
    assert not failures, "\n".join(failures)


# --- fitting a model -------------------------------------------------------------------------------------------

def test_check_model_accepts_the_checkpoint_of_the_same_model(tmp_path):
    graph = save_tiny(tmp_path / "tiny.h5")
    load_checkpoint(tmp_path / "tiny.h5").check_model(graph)


def test_check_model_refuses_another_model_naming_what_is_missing(tmp_path):
    path = tmp_path / "tiny.h5"
    save_tiny(path)
    other = load_model(SMALL_RESNET)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path).check_model(other)
    message = str(info.value)
    assert str(path) in message
    assert "small_resnet" in message
    assert "missing" in message and "fc.bias" in message        # in small_resnet, not in tiny_cnn
    assert "unexpected" in message and "conv1.bias" in message  # in tiny_cnn, not in small_resnet


def test_check_model_refuses_a_tensor_of_the_wrong_shape(tmp_path):
    graph = load_model(TINY)
    params = arrays(graph.param_shapes(), 0)
    params["fc1.weight"] = np.zeros((20, 361), dtype=np.float32)
    save_checkpoint(tmp_path / "c.h5", model_text=graph.text, params=params,
                    buffers=arrays(graph.buffer_shapes(), 1))
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(tmp_path / "c.h5").check_model(graph)
    message = str(info.value)
    assert "fc1.weight" in message and "(20, 361)" in message and "(20, 360)" in message
    assert "missing" not in message


def test_check_model_refuses_missing_buffers(tmp_path):
    graph = load_model(TINY)
    save_checkpoint(tmp_path / "c.h5", model_text=graph.text, params=arrays(graph.param_shapes(), 0))
    with pytest.raises(CheckpointError, match="missing bn1.running_mean"):
        load_checkpoint(tmp_path / "c.h5").check_model(graph)


# --- describe ------------------------------------------------------------------------------------------------------

def test_describe_names_the_model_step_and_counts(tmp_path):
    path = tmp_path / "tiny.h5"
    graph = save_tiny(path, step=42)
    text = describe(path)
    assert "tiny_cnn" in text
    assert "step         42" in text
    assert f"{graph.num_params:,}" in text
    assert FORMAT in text
    assert str(path) in text


def test_describe_says_a_checkpoint_without_a_plan_came_from_no_training_run(tmp_path):
    graph = load_model(TINY)
    save_checkpoint(tmp_path / "w.h5", model_text=graph.text, params=arrays(graph.param_shapes(), 0))
    assert "plan         none (written by no training run: imported weights)" in describe(tmp_path / "w.h5")


def test_describe_of_a_bad_file_is_a_checkpoint_error(tmp_path):
    path = tmp_path / "bad.h5"
    path.write_text("no")
    with pytest.raises(CheckpointError):
        describe(path)
