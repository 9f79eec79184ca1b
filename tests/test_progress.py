"""spmdcnn.progress: the bar on a terminal, a line every 5 % elsewhere, rates and time left on a fake clock."""

import ast
import io

import pytest

import spmdcnn.progress
from spmdcnn.progress import CLEAR, Progress, format_duration, format_rate


class Clock:
    """A clock that moves only when told."""

    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class Terminal(io.StringIO):
    def isatty(self):
        return True


def drawn(stream):
    """The states of the bar drawn on ``stream``, in turn ('' where it was erased)."""
    return stream.getvalue().split(CLEAR)[1:]


def test_a_terminal_gets_one_line_redrawn_with_rate_and_time_left():
    clock, stream = Clock(), Terminal()
    progress = Progress(2000, "convert", unit="images", stream=stream, clock=clock)
    clock.now += 2.0
    progress.update(800)
    assert drawn(stream) == ["convert [########............] 800/2,000 images  400 images/s  3 s left"]
    assert "\n" not in stream.getvalue()
    clock.now += 3.0
    progress.update(2000)
    assert drawn(stream)[-1] == "convert [####################] 2,000/2,000 images  400 images/s  done in 5 s"
    progress.close()
    assert drawn(stream)[-1] == "" and stream.getvalue().endswith(CLEAR)
    progress.update(2000)                           # closed: nothing more
    assert len(drawn(stream)) == 3


def test_the_terminal_is_redrawn_at_most_ten_times_a_second_and_always_at_the_end():
    clock, stream = Clock(), Terminal()
    progress = Progress(1000, "steps", stream=stream, clock=clock)
    for done in range(1, 1001):
        clock.now += 0.001                          # 1,000 updates in one second
        progress.update(done)
    states = drawn(stream)
    assert 10 <= len(states) <= 11
    assert states[0].startswith("steps [....................] 1/1,000 items")
    assert states[-1].startswith("steps [####################] 1,000/1,000 items")


def test_log_lines_print_above_the_bar_and_notes_and_suffixes_follow_the_numbers():
    clock, stream = Clock(), Terminal()
    with Progress(50, "train", unit="steps", stream=stream, clock=clock, suffix=lambda: "lr 0.1") as progress:
        clock.now += 5.0
        progress.update(10, note="loss 0.41")
        progress.write("step 10: checkpoint written")
        clock.now += 0.01
        progress.advance(1)                         # too soon to redraw; the note stays
        clock.now += 1.0
        progress.advance(1)
    text = stream.getvalue()
    bar = "train [####................] 10/50 steps  2 steps/s  20 s left  loss 0.41  lr 0.1"
    assert text.startswith(CLEAR + bar + CLEAR + "step 10: checkpoint written\n" + CLEAR + bar)
    assert drawn(stream)[-2] == "train [####................] 12/50 steps  2 steps/s  19 s left  loss 0.41  lr 0.1"
    assert text.endswith(CLEAR)                     # leaving the with erases the bar


def test_a_log_gets_a_line_every_five_per_cent_and_at_the_end():
    clock, stream = Clock(), io.StringIO()          # not a terminal: a pipe, a batch log
    progress = Progress(2000, "convert", unit="images", stream=stream, clock=clock)
    for done in range(0, 2001, 40):                 # every 2 %
        clock.now += 0.1
        progress.update(done)
    progress.update(2000)                           # the end is printed once
    progress.close()
    lines = stream.getvalue().splitlines()
    # the first update at or past each multiple of 5 %: 6, 10, 16, 20, ... (the updates come every 2 %)
    assert [line.split(" %")[0] for line in lines] == [f"convert: {5 * k + k % 2}" for k in range(1, 20)] + [
        "convert: 100"]
    assert lines[7] == "convert: 40 % (800 of 2,000 images), 381 images/s, 3 s left"
    assert lines[-1] == "convert: 100 % (2,000 of 2,000 images), 392 images/s, done in 5 s"
    assert CLEAR not in stream.getvalue()


def test_a_log_line_for_every_step_crossed_once_however_big_the_jumps():
    clock, stream = Clock(), io.StringIO()
    progress = Progress(7, "profile", unit="shapes", stream=stream, clock=clock)
    for done in (1, 2, 5, 7):
        clock.now += 60
        progress.update(done, note="conv3")
    assert stream.getvalue().splitlines() == [
        "profile: 14 % (1 of 7 shapes), 0.0167 shapes/s, 6 min 00 s left, conv3",
        "profile: 28 % (2 of 7 shapes), 0.0167 shapes/s, 5 min 00 s left, conv3",
        "profile: 71 % (5 of 7 shapes), 0.0278 shapes/s, 1 min 12 s left, conv3",
        "profile: 100 % (7 of 7 shapes), 0.0292 shapes/s, done in 4 min 00 s, conv3"]


def test_the_rate_counts_only_what_was_done_since_the_start():
    clock, stream = Clock(), io.StringIO()
    progress = Progress(100, "train", unit="steps", stream=stream, clock=clock, initial=50)
    progress.update(55)                             # no time has passed: no rate, no time left
    clock.now += 10
    progress.update(60)
    assert stream.getvalue().splitlines() == ["train: 55 % (55 of 100 steps)",
                                              "train: 60 % (60 of 100 steps), 1 steps/s, 40 s left"]


def test_setting_false_shows_nothing_and_true_draws_even_without_a_terminal():
    quiet, forced = io.StringIO(), io.StringIO()
    for stream, setting in ((quiet, False), (forced, True)):
        with Progress(10, "x", stream=stream, setting=setting, clock=Clock()) as progress:
            progress.update(10)
            progress.write("a line")
    assert quiet.getvalue() == "a line\n"
    assert forced.getvalue().startswith(CLEAR + "x [####################] 10/10 items")


def test_auto_draws_on_standard_output_when_it_is_a_terminal(monkeypatch):
    monkeypatch.setattr("sys.stdout", Terminal())
    progress = Progress(4, "x", clock=Clock())
    progress.update(1)
    assert drawn(progress.stream) == ["x [#####...............] 1/4 items"]


@pytest.mark.parametrize("kwargs, message", [
    ({"total": -1}, "progress 'x': expected 0 <= initial <= total, got initial 0 and total -1"),
    ({"total": 5, "initial": 6}, "expected 0 <= initial <= total, got initial 6 and total 5"),
    ({"total": 5, "setting": "yes"}, "progress 'x': setting must be 'auto', True or False, got 'yes'"),
])
def test_bad_arguments_say_what(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", "\\(")):
        Progress(label="x", **kwargs)


def test_nothing_to_do_is_done_at_once():
    stream = io.StringIO()
    Progress(0, "convert", unit="images", stream=stream, clock=Clock()).update(0)
    assert stream.getvalue() == "convert: 100 % (0 of 0 images), done in <1 s\n"


@pytest.mark.parametrize("seconds, text", [
    (0.4, "<1 s"), (3.16, "3 s"), (59.4, "59 s"), (59.6, "1 min 00 s"), (185, "3 min 05 s"),
    (3599.7, "1 h 00 min"), (7620, "2 h 07 min"), (90000, "25 h 00 min")])
def test_durations(seconds, text):
    assert format_duration(seconds) == text


@pytest.mark.parametrize("rate, text", [(380.4, "380"), (12345.6, "12,346"), (38.24, "38.2"), (0.01234, "0.0123")])
def test_rates(rate, text):
    assert format_rate(rate) == text


def test_the_module_is_a_leaf_of_the_standard_library():
    tree = ast.parse(open(spmdcnn.progress.__file__, encoding="utf-8").read())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module or "." for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported <= {"os", "sys", "time"}, imported


def test_the_bar_narrows_then_the_line_is_cut_to_fit_the_terminal(monkeypatch):
    full = "convert [########............] 800/2,000 images  400 images/s  3 s left"
    for columns, line in ((80, full), (len(full) - 4, full.replace("########............", "######.........")),
                          (40, "convert [##...] 800/2,000 images  400 i")):
        stream, clock = Terminal(), Clock()
        monkeypatch.setattr(spmdcnn.progress, "_columns", lambda stream: columns)
        progress = Progress(2000, "convert", unit="images", stream=stream, clock=clock)
        clock.now += 2.0
        progress.update(800)
        assert drawn(stream) == [line] and len(line) < columns


def test_a_delay_shows_nothing_for_work_that_ends_sooner_and_the_rest_after_it():
    clock, stream = Clock(), io.StringIO()
    quick = Progress(10, "profile", unit="tile shapes", stream=stream, clock=clock, delay=3.0)
    for done in range(1, 11):
        clock.now += 0.2
        quick.update(done)
    quick.close()
    assert stream.getvalue() == ""                  # 2 s of work: no progress at all
    slow = Progress(10, "profile", unit="tile shapes", stream=stream, clock=clock, delay=3.0)
    for done in range(1, 11):
        clock.now += 0.5
        slow.update(done)
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("profile: 60 % (6 of 10 tile shapes)")     # the first after 3 s
    assert lines[-1].startswith("profile: 100 % (10 of 10 tile shapes)") and len(lines) == 5
