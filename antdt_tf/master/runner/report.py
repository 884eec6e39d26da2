"""The job's report: a function of the runner's record and what the master and the
chief said at the end — it changes nothing (the loop's clocks, events and actions are
read, not written)."""

from __future__ import annotations

from antdt_tf.sharding.client import worker_split


def health_dict(h) -> dict:
    from antdt_tf.monitor.view import straggler_class_name

    out = {"task": f"{h.task.job}:{h.task.index}",
           "class": straggler_class_name(h.straggler_class),   # the Monitor's own name
           "slowness": round(h.slowness, 2), "samples": h.samples}
    if h.task.job == "worker":
        out.update(step_seconds=round(h.step_seconds, 4),
                   records_per_second=round(h.records_per_second, 1))
    else:
        out["latency_ms"] = round(h.latency_ms, 2)
    return out


def build_report(job, *, progress, coordinator: dict, cpu_seconds: dict, now: float) -> dict:
    """``job``: the runner (its record is read); ``progress``: the master's final
    ``GetProgress`` (None: unreachable); ``coordinator``: the chief's own report;
    ``now``: monotonic time, the end when the master never said it finished."""
    cfg, coord, cpu = job.cfg, coordinator, cpu_seconds
    end = job.finished_at or now
    jct = end - (job.train_t0 or job.t0)
    started_unix = job.train_started_unix
    final = progress.datasets[0] if progress is not None else None
    if final is not None and final.started_unix and final.finished_unix:
        # exact: the master's journal times, not our polling
        jct = final.finished_unix - final.started_unix
        started_unix = final.started_unix
    total = job.num_records * cfg.epochs
    # what the master counted per worker (a job's own program may write no summary)
    shards, records = worker_split(progress) if progress is not None else ([], [])
    report = {
        "jct_seconds": round(jct, 3),   # first shard issued -> every record applied
        "startup_seconds": round(job.startup_seconds, 2),
        "train_started_unix": started_unix,
        "records": total,
        "records_per_second": round(total / jct, 1),
        "num_ps": cfg.num_ps, "num_workers": cfg.num_workers,
        "num_hosts": len(job.host_names), "backend": cfg.backend,
        "hosts": {f"{j}:{i}": job.host_names[h] for (j, i), h in sorted(job.placement.items())},
        "epochs": cfg.epochs, "batch_size": cfg.batch_size,
        "records_per_shard": cfg.records_per_shard,
        "shards_per_worker": coord.get("shards_per_worker") or shards,
        "records_per_worker": coord.get("records_per_worker") or records,
        "auc": coord.get("auc"), "logloss": coord.get("logloss"),
        "injections": [str(j) for j in cfg.injections],
        "failures": [ev for ev in job.events if "failure" in ev],
        "events": job.events,
        "restarts": {f"{j}:{i}": n for (j, i), n in job.restarts.items()},
        "cpu_seconds": cpu,
        "coordinator": coord,
        "policy": job.policy.name,
        "mode": cfg.mode,
        "batch_sizes": {str(w): b for w, b in job.batch_sizes.items()},
        "actions": job.adopted_actions + [a.report() for a in job.actions],
        "health": [health_dict(h) for h in job.health],
        "timeline": job.timeline,
        # lease remainders idle workers took over (tail work-stealing)
        "stolen_leases": final.stolen_leases if final is not None else 0,
        "backup_leases": final.backup_leases if final is not None else 0,
        # what the master counted per task (its latest incarnation), from every
        # worker's own reports: exact, unlike the chief's sampled counters
        "master_records_per_task": {
            f"{t.task.type}:{t.task.index}": t.records_done
            for t in (progress.tasks if progress is not None else ())},
    }
    if "audit" in coord:
        audit = dict(coord["audit"])
        # each kill may redo the one batch in flight: injected, a relaunch's, or a
        # fault from outside (a worker or PS that died on its own, a lost host; an
        # injected kill's failure reads "killed" and is counted once, above)
        outside = [ev for ev in job.events if ev.get("failure") not in (None, "killed")
                   and ev.get("task", "").startswith(("worker:", "ps:"))]
        faults = len([j for j in cfg.injections if j.kind == "kill"]) + len(
            [a for a in job.actions if a.kind == "RelaunchWorker"]) + len(outside)
        # a program of your own may say its batch size (docs/program.md)
        bound = faults * int(coord.get("batch_size", cfg.batch_size))
        # a torn step (Keras audit: begun, cut by the kill, trained again) was
        # partly applied twice: it counts against the same one-batch bound
        off = audit.get("applied_other", 0) + audit.get("torn", 0)
        audit["allowed_off_records"] = bound
        audit["ok"] = off <= bound
        if final is not None and final.backup_leases:
            # backup workers apply what both copies trained twice, by design: their
            # contract is only that nothing is lost
            audit["duplicates_by_design"] = True
            audit["ok"] = audit.get("applied_0", 0) <= bound
        report["audit"] = audit
    return report
