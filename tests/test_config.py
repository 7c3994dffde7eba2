"""The config flow: defaults <- YAML <- overrides, validation before compute, and every shipped YAML loads."""

from __future__ import annotations

from pathlib import Path

import pytest

from nope_lightning.config import EvaluateConfig, PretrainConfig, load_config, to_yaml
from nope_lightning.stages.registry import STAGES, stage_config
from tests.conftest import REPO

#: Overrides a stage needs to validate without a real run (required fields).
REQUIRED = {
    "evaluate": ["checkpoint=x"],
    "scale-search": ["checkpoint=x", "target_lengths=[512]"],
    "headscale": ["checkpoint=x", "target_len=512", "init=default"],
    "headscale-search": ["base.checkpoint=x", "base.target_len=512", "base.init=default"],
    "finetune": ["checkpoint=x", "target_len=512"],
    "report": ["run=x"],
}


def test_precedence_defaults_yaml_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("train_len: 128\nmodel:\n  n_layer: 3\n")
    cfg = load_config(PretrainConfig, path, ["model.n_layer=5"])
    assert (cfg.train_len, cfg.model.n_layer, cfg.model.n_head) == (128, 5, 4)  # yaml, override, default


def test_resolved_config_round_trips_through_yaml(tmp_path):
    cfg = load_config(PretrainConfig, None, ["model.pos_encoding=rope", "model.rope_scaling.method=yarn",
                                             "model.rope_scaling.factor=4"])
    (tmp_path / "r.yaml").write_text(to_yaml(cfg))
    assert load_config(PretrainConfig, tmp_path / "r.yaml") == cfg


@pytest.mark.parametrize("override,message", [
    ("model.n_layers=2", "model.n_layers"),
    ("optim.lr=fast", "optim.lr"),
    ("trainer.precision=fp8", "trainer.precision='fp8' is not a valid choice"),
    ("optim.lr=-1", "optim.lr=-1.0 is out of range"),
    ("model.n_embd=130", "divisible by model.n_head"),
    ("model.rope_scaling.method=yarn", "applies to pos_encoding=rope only"),
    ("tracking.uri=file:./mlruns", "MLflow 3 refuses folder stores"),
])
def test_bad_values_name_their_key(override, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(")):
        load_config(PretrainConfig, None, [override])


def test_required_fields_and_lists_are_checked():
    with pytest.raises(ValueError, match="checkpoint= is required"):
        load_config(EvaluateConfig, None, [])
    with pytest.raises(ValueError, match="longctx_tasks"):
        load_config(EvaluateConfig, None, ["checkpoint=x", "longctx_tasks=[sudoku]"])


def shipped_yaml() -> list[Path]:
    return sorted([*REPO.glob("conf/*/*.yaml"), *REPO.glob("experiments/*/*.yaml")])


@pytest.mark.parametrize("path", shipped_yaml(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_shipped_yaml_loads(path):
    # experiments/ holds pipeline files only (a grid's config lives in conf/synthetic-grid/, its stage's folder)
    stage = "pipeline" if "experiments" in path.parts else path.parent.name
    assert stage in STAGES, f"{path}: no stage named {stage}"
    cfg = stage_config(stage, str(path), REQUIRED.get(stage, []))
    if stage == "pipeline":
        for step in cfg.steps:
            assert step.stage in STAGES, f"{path}: step {step.id} names unknown stage {step.stage}"
            if step.config:
                assert (REPO / step.config).is_file(), f"{path}: step {step.id} config {step.config} is missing"


def test_a_file_extends_another_its_lists_replace_the_base_and_cycles_are_one_line(tmp_path):
    from nope_lightning.config import PipelineConfig

    (tmp_path / "study").mkdir()
    base = tmp_path / "study" / "base.yaml"
    base.write_text("name: base\nseeds: [1, 2]\nclaims: [nope_breaks_past_L]\n"
                    "steps:\n  - {id: a, stage: evaluate, label: nope}\n")
    more = tmp_path / "study" / "more.yaml"
    more.write_text("extends: base.yaml\nname: more\nseeds: [3]\n")
    cfg = load_config(PipelineConfig, more, ["bootstrap=200"])
    assert (cfg.name, cfg.seeds, cfg.claims, [s.id for s in cfg.steps]) == ("more", [3], ["nope_breaks_past_L"], ["a"])
    assert cfg.bootstrap == 200  # overrides still come last
    flat = load_config(PipelineConfig, base, ["name=more", "seeds=[3]", "bootstrap=200"])
    assert cfg == flat  # the same resolved config as the base with the changes written out: the same identity
    base.write_text("extends: more.yaml\nname: base\n")
    with pytest.raises(ValueError, match="base.yaml: extends more.yaml, which leads back to base.yaml"):
        load_config(PipelineConfig, more)
    more.write_text("extends: gone.yaml\n")
    with pytest.raises(FileNotFoundError, match="gone.yaml \\(extended by .*more.yaml\\)"):
        load_config(PipelineConfig, more)
