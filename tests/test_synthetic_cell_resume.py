"""A synthetic cell stopped in training resumes from the checkpoint of its last validation and ends with the results of
a cell never stopped: the same training batches from the step it resumes at (across epoch boundaries, and under a
curriculum), the same validations, best weights and stopping rule, in the same MLflow run.

The stop is an exception raised from a callback at a chosen step, which leaves the checkpoints as a kill would; the
grid's real Ctrl-C and rerun are in ``test_synthetic_resume``.
"""

from __future__ import annotations

import hashlib
import warnings
from pathlib import Path

import pytest
from lightning.pytorch import Callback

from nope_lightning.config import load_config
from nope_lightning.config.synthetic import SyntheticConfig
from nope_lightning.runtime import stopping, tracking
from nope_lightning.stages import synthetic as stage
from nope_lightning.training.trainer import checkpoint_step, resume_note
from tests.conftest import REPO

TINY = REPO / "conf/synthetic/tiny.yaml"
# 8 batches an epoch (128 examples, batch 16), a validation every 4 steps: checkpoints at 4, 8, 12, ...; at this lr the
# validation exact match moves, so the best weights and the stopping rule (0.0625 = 1 of 16 examples, twice) decide.
RECIPE = ["trainer.max_steps=120", "trainer.val_every_n_steps=4", "optim.lr=1e-2", "log_model=false"]
RULE = ["stop_at=0.06", "stop_patience=2"]
RULE_CALLBACKS = stage.stopping_callbacks


class Stop(Exception):
    pass


class Record(Callback):
    """Each training batch's (step, digest of its ids); raises ``Stop`` after step ``stop_after``."""

    def __init__(self, stop_after: int | None = None) -> None:
        self.batches: dict[int, str] = {}
        self.stop_after = stop_after

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        self.batches[trainer.global_step] = hashlib.sha256(batch[0].numpy().tobytes()).hexdigest()[:12]

    def on_train_batch_end(self, trainer, *args) -> None:
        if trainer.global_step == self.stop_after:
            raise Stop


def run(cfg: SyntheticConfig, monkeypatch, checkpoints: Path, stop_after: int | None = None):
    """``train_and_evaluate`` with a ``Record``: (what it returned, the record)."""
    record = Record(stop_after)
    monkeypatch.setattr(stage, "stopping_callbacks", lambda *a: [*RULE_CALLBACKS(*a), record])
    return stage.train_and_evaluate(cfg, checkpoints), record


def outcome(cfg: SyntheticConfig, trained: stage.Trained) -> tuple:
    """Everything a cell reports but its run id and timings, the selected weights' digest, and its validations."""
    r = trained.result
    weights = hashlib.sha256(b"".join(v.numpy().tobytes() for _, v in sorted(trained.model.state_dict().items())))
    history = [(m.step, m.value) for m in
               tracking.client(cfg.tracking).get_metric_history(r.run_id, "val/id_acc")]
    return (r.best_step, r.best_val_acc, r.id_acc, r.ood_acc, r.steps, r.stopped_by_rule, r.ood_correct, r.buckets,
            weights.hexdigest(), sorted(history))


def tiny(tmp: Path, *more: str) -> SyntheticConfig:
    return load_config(SyntheticConfig, TINY, [*RECIPE, *more, f"tracking.uri=sqlite:///{tmp}/mlflow.db",
                                               f"tracking.artifact_root={tmp}/artifacts"])


@pytest.fixture
def cfg(tmp_path) -> SyntheticConfig:
    return tiny(tmp_path, *RULE)


@pytest.fixture(scope="module")
def never_stopped(tmp_path_factory) -> tuple[tuple, dict[int, str]]:
    """The cell trained once without a stop (into a checkpoint folder), its ``outcome`` and its batches."""
    tmp = tmp_path_factory.mktemp("never_stopped")
    cfg = tiny(tmp, *RULE)
    with pytest.MonkeyPatch.context() as monkeypatch:
        trained, record = run(cfg, monkeypatch, tmp / "cell")
    # what makes the comparison bite: the rule ends it, after the best weights moved past the first validation
    assert (trained.result.stopped_by_rule, trained.result.steps) == (True, 48)
    assert trained.result.best_step > 4
    return outcome(cfg, trained), record.batches


# 17: resumed at an epoch's start (16); 13: mid-epoch (12); 46: after the rule's first hit at 44, so its count comes
# from the checkpoint; 60: after the rule ended the fit at 48 (as a stop in the test would), the run is over.
@pytest.mark.parametrize("stop_after", [13, 17, 46, 60])
def test_a_cell_stopped_in_training_resumes_to_the_results_of_a_cell_never_stopped(cfg, monkeypatch, tmp_path,
                                                                                     never_stopped, stop_after):
    out = tmp_path / "cell"
    try:
        run(cfg, monkeypatch, out, stop_after)
    except Stop:
        pass
    resumed_at = checkpoint_step(out / "checkpoints" / "last.ckpt")
    assert resumed_at == min(stop_after // 4 * 4, 48)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trained, record = run(cfg, monkeypatch, out)
    assert not [w for w in caught if "resuming from a checkpoint" in str(w.message)]  # it is exact: no warning
    expected, batches = never_stopped
    assert outcome(cfg, trained) == expected
    assert record.batches == {step: h for step, h in batches.items() if step >= resumed_at}
    # one MLflow run, continued
    assert trained.result.run_id == (out / "mlflow_run_id").read_text()
    assert len(tracking.client(cfg.tracking).search_runs([tracking.experiment_id(cfg.tracking)])) == 1


def test_a_curriculum_resumes_with_the_same_batches(tmp_path, monkeypatch):
    cfg = tiny(tmp_path, "trainer.max_steps=40", "curriculum_steps=30")
    _, plain = run(cfg, monkeypatch, tmp_path / "plain")
    out = tmp_path / "cell"
    with pytest.raises(Stop):
        run(cfg, monkeypatch, out, stop_after=22)
    _, resumed = run(cfg, monkeypatch, out)
    assert resumed.batches == {step: h for step, h in plain.batches.items() if step >= 20}
    assert len(set(plain.batches.values())) == 40  # a stream worth comparing: no two batches alike


def test_the_synthetic_stage_resumes_a_stopped_run_from_its_own_folder_and_deletes_it_when_finished(
        cfg, monkeypatch, tmp_path, never_stopped):
    """The stage alone (``run``, no grid) trains into ``training_folder``: stopped, the same config resumes there, in
    the same MLflow run, to the results of a run never stopped, and the stop's line says so; finished, the folder is
    gone. Another config trains in another folder, so it is neither refused nor resumed from this one's."""
    record = Record(stop_after=13)
    monkeypatch.setattr(stage, "stopping_callbacks", lambda *a: [*RULE_CALLBACKS(*a), record])
    stopping.begin()
    with pytest.raises(Stop):
        stage.run(cfg)
    out = stage.training_folder(cfg)
    assert out.parent == tmp_path / "checkpoints" / "synthetic" and out.name.startswith(cfg.run_name + "-")
    assert stopping.STATE.out_dir == out and resume_note(out) == "resumes from its checkpoint at step 12"
    record.stop_after = None
    result = stage.run(cfg)
    assert not out.exists()
    expected, _ = never_stopped
    assert (result["best_step"], result["best_val_acc"], result["id_acc"], result["ood_acc"], result["steps"],
            result["stopped_by_rule"]) == expected[:6]
    assert len(tracking.client(cfg.tracking).search_runs([tracking.experiment_id(cfg.tracking)])) == 1
    other = tiny(tmp_path, *RULE, "optim.lr=5e-3")
    assert stage.training_folder(other).parent == out.parent and stage.training_folder(other) != out
    moved = tiny(tmp_path, *RULE, f"tracking.uri=sqlite:///{tmp_path}/other.db")  # tracking is not the config's work
    assert stage.training_folder(moved) == out
