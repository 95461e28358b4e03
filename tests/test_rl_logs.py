"""Online RL's own logs: a run that resumes or starts again after an interrupted one keeps only its own
rows from where it writes on (the MLflow samples table showed completions of an attempt that was thrown
away), and PPO's progress line shows its policy loss as GRPO's shows its loss."""

from __future__ import annotations

import json

from transformers import TrainerState

from gym import progress
from gym.train import progress as train_progress
from gym.train.rl_common import SampleLog, metrics_file, samples_file


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def _lost_attempt(stage_dir):
    """An attempt killed after logging steps 5..12 (metrics every 1, samples every 5)."""
    log = SampleLog(stage_dir / "checkpoints", keep=2)
    for step in range(5, 13):
        log.write_metrics(step, {"reward": 0.1, "note": "text is not a metric"})
        if step % 5 == 0:
            log.write(step, [{"completion": f"old {step} a"}, {"completion": f"old {step} b"}])


def test_a_resumed_run_drops_the_rows_the_lost_attempt_logged_past_its_checkpoint(tmp_path):
    _lost_attempt(tmp_path)
    resumed = SampleLog(tmp_path / "checkpoints", keep=2)  # resumes at step 10: first writes at 10
    resumed.write(10, [{"completion": "new 10"}])
    resumed.write_metrics(10, {"reward": 0.9})
    resumed.write_metrics(11, {"reward": 0.95})
    samples = _rows(samples_file(tmp_path))
    assert [(r["step"], r["completion"]) for r in samples] == [
        (5, "old 5 a"),
        (5, "old 5 b"),
        (10, "new 10"),
    ]
    metrics = _rows(metrics_file(tmp_path))
    assert [r["step"] for r in metrics] == [5, 6, 7, 8, 9, 10, 11]
    assert [r["reward"] for r in metrics[-2:]] == [0.9, 0.95] and "note" not in metrics[0]


def test_a_run_that_starts_again_keeps_none_of_the_lost_attempts_rows(tmp_path):
    _lost_attempt(tmp_path)
    again = SampleLog(tmp_path / "checkpoints", keep=2)  # PPO starts over: its first log is step 1
    again.write_metrics(1, {"reward": 0.2})
    again.write(5, [{"completion": "new 5"}, {"completion": "new 5 b"}, {"completion": "not kept"}])
    assert [r["step"] for r in _rows(metrics_file(tmp_path))] == [1]
    assert [r["completion"] for r in _rows(samples_file(tmp_path))] == ["new 5", "new 5 b"]


def test_later_writes_of_the_same_run_append(tmp_path):
    log = SampleLog(tmp_path / "checkpoints", keep=1)
    for step in (1, 2, 3):
        log.write_metrics(step, {"reward": step})
        log.write(step, [{"completion": str(step)}])
    assert [r["reward"] for r in _rows(metrics_file(tmp_path))] == [1, 2, 3]
    assert [r["completion"] for r in _rows(samples_file(tmp_path))] == ["1", "2", "3"]


def test_ppos_progress_shows_its_policy_loss(monkeypatch, capsys):
    monkeypatch.delenv(progress.VERBOSE_ENV, raising=False)
    state = TrainerState(max_steps=4, global_step=0)
    callback = train_progress.ProgressCallback("ppo")
    callback.on_train_begin(None, state, None)
    for step, loss in ((2, 0.5), (4, 0.25)):
        state.global_step = step
        callback.on_log(None, state, None, logs={"loss/policy_avg": loss, "objective/rlhf_reward": 1.0})
    callback.on_train_end(None, state, None)
    done = capsys.readouterr().err.splitlines()[-1]
    assert done.startswith("ppo: done") and "loss 0.5 -> 0.25" in done, done
