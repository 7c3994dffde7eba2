"""Our MLflow experiment is marked as model training (MLflow 3's experiment kind), new or found without a kind;
a step's run that a stop left KILLED is continued by its rerun; a run names the machines that ran it."""

from __future__ import annotations

from mlflow.tracking import MlflowClient

from nope_lightning.config import TrackingConfig
from nope_lightning.runtime import tracking


def store(tmp_path, experiment: str = "nope_lightning") -> TrackingConfig:
    return TrackingConfig(uri=f"sqlite:///{tmp_path}/mlflow.db", artifact_root=str(tmp_path / "artifacts"),
                          experiment=experiment)


def kind(cfg: TrackingConfig, exp_id: str) -> str | None:
    return MlflowClient(tracking_uri=cfg.uri).get_experiment(exp_id).tags.get("mlflow.experimentKind")


def test_a_new_experiment_is_a_model_training_experiment(tmp_path):
    cfg = store(tmp_path)
    exp_id = tracking.experiment_id(cfg)
    assert kind(cfg, exp_id) == "custom_model_development"
    assert tracking.experiment_id(cfg) == exp_id


def test_an_existing_experiment_gets_the_kind_it_lacks_and_keeps_one_it_has(tmp_path):
    older, chosen = store(tmp_path, "older"), store(tmp_path, "chosen")
    tracking.client(older)  # the store's schema, as our processes create it
    mlflow_client = MlflowClient(tracking_uri=older.uri)
    older_id = mlflow_client.create_experiment("older")  # as a store made before the kind existed
    chosen_id = mlflow_client.create_experiment("chosen", tags={"mlflow.experimentKind": "genai_development"})
    assert kind(older, older_id) is None
    assert tracking.experiment_id(older) == older_id and kind(older, older_id) == "custom_model_development"
    assert tracking.experiment_id(chosen) == chosen_id and kind(chosen, chosen_id) == "genai_development"


def test_a_step_s_killed_run_is_continued_not_opened_again(tmp_path):
    """Under a pipeline run, a step run that a stop left KILLED is continued when the same step (stage and config)
    runs again: RUNNING, owned by this process, one row in the UI; a changed config, a FINISHED or FAILED run, or a
    run outside a pipeline gets a new run."""
    import dataclasses

    parent = tracking.create_run(store(tmp_path), "pipeline", "p", store(tmp_path))
    cfg = dataclasses.replace(store(tmp_path), parent_run_id=parent)
    config = store(tmp_path, "a step's resolved config")  # any config dataclass
    first = tracking.create_run(cfg, "evaluate", "eval", config)
    tracking.end_run(cfg, first, "KILLED")
    assert tracking.create_run(cfg, "evaluate", "eval", config) == first
    run = tracking.client(cfg).get_run(first)
    assert run.info.status == "RUNNING" and run.data.tags[tracking.OWNER_TAG] == tracking.owner()
    tracking.end_run(cfg, first, "KILLED")
    assert tracking.create_run(cfg, "evaluate", "eval", dataclasses.replace(config, experiment="b")) != first
    assert tracking.create_run(cfg, "scale-search", "eval", config) != first  # another stage
    tracking.end_run(cfg, first, "FAILED")
    assert tracking.create_run(cfg, "evaluate", "eval", config) != first
    alone = store(tmp_path)  # no pipeline: every run is its own
    killed = tracking.create_run(alone, "evaluate", "eval", config)
    tracking.end_run(alone, killed, "KILLED")
    assert tracking.create_run(alone, "evaluate", "eval", config) != killed


def test_a_run_names_every_machine_that_trained_it(tmp_path, monkeypatch):
    """A run records the machine it ran on (two CPUs can train different models from one config and seed); a run
    continued elsewhere adds the second machine once, whatever times it is continued there."""
    import dataclasses
    import os
    from pathlib import Path

    import torch

    from nope_lightning.runtime import owners

    here = owners.machine()
    # read independently: the torch build, its kernels' vector instructions, the threads and the cores
    assert f"torch {torch.__version__} ({torch.backends.cpu.get_cpu_capability()});" in here
    threads = torch.get_num_threads()
    assert f"; {threads} thread{'s' if threads > 1 else ''};" in here and f" x{os.cpu_count()};" in here
    if Path("/proc/cpuinfo").exists():
        family = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("cpu family"))
        assert f"(family {family.split(':')[1].strip()}, model " in here
    parent = tracking.create_run(store(tmp_path), "pipeline", "p", store(tmp_path))
    cfg = dataclasses.replace(store(tmp_path), parent_run_id=parent)
    run = tracking.create_run(cfg, "evaluate", "eval", store(tmp_path, "config"))

    def machines() -> str:
        return tracking.client(cfg).get_run(run).data.tags[tracking.MACHINE_TAG]

    assert machines() == here
    monkeypatch.setattr(tracking, "machine", lambda: "another machine")
    for _ in range(2):
        tracking.end_run(cfg, run, "KILLED")
        assert tracking.create_run(cfg, "evaluate", "eval", store(tmp_path, "config")) == run
        assert machines() == f"{here} | another machine"


def test_gpus_are_named_from_the_driver_s_listing_without_initialising_cuda(tmp_path, monkeypatch):
    import torch

    from nope_lightning.runtime import owners

    for bus, model in (("0000:01:00.0", "NVIDIA H200"), ("0000:02:00.0", "NVIDIA H200"), ("0000:03:00.0", "NVIDIA L4")):
        (tmp_path / bus).mkdir()
        (tmp_path / bus / "information").write_text(f"Model: \t\t {model}\nIRQ:   \t\t 42\n")
    assert owners._gpus(tmp_path) == "NVIDIA H200 x2, NVIDIA L4 x1"
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    assert owners._gpus(tmp_path / "absent") == "3 CUDA device(s)"  # no driver listing: the count alone
    owners.machine()
    assert not torch.cuda.is_initialized()
