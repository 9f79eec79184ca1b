"""The stall watchdog's parts that need no ranks: the board's places, the settings and thresholds, and the message
that names the ranks holding a job up (tests/test_stalls.py stops real ranks under mpiexec)."""

import io
import time
from types import SimpleNamespace

import pytest

from spmdcnn.comm.watchdog import ABORT_FLOOR_S, SLOW, WARN_FLOOR_S, Board, Settings, Watchdog, describe, monitors


def test_points_count_within_a_stage_and_notes_do_not():
    board = Board()
    board.stage("data", 4, slow=True)
    first = board.where
    board.at("forward", "conv1", "its input exchange")
    board.note("computing")
    board.at("forward", "conv2")
    stage, point, step, kind, name, note, since, slow = board.where
    assert (stage, point, step, kind, name, note, slow) == (first[0], 2, 4, "forward", "conv2", None, True)
    board.stage("checkpoint", name="run.h5")
    assert board.where[:2] == (first[0] + 1, 0) and not board.where[7]


def test_places_are_described_in_words():
    board = Board()
    board.stage("data", 6)
    board.at("forward", "conv2", "its input exchange")
    assert describe(board.where, 12.4) == "step 7, forward of layer 'conv2' (its input exchange), for 12 s"
    board.at("gradients")
    board.note("bucket 2 of 3")
    assert describe(board.where, 3) == "step 7, summing gradients (bucket 2 of 3), for 3 s"
    board.stage("checkpoint", name="run.h5", slow=True)
    assert describe(board.where, 70) == "writing the checkpoint (run.h5), for 70 s"


def test_settings_of_a_job_and_of_an_option():
    assert Settings.of(True) == Settings() and Settings.of(False) == Settings(on=False)
    assert Settings.of({"warn": 30.0, "abort": False}) == Settings(True, 30.0, False)
    assert Settings.of({"warn": "auto"}) == Settings()
    assert Settings.parse("auto") == Settings() and Settings.parse("off") == Settings(on=False)
    assert Settings.parse("20") == Settings(True, 20.0, None)
    assert Settings.parse("20,never") == Settings(True, 20.0, False)
    assert Settings.parse("20,90") == Settings(True, 20.0, 90.0)
    for bad in ("0", "x", "5,-1", "1,2,3", "nan", "inf", "1,nan", "-inf"):
        with pytest.raises(ValueError, match="give auto, off, WARN or WARN,ABORT"):
            Settings.parse(bad)


def test_automatic_thresholds_follow_the_step_and_are_generous_where_slow():
    auto = Settings()
    assert auto.thresholds(None, False) == (WARN_FLOOR_S, ABORT_FLOOR_S)
    assert auto.thresholds(0.1, False) == (WARN_FLOOR_S, ABORT_FLOOR_S)       # fast steps: the floors
    assert auto.thresholds(10.0, False) == (200.0, 1000.0)                    # 20 and 100 steps of 10 s
    assert auto.thresholds(None, True) == (SLOW * WARN_FLOOR_S, SLOW * ABORT_FLOOR_S)
    assert Settings(True, 5.0, 7.0).thresholds(10.0, True) == (5.0, 7.0)     # what the job says, everywhere
    assert Settings(True, 5.0, False).thresholds(None, False) == (5.0, None)


class _Watched:
    """A monitor's table without ranks or threads: rank 0's view of ``wheres`` (rank -> Board.where)."""

    def __init__(self, wheres, heard_ago, settings=Settings(True, 10.0, 20.0), rank=0):
        world = SimpleNamespace(board=Board(), size=len(wheres), rank=rank)
        self.dog = Watchdog(world, settings, stream=io.StringIO())
        now = time.monotonic()
        self.dog.monitors, self.dog.beat, self.dog.hosts = [0, 1], 1.0, ["a"] * len(wheres)
        self.dog.heard = {rank: (where, None, now - heard_ago.get(rank, 0.0), 30.0)
                          for rank, where in wheres.items()}
        self.dog.moved, self.dog.seen = now - 30.0, tuple(h[0] for h in self.dog.heard.values())
        self.now = now


def _where(stage, point, kind, name=None, note=None, step=5):
    return (stage, point, step, kind, name, note, 0.0, False)


def test_the_report_names_the_ranks_at_the_earliest_point_and_groups_the_others_by_place():
    """In a layer-wise plan the ranks waiting on a stopped one may wait at different points: the stopped rank (the
    earliest point) is named as holding the job up, and the others are listed where they wait, grouped."""
    far, near = _where(8, 40, "forward", "conv3", "its input exchange"), _where(8, 30, "forward", "conv2",
                                                                                "its input exchange")
    watched = _Watched({0: far, 1: _where(8, 12, "forward", "conv1", "computing"), 2: near, 3: far}, {1: 25.0})
    line = watched.dog.report(watched.now)
    assert ("rank 1 has not reached the point the other ranks wait at (ranks 0, 3: step 6, forward of layer "
            "'conv3' (its input exchange), for 30 s; rank 2: step 6, forward of layer 'conv2' (its input exchange), "
            "for 30 s); rank 1: step 6, forward of layer 'conv1' (computing), for 55 s (last heard from 25 s "
            "ago)") in line


def test_the_second_monitor_is_on_another_node():
    assert monitors(["a"]) == [0]
    assert monitors(["a", "a", "a", "a"]) == [0, 1]
    assert monitors(["a", "a", "b", "b"]) == [0, 2]


def test_without_thread_multiple_a_rank_watches_its_own_board_and_rank_0_warns():
    where = _where(3, 7, "loss")
    watched = _Watched({0: where}, {})
    dog = watched.dog
    dog.heard_all, dog.monitors = False, [0]
    dog._judge(watched.now)
    out = dog.stream.getvalue()
    assert "this rank, rank 0: step 6, summing the loss, for 30 s (MPI gives no MPI_THREAD_MULTIPLE" in out
    other = _Watched({1: where}, {}, rank=1)
    other.dog.heard_all, other.dog.monitors = False, [1]
    other.dog._judge(other.now)
    assert other.dog.stream.getvalue() == ""           # rank 0 warns; every rank ends the job when it has waited


def test_the_report_names_the_ranks_behind_the_furthest_point_and_the_silent_ones():
    waiting = _where(8, 40, "gradients", note="bucket 1 of 2")
    watched = _Watched({0: waiting, 1: _where(8, 12, "forward", "conv2", "computing"), 2: waiting}, {1: 25.0})
    line = watched.dog.report(watched.now)
    assert line.startswith("spmdcnn: watchdog: no progress for 30 s: rank 1 has not reached the point the other "
                           "ranks wait at (ranks 0, 2: step 6, summing gradients (bucket 1 of 2), for 30 s)")
    assert "rank 1: step 6, forward of layer 'conv2' (computing), for 55 s" in line
    assert "not heard from: rank 1 (stopped, its node lost, or stuck in a call that holds Python's lock" in line


def test_the_report_says_when_every_rank_is_at_the_same_point():
    where = _where(3, 7, "loss")
    watched = _Watched({0: where, 1: where}, {})
    assert "every rank is at the same point (ranks 0, 1: step 6, summing the loss, for 30 s)" in \
        watched.dog.report(watched.now)


def test_a_monitor_warns_once_then_ends_the_job_and_rank_1_speaks_for_a_silent_rank_0(monkeypatch):
    where = _where(3, 7, "loss")
    watched = _Watched({0: where, 1: _where(3, 2, "forward", "fc")}, {})
    dog = watched.dog
    ended = []
    monkeypatch.setattr("spmdcnn.comm.watchdog.mpi", lambda: type("MPI", (), {"COMM_WORLD": type(
        "World", (), {"Abort": staticmethod(lambda status: ended.append(status))})}))
    monkeypatch.setattr("spmdcnn.comm.watchdog.time.sleep", lambda seconds: None)
    dog._judge(watched.now)                 # 30 s without progress, warn at 10 s: one warning
    dog._judge(watched.now + 1)
    out = dog.stream.getvalue()
    assert out.count("no progress for") == 1 and "The job ends in 20 s unless it moves on" in out and not ended
    dog._judge(watched.now + 21)            # 20 s after the warning: the end
    assert ended == [3] and "Ending the job (watchdog.abort: 20 s after the warning)." in dog.stream.getvalue()
    # rank 1's view, rank 0 silent: rank 1 speaks; with rank 0 heard from, it keeps quiet
    quiet = _Watched({0: where, 1: where}, {}, rank=1)
    assert not quiet.dog._speaks(quiet.now)
    silent = _Watched({0: where, 1: where}, {0: 5.0}, rank=1)
    assert silent.dog._speaks(silent.now)


def test_progress_after_a_warning_is_said():
    watched = _Watched({0: _where(3, 7, "loss"), 1: _where(3, 7, "loss")}, {}, Settings(True, 10.0, False))
    dog = watched.dog
    dog._judge(watched.now)
    assert "waits on" in dog.stream.getvalue()
    dog.heard[1] = (_where(4, 0, "data"),) + dog.heard[1][1:]
    dog._judge(watched.now + 1)
    assert "spmdcnn: watchdog: the job moved on after 31 s without progress" in dog.stream.getvalue()


def test_a_message_of_an_earlier_watch_is_ignored(monkeypatch):
    """A world watched twice (two runs in one process) reuses its communicator: the second watch takes only its
    own messages."""
    where = _where(3, 7, "loss")
    watched = _Watched({0: where, 1: where}, {})
    dog = watched.dog
    dog.run = 2
    queue = [(1, (1, _where(9, 9, "update"), None, 0.0)), (1, (2, _where(4, 1, "data"), None, 0.0))]

    class Comm:
        def Iprobe(self, source, tag, status):
            if queue:
                status.source = queue[0][0]
            return bool(queue)

        def recv(self, source, tag):
            return queue.pop(0)[1]
    status = SimpleNamespace(source=None, Get_source=lambda: status.source)
    monkeypatch.setattr("spmdcnn.comm.watchdog.mpi", lambda: SimpleNamespace(Status=lambda: status, ANY_SOURCE=-1))
    dog.comm = Comm()
    dog._receive()
    assert dog.heard[1][0] == _where(4, 1, "data")


def test_stragglers_name_the_slowest_rank_against_the_median_of_the_others():
    from spmdcnn.runtime.metrics import stragglers
    assert stragglers([1.0], 4) == {"slowest_rank": None, "work_slowest_s": None, "work_others_s": None}
    assert stragglers([1.0, 2.0], 0)["slowest_rank"] is None
    found = stragglers([4.0, 8.0, 2.0, 6.0], 2)
    assert found == {"slowest_rank": 1, "work_slowest_s": 4.0, "work_others_s": 2.0}
