"""Job YAML (docs/formats.md#job-files): defaults, ``--set`` overrides, and one clear error per bad key or value."""

import os
import textwrap

import pytest

from spmdcnn.io.job import SCHEMA, apply_overrides, load_job, parse_job
from spmdcnn.io.yamlfile import FormatError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MINIMAL = "model: models/tiny_cnn.yaml\nbatch_size: 8\nsteps: 5\n"


def write(tmp_path, text, name="job.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def expect_error(path, *fragments, overrides=()):
    with pytest.raises(FormatError) as info:
        load_job(path, overrides)
    message = str(info.value)
    assert path in message, message
    for fragment in fragments:
        assert fragment in message, message
    return message


# --- defaults ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("trials,fragment", [
    ("{plans: -1}", "'trials.plans' must be 0 or more"), ("{steps: 1}", "'trials.steps' must be 2 or more"),
    ("{share: 0}", "'trials.share' must be a fraction"), ("{share: 1.5}", "'trials.share' must be a fraction"),
    ("{warmup: -2}", "'trials.warmup' must be 0 or more"), ("{seconds: -1}", "'trials.seconds' must be 0 or more"),
    ("{seconds: .inf}", "'trials.seconds' must be 0 or more")])
def test_bad_trials_are_named(tmp_path, trials, fragment):
    expect_error(write(tmp_path, MINIMAL + f"trials: {trials}\n"), fragment)


@pytest.mark.parametrize("watchdog,fragment", [
    ("{warn: 0}", "'watchdog.warn' must be a positive number of seconds or auto, got 0"),
    ("{warn: false}", "'watchdog.warn' must be a positive number of seconds or auto"),
    ("{abort: -5}", "'watchdog.abort' must be a positive number of seconds, auto or false (warn only)"),
    ("{wran: 5}", "unknown key 'watchdog.wran' (did you mean 'warn'?)"), ("3", "'watchdog' must be")])
def test_bad_watchdogs_are_named(tmp_path, watchdog, fragment):
    expect_error(write(tmp_path, MINIMAL + f"watchdog: {watchdog}\n"), fragment)


@pytest.mark.parametrize("text,value", [
    ("false", False), ("true", True), ("{warn: 30}", {"warn": 30.0}), ("{warn: auto, abort: false}",
                                                                     {"warn": "auto", "abort": False}),
    ("{warn: 1e2, abort: 600}", {"warn": 100.0, "abort": 600.0})])
def test_watchdog_values(tmp_path, text, value):
    assert load_job(write(tmp_path, MINIMAL + f"watchdog: {text}\n"))["watchdog"] == value
    assert load_job(write(tmp_path, MINIMAL), [f"watchdog={text}"])["watchdog"] == value


def test_defaults_are_filled_in(tmp_path):
    job = load_job(write(tmp_path, MINIMAL))
    assert job == {
        "model": "models/tiny_cnn.yaml", "batch_size": 8, "steps": 5, "epochs": None,
        "data": {"kind": "synthetic", "path": None, "shuffle": True, "seed": 0, "num_samples": None, "signal": 0.5,
                 "val": None, "make": None, "augment": {"crop": None, "flip": False}, "workers": "auto",
                 "prefetch": "auto", "timeout": 300.0},
        "optimizer": {"kind": "sgd", "lr": 0.01, "momentum": 0.0, "weight_decay": 0.0, "nesterov": False,
                      "schedule": "constant", "warmup_steps": 0, "decay_every": None, "gamma": 0.1, "min_lr": 0.0},
        "sync": {"bucket_mb": 25.0, "overlap": True}, "batchnorm": "global",
        "plan": "auto", "memory": None, "machine": None, "backend": "auto", "dtype": "float32", "init": None,
        "trials": {"plans": 4, "steps": 6, "seconds": 1.0, "warmup": 2, "share": 0.1}, "transport": "auto", "share_gpus": False, "tf32": False,
        "checkpoint": {"path": None, "every": None, "keep": 1}, "resume": "auto", "seed": 0,
        "log": {"every": 10, "metrics": None, "progress": "auto"}, "eval": {"every": None}, "watchdog": True,
    }


def test_every_schema_key_appears_in_a_parsed_job(tmp_path):
    job = load_job(write(tmp_path, MINIMAL))
    for key, rule in SCHEMA.items():
        assert key in job
        if isinstance(rule, dict):
            assert set(job[key]) == set(rule)


def test_a_partial_section_keeps_the_other_defaults(tmp_path):
    job = load_job(write(tmp_path, MINIMAL + "optimizer: {lr: 0.5, momentum: 0.9}\ndata: {seed: 4}\n"))
    assert job["optimizer"] == {"kind": "sgd", "lr": 0.5, "momentum": 0.9, "weight_decay": 0.0, "nesterov": False,
                                "schedule": "constant", "warmup_steps": 0, "decay_every": None, "gamma": 0.1,
                                "min_lr": 0.0}
    assert job["data"] == {"kind": "synthetic", "path": None, "shuffle": True, "seed": 4, "num_samples": None,
                           "signal": 0.5, "val": None, "make": None, "augment": {"crop": None, "flip": False},
                           "workers": "auto", "prefetch": "auto", "timeout": 300.0}


def test_an_empty_section_gets_the_defaults(tmp_path):
    job = load_job(write(tmp_path, MINIMAL + "checkpoint:\n"))
    assert job["checkpoint"] == {"path": None, "every": None, "keep": 1}


def test_integer_rates_become_floats(tmp_path):
    job = load_job(write(tmp_path, MINIMAL + "optimizer: {lr: 1, weight_decay: 0}\n"))
    assert job["optimizer"]["lr"] == 1.0 and isinstance(job["optimizer"]["lr"], float)
    assert isinstance(job["optimizer"]["weight_decay"], float)


def test_the_full_documented_example_is_accepted(tmp_path):
    path = write(tmp_path, """\
        model: models/alexnet.yaml
        batch_size: 256
        steps: 1000
        data: {kind: hdf5, path: data/train.h5, shuffle: true, seed: 0}
        optimizer: {kind: sgd, lr: 0.01, momentum: 0.9, weight_decay: 0.0005}
        plan: auto
        machine: jobs/machines/local.yaml
        backend: auto
        dtype: float32
        init: null
        checkpoint: {path: ckpt/run.h5, every: 100}
        resume: auto
        seed: 0
        log: {every: 10, metrics: ckpt/metrics.jsonl}
        """)
    job = load_job(path)
    assert job["data"] == {"kind": "hdf5", "path": "data/train.h5", "shuffle": True, "seed": 0,
                           "num_samples": None, "signal": 0.5, "val": None, "make": None,
                           "augment": {"crop": None, "flip": False}, "workers": "auto", "prefetch": "auto",
                           "timeout": 300.0}
    assert job["optimizer"]["weight_decay"] == 0.0005
    assert job["checkpoint"] == {"path": "ckpt/run.h5", "every": 100, "keep": 1}
    assert job["machine"] == "jobs/machines/local.yaml"


def test_the_quickstart_job_loads():
    job = load_job(os.path.join(ROOT, "jobs", "quickstart.yaml"))
    assert job["model"] == "models/digits_cnn.yaml" and job["plan"] == "auto"
    assert job["epochs"] == 20 and job["steps"] is None
    assert job["data"]["make"] == "digits" and job["data"]["val"] == "data/digits/val.h5"
    assert job["optimizer"]["schedule"] == "cosine" and job["eval"]["every"] == 110


@pytest.mark.parametrize("text, value", [("auto", "auto"), ("true", True), ("false", False)])
def test_resume_choices(tmp_path, text, value):
    resume = load_job(write(tmp_path, MINIMAL + f"resume: {text}\n"))["resume"]
    assert resume == value and type(resume) is type(value)


def test_epochs_instead_of_steps(tmp_path):
    job = load_job(write(tmp_path, "model: m.yaml\nbatch_size: 2\nepochs: 3\n"))
    assert job["epochs"] == 3 and job["steps"] is None


# --- overrides ------------------------------------------------------------------------------------------------

def test_overrides_of_nested_and_top_level_keys(tmp_path):
    path = write(tmp_path, MINIMAL + "optimizer: {lr: 0.01, momentum: 0.9}\n")
    job = load_job(path, ["optimizer.lr=0.1", "data.path=x", "batch_size=32", "data.shuffle=false",
                          "checkpoint.every=7", "plan=null"])
    assert job["optimizer"]["lr"] == 0.1
    assert job["optimizer"]["momentum"] == 0.9  # untouched neighbour
    assert job["data"]["path"] == "x"
    assert job["batch_size"] == 32
    assert job["data"]["shuffle"] is False
    assert job["checkpoint"]["every"] == 7
    assert job["plan"] is None


def test_override_values_are_parsed_as_yaml(tmp_path):
    path = write(tmp_path, MINIMAL)
    job = load_job(path, ["seed=0x10", "data.seed=7", "optimizer.nesterov=true", "log.metrics=m.jsonl",
                          "optimizer.lr=1.0e-3"])
    assert job["seed"] == 16 and job["data"]["seed"] == 7 and job["optimizer"]["nesterov"] is True
    assert job["log"]["metrics"] == "m.jsonl"
    assert job["optimizer"]["lr"] == pytest.approx(1e-3)


def test_later_overrides_win_and_value_may_contain_equals(tmp_path):
    job = load_job(write(tmp_path, MINIMAL), ["optimizer.lr=0.2", "optimizer.lr=0.3", "data.path=a=b.h5"])
    assert job["optimizer"]["lr"] == 0.3
    assert job["data"]["path"] == "a=b.h5"


def test_overrides_can_swap_steps_for_epochs(tmp_path):
    job = load_job(write(tmp_path, MINIMAL), ["steps=null", "epochs=2"])
    assert job["steps"] is None and job["epochs"] == 2


def test_apply_overrides_does_not_modify_its_input():
    values = {"optimizer": {"lr": 0.01}}
    out = apply_overrides(values, ["optimizer.lr=0.5", "data.kind=hdf5"])
    assert values == {"optimizer": {"lr": 0.01}}
    assert out == {"optimizer": {"lr": 0.5}, "data": {"kind": "hdf5"}}


def test_an_override_without_equals_is_refused():
    with pytest.raises(FormatError, match="key=value") as info:
        apply_overrides({}, ["optimizer.lr"])
    assert "optimizer.lr" in str(info.value)


def test_an_override_with_invalid_yaml_is_refused():
    with pytest.raises(FormatError, match="optimizer.lr"):
        apply_overrides({}, ["optimizer.lr=[0.1"])


def expect_override_error(path, overrides, *fragments):
    """An error in an override names that ``--set``, not the job file, as its source."""
    with pytest.raises(FormatError) as info:
        load_job(path, overrides)
    message = str(info.value)
    assert message.startswith(f"--set {overrides[-1]}: "), message
    assert path not in message, message
    for fragment in fragments:
        assert fragment in message, message
    return message


def test_an_override_of_an_unknown_key_is_refused_naming_it_and_the_nearest_key(tmp_path):
    path = write(tmp_path, MINIMAL)
    expect_override_error(path, ["optimizer.lrr=0.1"], "unknown key 'optimizer.lrr'",
                          "did you mean 'optimizer.lr'?")


@pytest.mark.parametrize("override, hint", [("optimizer.learning_rate=0.1", "optimizer.lr"),
                                            ("optimizer.wd=0.001", "optimizer.weight_decay"),
                                            ("num_epochs=3", "epochs"), ("data.num_workers=2", "data.workers")])
def test_another_tools_name_for_a_key_suggests_spmdcnns(tmp_path, override, hint):
    path = write(tmp_path, MINIMAL)
    expect_override_error(path, [override], "unknown key", f"did you mean '{hint}'?")


def test_an_unknown_key_in_the_wrong_section_suggests_where_it_lives(tmp_path):
    path = write(tmp_path, MINIMAL)
    expect_override_error(path, ["lr=0.1"], "unknown key 'lr'", "did you mean 'optimizer.lr'?")
    expect_error(write(tmp_path, MINIMAL + "data: {shufle: false}\n"), "unknown key 'data.shufle'",
                 "did you mean 'data.shuffle'?")


@pytest.mark.parametrize("override, hint", [("optimiser.lr=0.1", "optimizer.lr"),
                                            ("chekpoint.every=5", "checkpoint.every")])
def test_a_misspelled_section_in_an_override_names_the_override_and_its_whole_key(tmp_path, override, hint):
    path = write(tmp_path, MINIMAL)
    expect_override_error(path, [override], f"unknown key '{override.split('.')[0]}'", f"did you mean '{hint}'?")


def test_an_override_of_the_wrong_type_is_refused_naming_it(tmp_path):
    path = write(tmp_path, MINIMAL)
    expect_override_error(path, ["optimizer.lr=fast"], "'optimizer.lr'", "fast")


def test_an_override_of_a_whole_section_is_the_source_of_its_errors(tmp_path):
    path = write(tmp_path, MINIMAL)
    expect_override_error(path, ["optimizer.lr=0.2", "data={kind: hdf5, paht: x.h5}"], "unknown key 'data.paht'",
                          "did you mean 'data.path'?")


def test_a_bad_value_checked_after_parsing_names_its_override(tmp_path):
    path = write(tmp_path, MINIMAL)
    expect_override_error(path, ["batch_size=0"], "'batch_size' must be positive")
    expect_override_error(path, ["optimizer.gamma=2"], "'optimizer.gamma'")
    expect_override_error(path, ["backend=cupyy"], "'backend' must be one of", "did you mean 'cupy'?")


def test_a_file_error_still_names_the_file_when_overrides_are_given(tmp_path):
    path = write(tmp_path, MINIMAL + "optimizer: {lrr: 1}\n")
    expect_error(path, "unknown key 'optimizer.lrr'", overrides=["batch_size=4"])


@pytest.mark.parametrize("override, other", [("steps=10", "epochs"), ("epochs=3", "steps")])
def test_setting_steps_or_epochs_replaces_the_other_from_the_file(tmp_path, override, other):
    base = "model: models/tiny_cnn.yaml\nbatch_size: 8\n" + ("epochs: 20\n" if other == "epochs" else "steps: 5\n")
    job = load_job(write(tmp_path, base), [override])
    key, value = override.split("=")
    assert job[key] == int(value) and job[other] is None


def test_setting_both_steps_and_epochs_is_refused_naming_the_override(tmp_path):
    expect_override_error(write(tmp_path, MINIMAL), ["epochs=2", "steps=3"], "give exactly one of")


def test_a_file_with_both_steps_and_epochs_is_still_refused(tmp_path):
    expect_error(write(tmp_path, MINIMAL + "epochs: 2\n"), "give exactly one of")


@pytest.mark.parametrize("plan, hint", [("dta", "did you mean 'data'?"), ("owtt", "did you mean 'owt'?"),
                                        ("xyz", "")])
def test_a_plan_that_is_neither_a_name_nor_a_file_lists_the_names(tmp_path, monkeypatch, plan, hint):
    monkeypatch.chdir(tmp_path)
    message = expect_override_error(write(tmp_path, MINIMAL), [f"plan={plan}"],
                                    "'plan' must be one of auto, data, model, owt or a plan file", hint)
    assert "no such file" in message


def test_a_plan_file_without_a_suffix_is_a_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "myplan").write_text("format: spmdcnn-plan/1\n")
    assert load_job(write(tmp_path, MINIMAL), ["plan=myplan"])["plan"] == "myplan"


def test_a_job_knows_where_each_key_came_from(tmp_path):
    path = write(tmp_path, MINIMAL)
    job = load_job(path, ["optimizer.lr=0.5", "data={kind: synthetic}"])
    assert job.where("optimizer.lr") == "--set optimizer.lr=0.5"
    assert job.where("data.kind") == "--set data={kind: synthetic}"
    assert job.where("model") == path and job.where("optimizer.momentum") == path


# --- unknown keys and wrong types --------------------------------------------------------------------------------

def test_unknown_top_level_key(tmp_path):
    message = expect_error(write(tmp_path, MINIMAL + "learning_rate: 0.1\n"), "learning_rate")
    assert "unknown" in message


@pytest.mark.parametrize("section, key", [("optimizer", "lrr"), ("data", "paht"), ("checkpoint", "evry"),
                                          ("log", "metric")])
def test_unknown_nested_key(tmp_path, section, key):
    path = write(tmp_path, MINIMAL + f"{section}: {{{key}: 1}}\n")
    message = expect_error(path, f"{section}.{key}")
    assert "unknown" in message


@pytest.mark.parametrize("text, key", [
    ("batch_size: abc", "'batch_size'"),
    ("batch_size: 8.5", "'batch_size'"),
    ("batch_size: true", "'batch_size'"),
    ("steps: ten", "'steps'"),
    ("seed: [1]", "'seed'"),
    ("model: 3", "'model'"),
    ("optimizer: {lr: fast}", "'optimizer.lr'"),
    ("optimizer: {lr: true}", "'optimizer.lr'"),
    ("optimizer: {nesterov: 1}", "'optimizer.nesterov'"),
    ("data: {shuffle: 3}", "'data.shuffle'"),
    ("data: {shuffle: 'yes please'}", "'data.shuffle'"),
    ("data: {seed: 1.5}", "'data.seed'"),
    ("checkpoint: {every: often}", "'checkpoint.every'"),
    ("log: {every: null}", "'log.every'"),
    ("plan: 4", "'plan'"),
    ("sync: {overlap: 1}", "'sync.overlap'"),
    ("sync: {bucket_mb: big}", "'sync.bucket_mb'"),
])
def test_wrong_types_are_refused_naming_the_key(tmp_path, text, key):
    body = "\n".join(line for line in MINIMAL.splitlines() if not line.startswith(text.split(":")[0] + ":"))
    expect_error(write(tmp_path, body + "\n" + text + "\n"), key, "must be")


@pytest.mark.parametrize("value", ["0", "-2.5"])
def test_a_bucket_size_that_is_not_positive_is_refused(tmp_path, value):
    expect_error(write(tmp_path, MINIMAL + f"sync: {{bucket_mb: {value}}}\n"), "'sync.bucket_mb'", "positive")


def test_an_unknown_sync_key_is_refused_with_the_nearest(tmp_path):
    expect_error(write(tmp_path, MINIMAL + "sync: {overlapp: false}\n"), "unknown key 'sync.overlapp'", "overlap")


@pytest.mark.parametrize("value", ["3", "fast", "[]", "false", "[kind, synthetic]"])
def test_a_section_that_is_not_a_mapping_is_refused(tmp_path, value):
    """``data: []`` is as wrong as ``data: 3``: a section is a mapping (or empty, for its defaults)."""
    expect_error(write(tmp_path, MINIMAL + f"data: {value}\n"), "data", "mapping")


def test_a_job_that_is_not_a_mapping(tmp_path):
    expect_error(write(tmp_path, "- model: m.yaml\n"), "mapping")


def test_an_empty_job_lacks_the_model(tmp_path):
    expect_error(write(tmp_path, ""), "missing", "'model'")


# --- required keys and combinations --------------------------------------------------------------------------

def test_missing_model(tmp_path):
    expect_error(write(tmp_path, "batch_size: 8\nsteps: 1\n"), "missing", "'model'")


def test_missing_batch_size(tmp_path):
    expect_error(write(tmp_path, "model: m.yaml\nsteps: 1\n"), "missing", "'batch_size'")


@pytest.mark.parametrize("batch", [0, -4])
def test_non_positive_batch_size(tmp_path, batch):
    expect_error(write(tmp_path, f"model: m.yaml\nbatch_size: {batch}\nsteps: 1\n"), "'batch_size'", "positive")


def test_both_steps_and_epochs(tmp_path):
    expect_error(write(tmp_path, MINIMAL + "epochs: 2\n"), "'steps'", "'epochs'")


def test_neither_steps_nor_epochs(tmp_path):
    expect_error(write(tmp_path, "model: m.yaml\nbatch_size: 8\n"), "'steps'", "'epochs'")


def test_negative_steps(tmp_path):
    expect_error(write(tmp_path, "model: m.yaml\nbatch_size: 8\nsteps: -1\n"), "'steps'")


def test_hdf5_data_without_a_path(tmp_path):
    expect_error(write(tmp_path, MINIMAL + "data: {kind: hdf5}\n"), "data.path", "hdf5")


def test_hdf5_data_with_a_path_given_by_override(tmp_path):
    job = load_job(write(tmp_path, MINIMAL + "data: {kind: hdf5}\n"), ["data.path=train.h5"])
    assert job["data"]["kind"] == "hdf5" and job["data"]["path"] == "train.h5"


@pytest.mark.parametrize("text, key, bad", [
    ("backend: tpu", "'backend'", "tpu"),
    ("dtype: float16", "'dtype'", "float16"),
    ("data: {kind: csv}", "'data.kind'", "csv"),
    ("optimizer: {kind: adam}", "'optimizer.kind'", "adam"),
])
def test_bad_choices(tmp_path, text, key, bad):
    message = expect_error(write(tmp_path, MINIMAL + text + "\n"), key, bad)
    assert "one of" in message


@pytest.mark.parametrize("value", ["maybe", "'yes please'", "1", "[]"])
def test_resume_other_than_auto_true_false(tmp_path, value):
    expect_error(write(tmp_path, MINIMAL + f"resume: {value}\n"), "'resume'")


@pytest.mark.parametrize("text, key", [("checkpoint: {every: 0}", "checkpoint.every"),
                                       ("log: {every: 0}", "log.every")])
def test_non_positive_intervals(tmp_path, text, key):
    expect_error(write(tmp_path, MINIMAL + text + "\n"), key, "positive")


# --- file problems -----------------------------------------------------------------------------------------

def test_missing_job_file(tmp_path):
    expect_error(str(tmp_path / "absent.yaml"), "not found")


def test_invalid_yaml_names_the_line(tmp_path):
    expect_error(write(tmp_path, MINIMAL + "optimizer: {lr: 0.1\n"), "not valid YAML", "line")


def test_parse_job_uses_the_given_source_in_errors():
    with pytest.raises(FormatError, match=r"^from-test: unknown key 'bogus'"):
        parse_job({"model": "m", "batch_size": 1, "steps": 1, "bogus": 1}, "from-test")


def test_exponent_numbers_without_a_dot_are_numbers():
    """YAML 1.1 reads 1e-3 as a string; number keys take it as the number it spells."""
    from spmdcnn.io.job import parse_job
    job = parse_job({"model": "m.yaml", "batch_size": 2, "steps": 1}, "job.yaml", ["optimizer.lr=1e-3"])
    assert job["optimizer"]["lr"] == 1e-3


def test_seeds_must_fit_in_64_bits():
    from spmdcnn.io.job import parse_job
    from spmdcnn.io.yamlfile import FormatError
    for key in ("seed=18446744073709551616", "data.seed=-1"):
        with pytest.raises(FormatError, match="2\\*\\*63"):
            parse_job({"model": "m.yaml", "batch_size": 2, "steps": 1}, "job.yaml", [key])


def test_a_choice_that_may_be_null_can_be_set_to_null(tmp_path):
    """``--set data.make=null`` turns off a quick start's data maker."""
    job = load_job(os.path.join(ROOT, "jobs", "quickstart.yaml"), ["data.make=null", "data.val=null",
                                                                     "eval.every=null"])
    assert job["data"]["make"] is None and job["data"]["val"] is None
