"""FaultClock: a failure's two recovery times from the master's record count — training
again (after the restore's drop) and the lost work regained (past the count at the
failure)."""

from antdt_tf.master.runner.faults import FaultClock


def run(clock, readings):
    for now, records in readings:
        if clock.observe(now, records):
            return now
    return None


def test_a_restore_drops_the_count_then_training_again_comes_before_regained():
    ev = {}
    clock = FaultClock(ev, at=10.0, before=50_000)
    # the restored checkpoint held 40k records; training resumes at 14 s, passes 50k at 17 s
    done = run(clock, [(11, 50_000), (12, 40_000), (13, 40_000), (14, 42_000),
                       (16, 48_000), (17, 51_000)])
    assert done == 17
    assert ev == {"training_again_after_s": 4.0, "regained_after_s": 7.0}


def test_a_worker_kill_without_a_restore_trains_on_at_once():
    ev = {}
    run(FaultClock(ev, at=5.0, before=1000), [(5.5, 1200)])
    assert ev == {"training_again_after_s": 0.5, "regained_after_s": 0.5}


def test_late_reports_before_the_chief_restarts_are_not_training_again():
    """A surviving worker's report lifts the count after a PS died; the chief then
    restarts and restores: training again is only the growth after that."""
    ev = {}
    clock = FaultClock(ev, at=0.0, before=1000)
    assert not clock.observe(1.0, 1000)
    clock.observe(1.5, 1000)
    clock.chief_started(1000)              # at 2.0 s: relaunched with the restore
    run(clock, [(3.0, 800), (4.0, 800), (5.0, 900), (7.0, 1100)])
    assert ev == {"training_again_after_s": 5.0, "regained_after_s": 7.0}


def test_a_drop_after_growth_restarts_the_training_again_clock():
    ev = {}
    clock = FaultClock(ev, at=0.0, before=1000)
    run(clock, [(1.0, 1000), (2.0, 990), (3.0, 995), (4.0, 700), (6.0, 800), (9.0, 1001)])
    assert ev == {"training_again_after_s": 6.0, "regained_after_s": 9.0}


def test_a_job_that_ends_before_regaining_reports_what_it_saw():
    ev = {}
    clock = FaultClock(ev, at=0.0, before=1000)
    run(clock, [(1.0, 500), (2.0, 600)])
    clock.close()
    assert ev == {"training_again_after_s": 2.0}
    ev2 = {}
    FaultClock(ev2, at=0.0, before=1000).close()
    assert ev2 == {}
