"""The command line as a user meets it: stdout is exactly the JSON result, stderr carries progress and no
third-party chatter, MLflow telemetry is off, and mistakes fail fast with a useful line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nope_lightning import cli
from nope_lightning.config import TrainerConfig
from nope_lightning.stages.registry import STAGES
from tests.conftest import REPO

# Variables under which MLflow turns its telemetry off by itself; removed so the tests see our setting.
CI_VARIABLES = ("PYTEST_CURRENT_TEST", "GITHUB_ACTIONS", "CI", "CIRCLECI", "GITLAB_CI", "JENKINS_URL", "TRAVIS",
                "TF_BUILD", "BITBUCKET_BUILD_NUMBER", "CODEBUILD_BUILD_ARN", "BUILDKITE", "TEAMCITY_VERSION")
CHATTER = ("Warning", "warn(", "GPU available", "TPU available", "litlogger", "Downloading artifacts",
           "Creating initial MLflow")


def user_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a user's shell: no CI markers, MLflow's config folder inside ``tmp_path``."""
    env = {k: v for k, v in os.environ.items() if k not in CI_VARIABLES and not k.startswith(("MLFLOW_", "TQDM_"))}
    return {**env, "XDG_CONFIG_HOME": str(tmp_path / "config"), "DO_NOT_TRACK": "false"}


def test_tiny_pipeline_stdout_is_the_json_result_and_stderr_is_clean(tmp_path, data_cache):
    args = [sys.executable, "-m", "nope_lightning.cli", "run", "pipeline", str(REPO / "experiments/tiny/tiny.yaml"),
            f"tracking.uri=sqlite:///{tmp_path}/mlflow.db", f"tracking.artifact_root={tmp_path}/artifacts",
            f"common=[trainer.progress_bar=false,data.cache_dir={data_cache}]"]
    proc = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=900, env=user_env(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]

    # The whole of stdout, nothing before or after it, strict JSON (no NaN/Infinity).
    result = json.loads(proc.stdout, parse_constant=lambda constant: pytest.fail(f"stdout holds {constant}"))
    assert result["steps"] == 7 and len(result["run_id"]) == 32

    lines = proc.stderr.splitlines()
    assert [line for line in lines if any(word in line for word in CHATTER)] == []
    assert "\r" not in proc.stderr  # no tqdm bar in a log, so no line glued to one
    steps = [line for line in lines if line.startswith("pipeline [")]
    assert len(steps) == 14 and all(("running" in s) != ("done in" in s) for s in steps)
    assert not (tmp_path / "config/mlflow").exists()  # MLflow wrote no telemetry installation id


def _telemetry_disabled(env: dict[str, str], install: bool) -> bool:
    code = ("from nope_lightning.runtime import quiet\n" + ("quiet.install()\n" if install else "")
            + "from mlflow.telemetry.utils import is_telemetry_disabled\nprint(is_telemetry_disabled())")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip() == "True"


def test_mlflow_telemetry_is_off_by_default_and_can_be_turned_on(tmp_path):
    env = user_env(tmp_path)
    assert not _telemetry_disabled(env, install=False)  # the installed MLflow would report usage
    assert _telemetry_disabled(env, install=True)
    assert not _telemetry_disabled({**env, "MLFLOW_DISABLE_TELEMETRY": "false"}, install=True)  # user's choice wins


def test_training_progress_is_plain_step_lines_on_stderr(capfd):
    from lightning.pytorch import LightningModule

    from nope_lightning.training.trainer import build_trainer

    class Tiny(LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, _):
            loss = self.layer(batch).pow(2).mean()
            self.log("train/loss", loss, prog_bar=True)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self):
            return torch.utils.data.DataLoader(torch.randn(64, 4), batch_size=2)

    trainer = build_trainer(TrainerConfig(max_steps=20, accelerator="cpu", threads=1, val_every_n_steps=0,
                                          progress_bar=True),
                            enable_checkpointing=False)
    trainer.fit(Tiny())
    out, err = capfd.readouterr()
    assert out == ""
    lines = [line for line in err.splitlines() if line.startswith("train ")]
    assert [line.split()[1] for line in lines] == [f"{step}/20" for step in range(2, 21, 2)]
    assert all("ETA" in line and "train/loss=" in line for line in lines)
    assert "Epoch" not in err and "v_num" not in err and "\r" not in err


def test_stages_are_listed_in_two_aligned_columns(capsys):
    assert cli.main(["stages"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == list(STAGES)
    column = {len(line) - len(line[len(line.split()[0]):].lstrip()) for line in lines}
    assert len(column) == 1


def test_help_is_plain_text(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert exit_info.value.code == 0 and "nope-lightning run pipeline experiments/regime_study/regime_study.yaml" in out
    assert "``" not in out


def test_mistyped_stage_gets_a_suggestion(capsys):
    assert cli.main(["run", "pretrian"]) == 2
    err = capsys.readouterr().err
    assert "unknown stage 'pretrian'; did you mean 'pretrain'?" in err and err.count("\n") == 1


def test_early_failures_and_config_import_no_torch():
    code = ("import sys\nfrom nope_lightning import cli\n"
            "assert cli.main(['run', 'nosuchstage']) == 2\n"
            "assert cli.main(['config', 'pretrain', 'model.pos_encoding=xpos']) == 2\n"
            "assert cli.main(['config', 'pretrain']) == 0\n"
            "print(sorted(m for m in ('torch', 'lightning', 'mlflow') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "[]"


def test_a_study_folder_or_a_grid_config_given_to_run_pipeline_names_what_to_use(capsys):
    assert cli.main(["run", "pipeline", "experiments/regime_study"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "experiments/regime_study/regime_study.yaml" in err
    assert cli.main(["run", "pipeline", "conf/synthetic-grid/cpu.yaml"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "nope-lightning run synthetic-grid conf/synthetic-grid/cpu.yaml" in err


def test_studies_lists_every_study_folder_with_its_files_seeds_and_status(capsys):
    assert cli.main(["studies"]) == 0
    out = capsys.readouterr().out
    folders = sorted(p.name for p in (REPO / "experiments").iterdir() if p.is_dir())
    assert [line.split()[0] for line in out.split("\n\n")] == folders
    assert "regime_study  [results + bundle, seeds 8]  833.8 min" in out
    assert "experiments/regime_study/regime_study.yaml  seeds: 1234, 2345, 3456, 4567" in out
    assert "experiments/regime_study/regime_study_s5678.yaml  seeds: 5678" in out
    assert "tiny  [no results, seeds —]" in out
