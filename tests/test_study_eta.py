"""The study ETA: a step's estimate is the cost model's arithmetic on its config, the time left follows the measured
pace (per stage once that stage has run), and the training line and the pipeline line say when the machine is busy
(1-minute load average over the cores), with the load injected."""

from __future__ import annotations

import math

import pytest

from nope_lightning.config import load_config
from nope_lightning.config.stages import EvaluateConfig, PretrainConfig
from nope_lightning.model.gpt import non_embedding_parameters
from nope_lightning.pipeline import estimate
from nope_lightning.pipeline.eta import StudyClock
from nope_lightning.runtime.progress import StepProgressBar, busy_note, duration
from tests.conftest import REPO


@pytest.fixture(scope="module")
def tiny() -> PretrainConfig:
    return load_config(PretrainConfig, REPO / "conf/pretrain/tiny.yaml")


def test_pretrain_estimate_is_flop_over_the_measured_rate(tiny):
    # tiny: 2 layers x 64, vocab 512, T = 64, batch 8, 20 steps, 1 process
    n = non_embedding_parameters(tiny.model, 64)
    per_token = 6 * (n + 64 * 512 + 2 * 64 * 64)
    tokens = 20 * 8 * 1 * 64
    expected = 15.0 + tokens * per_token / 6.6e10  # one process: ONE_PROCESS_TRAIN_RATE
    assert estimate.seconds("pretrain", tiny, tiny) == pytest.approx(expected, rel=1e-12)
    # 2 DDP processes read twice the tokens at the DDP rate
    ddp = load_config(PretrainConfig, REPO / "conf/pretrain/tiny.yaml", ["trainer.devices=2"])
    assert estimate.seconds("pretrain", ddp, ddp) == pytest.approx(15.0 + 2 * tokens * per_token / 7.7e10)


def test_evaluate_estimate_counts_windows_curves_and_passkey_prompts(tiny):
    cfg = EvaluateConfig(checkpoint="runs:/x/model", eval_lengths=[64, 128], ppl_tokens=100, stride=32,
                         position_windows=3, entropy=True, passkey_keys=2, passkey_depths=5, passkey_lengths=[128],
                         max_new_tokens=8, longctx_samples=0)
    n = non_embedding_parameters(tiny.model, 64) + 64 * 512

    def forward(length: int) -> int:
        return 2 * (n + 2 * 64 * length)

    windows = math.ceil(100 / 32)  # 4 windows per length, each scoring its last 32 targets
    flop = (windows * 64 * forward(64) + windows * 128 * forward(128)  # perplexity
            + 2.5 * 3 * 128 * forward(128)  # 3 position windows of the longest, with the entropy probe
            + 10 * (128 + 8) * forward(128))  # 5 depths x 2 keys, prompt + 8 new tokens
    expected = 10.0 + flop / 1.05e11 + 10 * 8 * 0.0044
    assert estimate.seconds("evaluate", cfg, tiny) == pytest.approx(expected, rel=1e-12)
    assert estimate.seconds("evaluate", cfg, None) is None  # a model made elsewhere: no estimate


def test_eta_follows_the_measured_pace_per_stage():
    now = [0.0]
    plan = [{"stage": "pretrain", "estimate_s": 100.0}, {"stage": "evaluate", "estimate_s": 50.0},
            {"stage": "evaluate", "estimate_s": 50.0}, {"stage": "report", "estimate_s": None}]
    clock = StudyClock(plan, clock=lambda: now[0], load=lambda: (0.5, 0, 0), cores=2)
    assert clock.left() == 200.0  # nothing measured: the estimates
    assert clock.status() == "study 0 s in, ~3 min left (0 of 4 steps done; no step timed yet)"
    now[0] = 150.0
    assert clock.finished(0, 150.0) == "done in 2 min (estimate 2 min, 1.50x)"
    # no evaluation measured yet: both take the overall pace, 1.5 x 50 each
    assert clock.pace() == 1.5 and clock.left() == 150.0
    assert clock.status() == "study 2 min in, ~2 min left (1 of 4 steps done; pace 1.50x the estimate)"
    now[0] = 175.0
    assert clock.finished(1, 25.0) == "done in 25 s (estimate 50 s, 0.50x)"
    # evaluations now have their own pace, 25 / 50: the last one is 25 s; the overall pace is 175 / 150
    assert clock.pace("evaluate") == 0.5 and clock.left() == 25.0
    assert clock.pace() == pytest.approx(175 / 150)
    clock.skipped(2)  # found finished in the store: no time left for it
    assert clock.left() == 0.0 and clock.status().startswith("study 3 min in, ~0 s left (3 of 4 steps done")


def test_busy_note_exactly_when_load_exceeds_the_cores():
    assert busy_note(2, lambda: (3.6, 1.0, 1.0)) == (
        "machine busy: load 3.6 on 2 cores, ETA follows the measured pace")
    assert busy_note(2, lambda: (2.0, 9.0, 9.0)) == ""  # equal is not over; only the 1-minute average counts
    assert busy_note(1, lambda: (1.05, 0, 0)) == "machine busy: load 1.1 on 1 core, ETA follows the measured pace"
    clock = StudyClock([{"stage": "pretrain", "estimate_s": 60.0}], clock=lambda: 0.0, load=lambda: (3.6, 0, 0),
                       cores=2)
    assert clock.status() == ("study 0 s in, ~1 min left (0 of 1 steps done; no step timed yet); machine busy: "
                              "load 3.6 on 2 cores, ETA follows the measured pace")


@pytest.mark.parametrize("load, note", [((3.6, 0, 0), "; machine busy: load 3.6 on 2 cores, ETA follows the "
                                                     "measured pace"), ((1.9, 0, 0), "")])
def test_training_line_says_busy_with_the_measured_eta(load, note, capsys):
    bar = StepProgressBar(clock=lambda: 100.0, load=lambda: load)
    bar._start, bar._cores = (0.0, 0), 2  # 100 s since the fit began at step 0: 50 steps a 2 s
    bar._write_line(50, 200, {})
    # the ETA is the measured pace: 150 steps left x 2 s
    assert capsys.readouterr().err == f"train 50/200 (25%) 01:40 elapsed, ETA 05:00{note}\n"


def test_durations_in_words():
    assert [duration(s) for s in (44.6, 60, 14 * 60 + 20, 80 * 60, 3 * 3600 + 59 * 60 + 40)] == [
        "45 s", "1 min", "14 min", "1 h 20 min", "4 h 0 min"]


def test_plan_totals_split_finished_from_remaining():
    steps = [{"estimate_s": 100.0, "finished": "done under this file's pipeline run abc"},
             {"estimate_s": 30.0, "finished": ""}, {"estimate_s": None, "finished": ""}]
    totals = estimate.total(steps)
    assert totals == {"estimate_s": 130.0, "remaining_s": 30.0, "finished_steps": 1, "unestimated": 1,
                      "step_count": 3}
    assert estimate.total_line(totals).endswith("1 finished in the store, ~30 s left; 1 steps without an estimate "
                                                "(models made elsewhere)")
