"""Evaluation metrics computed on the host (numpy), e.g. the job's final AUC."""

from __future__ import annotations

import numpy as np


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve (Mann–Whitney U; tied scores share their mean rank).
    NaN when only one class is present."""
    labels = np.asarray(labels).reshape(-1) > 0.5
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    pos, neg = int(labels.sum()), int((~labels).sum())
    if pos == 0 or neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="stable")
    sorted_scores = scores[order]
    ranks = np.empty(len(scores))
    ranks[order] = np.arange(1, len(scores) + 1)
    # average ranks over runs of equal scores
    _, first, counts = np.unique(sorted_scores, return_index=True, return_counts=True)
    for start, n in zip(first[counts > 1], counts[counts > 1]):
        ranks[order[start:start + n]] = start + (n + 1) / 2
    return float((ranks[labels].sum() - pos * (pos + 1) / 2) / (pos * neg))


def logloss(labels: np.ndarray, probabilities: np.ndarray) -> float:
    p = np.clip(np.asarray(probabilities, dtype=np.float64), 1e-7, 1 - 1e-7)
    y = np.asarray(labels, dtype=np.float64)
    return float(-(y * np.log(p) + (1 - y) * np.log(1 - p)).mean())


def audit_summary(counts: np.ndarray, expected_times: int, started=None) -> dict:
    """The audit report: how many records were applied 0, 1 and 2+ times, and how many
    exactly ``expected_times`` (= epochs) or not. ``started`` (the Keras audit's
    per-record count of steps begun): ``torn`` = records whose step a kill cut (it
    began, not every update of it landed, and the batch was trained again)."""
    counts = np.asarray(counts)
    extra = {}
    if started is not None:
        extra["torn"] = int((np.asarray(started) > counts).sum())
    return {**extra, "applied_0": int((counts == 0).sum()),
            "applied_1": int((counts == 1).sum()),
            "applied_2plus": int((counts >= 2).sum()),
            "expected_times": int(expected_times),
            "applied_expected": int((counts == expected_times).sum()),
            "applied_other": int((counts != expected_times).sum())}


def evaluate_file(path: str, predict, batch: int = 8192) -> dict:
    """AUC and logloss of ``predict(batch) -> click probabilities`` over a record file
    (``antdt_tf.data.records``), read in blocks of ``batch`` records."""
    from antdt_tf.data.records import RecordFile

    data = RecordFile(path)
    labels, scores = [], []
    for start in range(0, data.num_records, batch):
        b = data.read(start, min(batch, data.num_records - start))
        labels.append(b.label)
        scores.append(np.asarray(predict(b), dtype=np.float64).reshape(-1))
    y, p = np.concatenate(labels), np.concatenate(scores)
    return {"eval_records": int(len(y)), "auc": auc(y, p), "logloss": logloss(y, p)}


def write_report(report: dict, path: str = "") -> None:
    """Prints the JSON report (stdout) and writes it to ``path`` if given."""
    import json

    text = json.dumps(report)
    print(text, flush=True)
    if path:
        with open(path, "w") as f:
            f.write(text)
