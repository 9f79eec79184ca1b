"""The pure parts of plan: auto's trials (runtime/trials.py) and of the profile's whole iterations
(runtime/insitu.py, runtime/profile.py): which plans are timed, within what share of the run, which is kept, and how
the cache, the fit of the ranks' meeting costs and the calibration's steps behave."""

import os

import numpy as np
import pytest

from spmdcnn.cost.compute import Profile
from spmdcnn.graph import load_model
from spmdcnn.runtime import trials
from spmdcnn.runtime.insitu import _fit_wait, typical_step
from spmdcnn.tiling.plan import named

MODELS = os.path.join(os.path.dirname(__file__), "..", "..", "models")


@pytest.fixture(scope="module")
def plans():
    graph = load_model(os.path.join(MODELS, "tiny_cnn.yaml"))
    return graph, {name: named(name, graph, 8, 2) for name in ("data", "owt", "model")}


def test_the_models_choice_leads_and_data_parallelism_is_always_timed(plans):
    _, p = plans
    scored = [("choice", p["owt"], 1.0), ("again", p["owt"], 1.0), ("model", p["model"], 1.5), ("x", p["data"], 3.0)]
    chosen = trials.candidates(scored, 2, p["data"], 3.0)
    assert [(label, plan.text) for label, plan, _ in chosen] == [("choice", p["owt"].text),
                                                                 ("data parallelism", p["data"].text)]
    assert [label for label, _, _ in trials.candidates(scored, 3, p["data"], 3.0)] == ["choice", "model", "x"]
    assert [label for label, _, _ in trials.candidates(scored, 3, None, 3.0)] == ["choice", "model", "x"]
    assert [label for label, _, _ in trials.candidates(scored[:2], 3, None, 3.0)] == ["choice"]


def test_the_trials_keep_within_their_share_of_the_run():
    settings = trials.TrialSettings(plans=3, steps=6, warmup=2, share=0.1)
    assert settings.steps_within(3, 440) == 6 and settings.total(3, 6) == 27     # 27 steps of 440
    assert settings.steps_within(3, 150) == 2 and settings.total(3, 2) == 15     # fewer, within 15 of 150
    assert settings.steps_within(3, 140) == 0              # not 2 timed each after the warm-ups
    assert settings.steps_within(3, 10 ** 6) == 6 and settings.steps_within(3, None) == 6
    for run in range(100, 2000, 7):
        steps = settings.steps_within(3, run)
        assert steps == 0 or settings.total(3, steps) <= 0.1 * run
    assert not trials.TrialSettings(plans=1).on and not trials.TrialSettings(plans=0).on
    with pytest.raises(ValueError, match="2 or more"):
        trials.TrialSettings(steps=1)


def test_a_short_step_is_timed_for_seconds_within_the_share():
    settings = trials.TrialSettings(plans=3, steps=6, seconds=0.5, warmup=2, share=0.1)
    assert settings.steps_within(3, None, 0.01) == 50            # 50 steps of 10 ms: half a second a plan
    assert settings.steps_within(3, None, 0.2) == 6              # 6 steps already take longer
    assert settings.steps_within(3, 2000, 0.01) == 37            # room in 200 of 2,000 for a run-off: 5 x 40
    assert settings.steps_within(3, 440, 0.01) == 6              # no room for more: as many as without seconds
    assert settings.steps_within(3, 140, 0.01) == 0
    for run in range(100, 3000, 7):
        steps = settings.steps_within(3, run, 0.001)
        assert steps == 0 or settings.total(3, steps) <= 0.1 * run
    assert settings.steps_within(3, None, 1e-9) == trials.MOST_STEPS
    assert trials.TrialSettings(seconds=0).steps_within(4, None, 0.001) == 6
    assert trials.TrialSettings(seconds=float("inf")).steps_within(4, None, 5e-324) == trials.MOST_STEPS


def test_data_parallelism_stays_unless_another_is_clearly_faster(plans):
    _, p = plans
    first = trials.Trial("choice", p["owt"], 1.0, 10.0, None, 0.0, (10.0, 10.0))
    data = trials.Trial("data parallelism", p["data"], 1.1, 10.0, None, 0.0, (10.0, 10.0))
    close = first._replace(measured_s=9.8, passes=(9.8, 9.8))
    clear = first._replace(measured_s=9.0, passes=(9.0, 9.1))
    failed = trials.Trial("model", p["model"], 1.2, None, "no room")
    assert trials.fastest([close, data, failed], incumbent=1) is data      # within 3 %: no exchanges wins
    assert trials.fastest([clear, data, failed], incumbent=1) is clear
    assert trials.fastest([clear._replace(spread=0.15), data], incumbent=1) is data    # steps disagree more
    noisy = data._replace(spread=0.2)
    assert trials.fastest([clear, noisy], incumbent=1) is noisy
    by_turn = clear._replace(passes=(8.0, 10.5))        # faster only in the pass where it came first
    assert trials.fastest([by_turn, data], incumbent=1) is data
    barely = clear._replace(passes=(8.0, 9.9))          # faster in each pass, but by less than the margin in one
    assert trials.fastest([barely, data], incumbent=1) is data
    faster = clear._replace(measured_s=8.0, passes=(8.0, 8.0))
    assert trials.fastest([clear, data, faster], incumbent=1) is faster   # the fastest of those clearly faster
    assert trials.fastest([close, data._replace(measured_s=None, error="x")], incumbent=1) is close  # no data run
    assert trials.fastest([failed]) is None
    assert "could not run: no room" in trials.describe(failed)
    assert "predicted 1000.0 ms, measured 9000.0 ms per step (-89 %; its steps varied by 0 %)" in \
        trials.describe(clear)


def test_more_steps_tell_closer_plans_apart(plans):
    """A trial's noise is its median's, which shrinks with its steps: 13 % faster than data parallelism whose steps
    ranged over 12 % is clear after 10 steps each, not after 2; 5 % faster needs 19; passes that disagree (a slow
    spell in one) count however many steps, and a pass in which it was not faster by the margin keeps data
    parallelism."""
    _, p = plans
    data = trials.Trial("data parallelism", p["data"], 1.1, 10.0, None, 0.12, (10.0, 10.0), 10)
    other = trials.Trial("choice", p["owt"], 1.0, 8.7, None, 0.02, (8.7, 8.7), 10)
    assert trials.noise(other, data) == pytest.approx(2 * 1.25 / 1.35 * np.hypot(0.12, 0.02) / np.sqrt(10))
    assert trials.fastest([other, data], incumbent=1) is other
    assert trials.fastest([other._replace(steps=2), data._replace(steps=2)], incumbent=1).label == "data parallelism"
    assert trials.fastest([other, data._replace(steps=0)], incumbent=1) is other        # 13 % > the 12 % range
    closer = other._replace(measured_s=9.5, passes=(9.5, 9.5))
    assert trials.fastest([closer, data], incumbent=1) is data
    for steps, kept in ((15, "data parallelism"), (18, "data parallelism"), (19, "choice"), (100, "choice")):
        assert trials.fastest([closer._replace(steps=steps), data._replace(steps=steps)], incumbent=1).label == kept
    spell = other._replace(steps=100, passes=(8.0, 9.4))       # its passes 16 % apart: 8 % the median's error
    assert trials.noise(spell, data._replace(steps=100)) == pytest.approx(0.163, abs=0.001)
    assert trials.fastest([spell, data._replace(steps=100)], incumbent=1).label == "data parallelism"
    assert trials.fastest([other._replace(steps=100, passes=(8.5, 8.9)), data._replace(steps=100)],
                          incumbent=1).label == "choice"
    by_turn = other._replace(steps=1000, passes=(8.0, 9.8))
    assert trials.fastest([by_turn, data._replace(steps=1000)], incumbent=1).label == "data parallelism"
    merged = trials.merged(other, other._replace(steps=6))
    assert merged.steps == 16 and trials.merged(other, other._replace(steps=0)).steps == 0


def test_a_run_off_settles_two_plans_their_steps_cannot_tell_apart(plans):
    _, p = plans
    data = trials.Trial("data parallelism", p["data"], 1.1, 10.0, None, 0.0, (10.0, 10.0))
    one = trials.Trial("choice", p["owt"], 1.0, 9.0, None, 0.0, (9.0, 9.0))
    two = trials.Trial("model", p["model"], 1.2, 9.1, None, 0.0, (9.1, 9.1))
    assert trials.contenders([one, data, two], incumbent=1) == (one, two)          # 1 % apart: a coin toss
    assert trials.contenders([one, data, two._replace(measured_s=8.0, passes=(8.0, 8.0))], incumbent=1) is None
    assert trials.contenders([one, data], incumbent=1) is None                      # one clearly beats the other
    assert trials.contenders([one, data, two._replace(measured_s=9.9, passes=(9.9, 9.9))], incumbent=1) is None
    close = one._replace(measured_s=9.8, passes=(9.8, 9.8))        # faster than data parallelism, not clearly
    assert trials.contenders([close, data], incumbent=1) == (data, close)
    # the run-off's passes join the first ones; the faster over both is kept
    settled = [trials.merged(one, one._replace(measured_s=9.4, passes=(9.4, 9.5), spread=0.01)), data,
               trials.merged(two, two._replace(measured_s=8.6, passes=(8.6, 8.7)))]
    assert settled[0].passes == (9.0, 9.0, 9.4, 9.5) and settled[0].measured_s == 9.2 and settled[0].spread == 0.01
    assert settled[2].measured_s == pytest.approx(8.9)
    assert trials.fastest(settled, incumbent=1) is settled[2]
    failed = trials.merged(one, one._replace(measured_s=None, error="gone"))
    assert failed.measured_s is None and failed.error == "gone"


def test_trials_are_cached_for_the_same_candidates_only(plans, tmp_path):
    graph, p = plans
    store = Profile("test")
    found = [trials.Trial("choice", p["owt"], 1.0, 2.0, None, 0.1, (2.0, 2.1), 12),
             trials.Trial("model", p["model"], 1.5, None, "refused")]
    key = trials.cache_key(graph, 8, 2, None, "global", trials.TrialSettings())
    trials.remember(store, key, found)
    store.save(str(tmp_path / "p.json"))
    again = Profile.load(str(tmp_path / "p.json"))
    proposed = [("choice", p["owt"], 1.1), ("model", p["model"], 1.6)]
    assert trials.cached(again, key, proposed) == [
        trials.Trial("choice", p["owt"], 1.1, 2.0, None, 0.1, (2.0, 2.1), 12),
        trials.Trial("model", p["model"], 1.6, None, "refused")]
    del again.trials[key]["steps"]                      # a cache written before the counts were kept
    assert [t.steps for t in trials.cached(again, key, proposed)] == [0, 0]
    assert trials.cached(again, key, proposed[::-1]) is None            # other candidates: time them again
    assert trials.cached(again, key + " other", proposed) is None


def test_a_plan_the_free_memory_cannot_hold_is_refused(plans, monkeypatch):
    graph, p = plans
    monkeypatch.setattr(trials, "available_bytes", lambda xp, local=1: 1000)
    with pytest.raises(ValueError, match="refused: it needs .* per device under the memory model, 1000 B"):
        trials.refuse(graph, p["data"], np.float32, np)
    monkeypatch.setattr(trials, "available_bytes", lambda xp, local=1: None)
    trials.refuse(graph, p["data"], np.float32, np)                     # the system does not say: no refusal


@pytest.mark.parametrize("latency,drift", [(2e-4, 0.0), (0.0, 0.3), (1e-4, 0.1)])
def test_the_meeting_cost_is_fitted_non_negative(latency, drift):
    gaps = np.array([1e-3, 4e-3, 2e-3, 8e-3, 5e-4])
    a, b = _fit_wait(gaps, latency + drift * gaps)
    assert a == pytest.approx(latency, abs=1e-9) and b == pytest.approx(drift, abs=1e-9)
    a, b = _fit_wait(gaps, 3e-4 - 0.05 * gaps)         # a negative slope is no drift
    assert b == 0.0 and a >= 0.0
    assert _fit_wait(gaps, -1e-3 + 0 * gaps) == (0.0, 0.0)


def test_the_calibrated_step_is_what_most_log_lines_show():
    """A second of slow steps among the calibration's (a shared machine's neighbour) moves the mean of all steps
    by a fifth, and the step the profile takes not at all; a hiccup within every stretch still counts, as it does
    in every log line's mean."""
    steady = [0.012] * 40 + [0.024] * 10 + [0.012] * 50      # 100 steps, a slow tenth of them together
    assert np.mean(steady) == pytest.approx(0.0132)
    assert typical_step(steady) == pytest.approx(0.012)
    hiccups = [0.030 if i % 20 == 0 else 0.010 for i in range(100)]
    assert typical_step(hiccups) == pytest.approx(np.mean(hiccups))
    assert typical_step([0.010, 0.020]) == pytest.approx(0.015)            # too few steps for stretches: the mean
    assert typical_step([0.01] * 9 + [0.04] * 3 + [0.01] * 3) == pytest.approx(0.01)      # five stretches of 3


def test_profile_line_says_what_a_negative_step_residual_means():
    """The profile's data-parallel steps may run faster than their layers add up to: the line then says so, rather
    than calling a negative number the runtime's own work."""
    from spmdcnn.runtime.insitu import Synchronization
    from spmdcnn.runtime.profile import reference_text
    reference = {"measured": 0.060, "isolated": 0.050, "step": 0.00044}
    found = Synchronization(latency=1e-4, drift=0.02, points=1, measured=0.058)
    text = reference_text(reference, 16, 32, 2, 2, 1.2, found)
    assert "the runtime's own work 0.44 ms per step beyond the layers" in text
    text = reference_text(dict(reference, step=-0.00376), 16, 32, 2, 2, 1.2, found)
    assert "own work" not in text and "the steps 3.76 ms faster than their layers add up to" in text
    one = reference_text(dict(reference, step=-0.001), 32, 32, 1, 1, 1.2, found._replace(points=0))
    assert one.endswith(": the steps 1.00 ms faster than their layers add up to (taken off every plan's prediction)")


def test_the_reference_iteration_is_a_median_over_about_a_second(monkeypatch):
    """At least five iterations, as many as fill the seconds asked for (at most REFERENCE_MOST), the same count on
    every rank: the slowest rank's warm-up sets it."""
    from spmdcnn.runtime import insitu

    class World:
        def __init__(self, others):
            self.others = others

        def barrier(self):
            pass

        def allgather(self, value):
            return [value] + self.others

    counts = []
    monkeypatch.setattr(insitu, "timings",
                        lambda run, count, warmup, sync=None: counts.append(count) or [0.5, 0.1, 0.2])
    graph = load_model(os.path.join(MODELS, "tiny_cnn.yaml"))
    assert insitu.reference_iteration(graph, 2, np, np.float32, World([]), seconds=0.0) == 0.2
    insitu.reference_iteration(graph, 2, np, np.float32, World([]), seconds=1e9)
    insitu.reference_iteration(graph, 2, np, np.float32, World([0.25]), seconds=1.0)     # a rank 0.25 s a step
    insitu.reference_iteration(graph, 2, np, np.float32, World([0.1]), seconds=1.0)      # 0.1 s: ten of them
    assert counts == [5, insitu.REFERENCE_MOST, 5, 10]
