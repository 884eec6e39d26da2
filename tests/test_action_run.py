"""ActionRun: the Controller's action state machine, legal and illegal moves, what the
report shows, and the measured costs."""

import pytest

from antdt_tf.controller import AdjustBatchSizes, RelaunchWorker, ScaleWorkers
from antdt_tf.controller.execution import ActionPhase, ActionRun, IllegalTransition

S, R, D, A = (ActionPhase.STARTING, ActionPhase.RECOVERING, ActionPhase.DONE,
              ActionPhase.ABANDONED)


def test_a_move_starts_recovers_and_is_done_with_its_costs_measured():
    run = ActionRun(RelaunchWorker(worker=2, reason="slow"), t=5.0, started=100.0,
                    from_host=0, to_host=1)
    assert run.pending and run.phase is S and run.task == ("worker", 2)
    run.to(R, 104.5, "old killed")
    run.to(D, 110.0, "training again")
    assert not run.pending and run.ended == 110.0
    assert (run.standby_seconds, run.recovered_after_s) == (4.5, 5.5)
    assert [h[0] for h in run.history] == [S, R, D]
    assert run.report() == {"t": 5.0, "action": "RelaunchWorker", "job": "worker",
                            "index": 2, "reason": "slow", "phase": "done", "from_host": 0,
                            "to_host": 1, "standby_seconds": 4.5, "recovered_after_s": 5.5}


@pytest.mark.parametrize("path,illegal", [
    ([], D),                 # done without the switch
    ([R], A),                # abandoned after the old one was killed
    ([R, D], R),             # nothing after done
    ([A], R),                # nothing after abandoned
])
def test_illegal_moves_raise_and_change_nothing(path, illegal):
    run = ActionRun(ScaleWorkers(num_workers=3), t=0.0, started=1.0, from_workers=2,
                    to_workers=3)
    for i, phase in enumerate(path):
        run.to(phase, 2.0 + i)
    before = (run.phase, len(run.history))
    with pytest.raises(IllegalTransition):
        run.to(illegal, 10.0)
    assert (run.phase, len(run.history)) == before


def test_abandoned_and_batch_size_runs_report_what_happened(tmp_path):
    ready = tmp_path / "ready"
    run = ActionRun(ScaleWorkers(num_workers=3), t=1.0, started=1.0, from_workers=2,
                    to_workers=3, ready_files=(ready,))
    assert not run.ready()
    ready.write_text("1")
    assert run.ready()
    run.to(A, 130.0, "not ready")
    assert run.report()["abandoned"] and run.report()["to_workers"] == 3
    adjust = ActionRun(AdjustBatchSizes(sizes=((0, 96), (1, 32))), t=2.0, started=5.0)
    assert adjust.phase is D and not adjust.pending and adjust.ended == 5.0
    assert adjust.report()["batch_sizes"] == {"0": 96, "1": 32}
