"""A step's typed inputs (``model:``, ``temperature: {search, at, fit, headscale}``) name earlier steps by id: they
resolve to the stage configs, step hashes and dry-run plans the text references (``@{step.run_id}``) gave; the
dry run reads them, not placeholder text; a link the steps cannot make fails the dry run in one line naming the
step and the fix; a parent run logged with the text form is the typed file's parent."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
import yaml

from nope_lightning.config.core import to_dict
from nope_lightning.pipeline import dry_run, store
from nope_lightning.pipeline.inputs import as_inputs, input_key
from nope_lightning.pipeline.steps import expand, pipeline_hash, step_config, step_hash
from nope_lightning.runtime import tracking
from nope_lightning.stages.headscale import PARAMETERIZATIONS
from nope_lightning.stages.registry import run_stage, stage_config
from tests.test_golden_step_hashes import FakeResults

TINY = "conf/pretrain/tiny.yaml"
HEADSCALE = "conf/headscale/tiny.yaml"
#: ``(typed step, the text references it stands for)``: every input, every table a HeadScale step learns, every
#: stage that takes one; the text form writes its references first, as a file converted to typed inputs did.
STEPS = [
    ({"id": "pretrain_nope", "stage": "pretrain", "config": TINY}, []),
    ({"id": "pretrain_rope", "stage": "pretrain", "config": TINY, "overrides": ["model.pos_encoding=rope"]}, []),
    ({"id": "search_nope", "stage": "scale-search", "model": "pretrain_nope",
      "overrides": ["target_lengths=[128,256]", "grid=[1.0,1.5]"]}, ["checkpoint=runs:/@{pretrain_nope.run_id}/model"]),
    ({"id": "headscale", "stage": "headscale", "config": HEADSCALE, "model": "pretrain_nope",
      "temperature": {"search": "search_nope"}, "overrides": ["init=search"]},
     ["checkpoint=runs:/@{pretrain_nope.run_id}/model", "scale_search=@{search_nope.run_id}"]),
    ({"id": "headscale_log", "stage": "headscale", "config": HEADSCALE, "model": "pretrain_nope",
      "overrides": ["parameterization=log"]}, ["checkpoint=runs:/@{pretrain_nope.run_id}/model"]),
    ({"id": "headscale_past", "stage": "headscale", "config": HEADSCALE, "model": "pretrain_nope",
      "overrides": ["parameterization=lambda_past"]}, ["checkpoint=runs:/@{pretrain_nope.run_id}/model"]),
    ({"id": "headscale_search", "stage": "headscale-search", "model": "pretrain_nope",
      "temperature": {"search": "search_nope"}, "overrides": ["base.target_len=128", "num_trials=2"]},
     ["base.checkpoint=runs:/@{pretrain_nope.run_id}/model", "base.scale_search=@{search_nope.run_id}"]),
    ({"id": "eval_best", "stage": "evaluate", "model": "pretrain_nope",
      "temperature": {"search": "search_nope", "at": 256}, "overrides": ["eval_lengths=[64,256]"]},
     ["checkpoint=runs:/@{pretrain_nope.run_id}/model", "extension.temperature.uniform_search=@{search_nope.run_id}",
      "extension.temperature.uniform_search_len=256"]),
    ({"id": "eval_fit", "stage": "evaluate", "model": "pretrain_nope", "temperature": {"fit": "search_nope"},
      "overrides": ["eval_lengths=[64,256]"]},
     ["checkpoint=runs:/@{pretrain_nope.run_id}/model", "extension.temperature.log_slope_fit=@{search_nope.run_id}"]),
    ({"id": "eval_table", "stage": "evaluate", "model": "pretrain_nope",
      "temperature": {"headscale": "headscale", "search": "search_nope", "at": 128},
      "overrides": ["eval_lengths=[64,128]"]},
     ["checkpoint=runs:/@{pretrain_nope.run_id}/model", "extension.temperature.uniform_search=@{search_nope.run_id}",
      "extension.temperature.uniform_search_len=128",
      "extension.temperature.table=runs:/@{headscale.run_id}/headscale/lambda.safetensors"]),
    ({"id": "eval_log", "stage": "evaluate", "model": "pretrain_nope", "temperature": {"headscale": "headscale_log"},
      "overrides": ["eval_lengths=[64,128]"]},
     ["checkpoint=runs:/@{pretrain_nope.run_id}/model",
      "extension.temperature.log_slope_table=runs:/@{headscale_log.run_id}/headscale/log_scale.safetensors"]),
    ({"id": "eval_past", "stage": "evaluate", "model": "pretrain_nope", "temperature": {"headscale": "headscale_past"},
      "overrides": ["eval_lengths=[64,128]", "extension.temperature.past_only=true"]},
     ["checkpoint=runs:/@{pretrain_nope.run_id}/model",
      "extension.temperature.table=runs:/@{headscale_past.run_id}/headscale/lambda_past.safetensors"]),
    ({"id": "finetune", "stage": "finetune", "config": "conf/finetune/tiny.yaml", "model": "pretrain_rope"},
     ["checkpoint=runs:/@{pretrain_rope.run_id}/model"]),
    ({"id": "eval_finetune", "stage": "evaluate", "model": "finetune", "overrides": ["eval_lengths=[64,128]"]},
     ["checkpoint=runs:/@{finetune.run_id}/model"]),
    ({"id": "export", "stage": "export", "model": "pretrain_nope", "temperature": {"headscale": "headscale"},
      "overrides": ["out_dir=exported"]},
     ["checkpoint=runs:/@{pretrain_nope.run_id}/model",
      "extension.temperature.table=runs:/@{headscale.run_id}/headscale/lambda.safetensors"]),
]


def text_form(typed: dict, links: list[str]) -> dict:
    """The step as a file wrote it before typed inputs: its references first among its overrides."""
    step = {k: v for k, v in typed.items() if k not in ("model", "temperature")}
    return {**step, "overrides": [*links, *typed.get("overrides", [])]}


def write(tmp_path: Path, name: str, steps: list[dict], **fields) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "steps": steps, **fields}))
    return path


@pytest.fixture
def files(tmp_path) -> tuple[Path, Path]:
    """The typed file and its text twin, two seeds each."""
    return (write(tmp_path, "typed", [typed for typed, _ in STEPS], seeds=[1, 2]),
            write(tmp_path, "text", [text_form(*step) for step in STEPS], seeds=[1, 2]))


def configs(path: Path) -> dict[str, dict]:
    """``instance id -> resolved stage config`` of the file, earlier results standing in as the golden test's."""
    cfg = stage_config("pipeline", str(path))
    results: dict[str, FakeResults] = {}
    out = {}
    for instance in expand(cfg):
        out[instance.id] = step_config(instance, cfg, results, "parent")
        results[instance.id] = FakeResults(instance.id)
    return out


def test_typed_inputs_resolve_to_the_configs_and_hashes_the_text_form_gave(files):
    typed, text = configs(files[0]), configs(files[1])
    assert list(typed) == list(text) and len(typed) == 2 * len(STEPS)
    for instance in typed:
        assert to_dict(typed[instance]) == to_dict(text[instance]), instance
        assert step_hash(typed[instance]) == step_hash(text[instance])
    run = {step: FakeResults(f"{step}[seed=2]").run_id for step in ("pretrain_nope", "search_nope", "headscale",
                                                                     "headscale_log", "headscale_past", "finetune")}
    table = typed["eval_table[seed=2]"].extension.temperature
    assert (table.table, table.uniform_search, table.uniform_search_len) == (
        f"runs:/{run['headscale']}/headscale/lambda.safetensors", run["search_nope"], 128)
    assert typed["eval_log[seed=2]"].extension.temperature.log_slope_table == \
        f"runs:/{run['headscale_log']}/{PARAMETERIZATIONS['log'].table_file}"
    assert typed["eval_past[seed=2]"].extension.temperature.table == \
        f"runs:/{run['headscale_past']}/headscale/lambda_past.safetensors"
    assert typed["eval_fit[seed=2]"].extension.temperature.log_slope_fit == run["search_nope"]
    assert typed["eval_finetune[seed=2]"].checkpoint == f"runs:/{run['finetune']}/model"
    assert (typed["headscale_search[seed=2]"].base.checkpoint, typed["headscale_search[seed=2]"].base.scale_search) \
        == (f"runs:/{run['pretrain_nope']}/model", run["search_nope"])


def test_an_import_step_hands_over_its_export_folder():
    assert input_key("evaluate", "model") == "checkpoint" and input_key("headscale-search", "model") == \
        "base.checkpoint"
    steps = [{"id": "import_nope", "stage": "import", "overrides": ["source=hf", "out_dir=imported"]},
             {"id": "eval_nope", "stage": "evaluate", "model": "import_nope"}]
    cfg = stage_config("pipeline", None, ["name=x", f"steps={steps}"])
    first, second = expand(cfg)
    assert step_config(second, cfg, {first.id: {"checkpoint": "imported"}}, "parent").checkpoint == "imported"
    twin = dataclasses.replace(cfg.steps[1], model="", overrides=["checkpoint=@{import_nope.checkpoint}"])
    assert as_inputs(twin) == cfg.steps[1]


def test_the_pipeline_hash_counts_typed_inputs_as_the_text_they_stand_for(files):
    typed, text = (stage_config("pipeline", str(path)) for path in files)
    assert pipeline_hash(typed) == pipeline_hash(dataclasses.replace(text, name="typed"))
    assert [as_inputs(step) for step in text.steps] == typed.steps  # the text form read as typed inputs
    # A reference written after another override: another file's text, the same pipeline once read as typed inputs.
    moved = written_later(text)
    assert pipeline_hash(moved) != pipeline_hash(typed) and store.typed_hash(moved) == store.typed_hash(typed)


def written_later(text):
    """The text file (renamed ``typed``) with each step's first reference written last among its overrides."""
    return dataclasses.replace(text, name="typed", steps=[dataclasses.replace(
        s, overrides=[*s.overrides[1:], s.overrides[0]]) if s.overrides else s for s in text.steps])


def plan(path: Path, tmp_path: Path, monkeypatch) -> dict:
    """The dry run of ``path`` with an empty data cache, tracked in a temporary store."""
    monkeypatch.setenv("NOPE_LIGHTNING_CACHE", str(tmp_path / "cache"))
    return dry_run.plan(stage_config("pipeline", str(path), [f"tracking.uri=sqlite:///{tmp_path}/mlflow.db"]),
                        quiet=True)


def test_the_dry_run_reads_typed_inputs_as_it_read_the_text_form(files, tmp_path, monkeypatch):
    typed, text = (plan(path, tmp_path, monkeypatch) for path in files)
    assert typed["steps"] == text["steps"] and typed["problems"] == []
    entries = {entry["id"]: entry for entry in typed["steps"]}
    assert entries["eval_table[seed=1]"]["model"]["from"] == "pretrain_nope[seed=1]"
    assert entries["eval_finetune[seed=2]"]["model"]["from"] == "finetune[seed=2]"
    assert entries["headscale_search[seed=1]"]["lengths"] == {"target_len": 128}


def broken(tmp_path: Path, number: int, **changes) -> Path:
    """The typed file with step ``number``'s fields changed (None: the field removed)."""
    steps = [dict(typed) for typed, _ in STEPS]
    steps[number].update(changes)
    steps[number] = {k: v for k, v in steps[number].items() if v is not None}
    return write(tmp_path, "broken", steps)


@pytest.mark.parametrize("number, changes, expected", [
    (2, {"model": "pretrain_nop"}, "step search_nope: model: pretrain_nop: no step 'pretrain_nop' in this file; "
                                   "did you mean 'pretrain_nope'?"),
    (2, {"model": "eval_best"}, "step search_nope: model: eval_best refers to step 'eval_best', which runs later "
                                "(steps run in file order): move 'eval_best' before 'search_nope'"),
    (2, {"model": "search_nope"}, "step search_nope: model: search_nope refers to this step itself"),
    (7, {"model": "search_nope"}, "step eval_best: model: search_nope: step 'search_nope' runs scale-search, which "
                                  "makes no model; name a pretrain or finetune or import step"),
    (9, {"temperature": {"headscale": "search_nope"}},
     "step eval_table: temperature.headscale: search_nope: step 'search_nope' runs scale-search, which makes no "
     "temperature table; name a headscale step"),
    (1, {"model": "pretrain_nope"}, "step pretrain_rope: model: pretrain_nope: stage pretrain takes no model (it has "
                                    "no checkpoint); drop model"),
    (2, {"temperature": {"fit": "pretrain_nope"}},
     "step search_nope: temperature.fit: pretrain_nope: step 'pretrain_nope' runs pretrain, which makes no lambda "
     "fit; name a scale-search step"),
    (4, {"temperature": {"headscale": "headscale"}},
     "step headscale_log: temperature.headscale: headscale: stage headscale takes no temperature table (it has no "
     "extension.temperature.table); drop temperature.headscale"),
    (7, {"temperature": {"search": "search_nope"}},
     "step eval_best: temperature.search: search_nope: give temperature.at, the length (tokens) whose best lambda to "
     "apply, one of step 'search_nope''s target_lengths"),
    (3, {"temperature": {"search": "search_nope", "at": 128}},
     "step headscale: temperature.at=128: stage headscale starts from the search's lambda at its own target_len; "
     "drop temperature.at"),
    (8, {"temperature": {"at": 256}}, "step eval_fit: temperature.at=256 is the length (tokens) of a searched lambda: "
                                      "name the scale-search step too, temperature: {search: <step id>, at: 256}"),
    (7, {"overrides": ["checkpoint=runs:/@{pretrain_rope.run_id}/model"]},
     "step eval_best: model: pretrain_nope sets checkpoint, which the step's overrides set too; keep model and drop "
     "the override"),
    (7, {"temperature": {"search": "search_nope", "at": 512}},
     "step eval_best: temperature.at=512: step 'search_nope' searches target_lengths [128, 256]; name one of them"),
    (7, {"model": "pretrain_rope"},
     "step eval_best: temperature.search: step 'search_nope' searches the model step 'pretrain_nope' trains, this "
     "step evaluates the one step 'pretrain_rope' trains; the run refuses a lambda searched on another model"),
])
def test_a_bad_typed_input_fails_the_dry_run_in_one_line_naming_the_step_and_the_fix(
        number, changes, expected, tmp_path, monkeypatch):
    with pytest.raises(ValueError) as err:
        plan(broken(tmp_path, number, **changes), tmp_path, monkeypatch)
    lines = str(err.value).splitlines()[1:]
    assert len(lines) == 1 and lines[0].startswith(expected), lines


def test_an_input_of_a_step_that_skips_the_point_is_refused(tmp_path, monkeypatch):
    steps = [dict(STEPS[0][0], only={"n_layer": ["1"]}), STEPS[2][0]]
    with pytest.raises(ValueError) as err:
        plan(write(tmp_path, "grid", steps, matrix={"n_layer": [1, 2]}), tmp_path, monkeypatch)
    assert str(err.value).splitlines()[1] == (
        "step search_nope[n_layer=1]: model: pretrain_nope: step 'pretrain_nope' does not run at matrix point "
        "{'n_layer': '2'}, where 'search_nope' runs (its `only` is narrower)")


def test_a_step_reading_a_broken_step_is_not_blamed_for_it(tmp_path, monkeypatch):
    with pytest.raises(ValueError) as err:
        plan(broken(tmp_path, 3, overrides=["init=search", "target_len=4096"]), tmp_path, monkeypatch)
    assert [line.split(":")[0] for line in str(err.value).splitlines()[1:]] == ["step headscale"]


def test_a_parent_run_logged_with_text_references_is_the_typed_files_parent(files, tmp_path):
    """The same file before its references became typed inputs: its parent run resumes (no new parent, every
    finished step's records kept), though the position of its references gave it another ``pipeline_hash``."""
    where = [f"tracking.uri=sqlite:///{tmp_path}/store.db", f"tracking.artifact_root={tmp_path}/artifacts"]
    typed, text = (stage_config("pipeline", str(path), where) for path in files)
    text = written_later(text)
    parent = tracking.create_run(text.tracking, "pipeline", text.name, text)
    tracking.client(text.tracking).set_tag(parent, "pipeline_hash", pipeline_hash(text))
    assert pipeline_hash(typed) != pipeline_hash(text)
    assert store.find_parent(typed, pipeline_hash(typed)) == parent
    other = dataclasses.replace(typed, steps=typed.steps[:-1])  # another pipeline of the same name
    assert store.find_parent(other, pipeline_hash(other)) is None


def test_a_tiny_pipeline_hands_its_steps_the_text_forms_values(tmp_path, data_cache):
    """Run for real (tiny models, a few steps each): every step's recorded hash is the hash of its text twin's
    config, resolved with the results the run recorded; HeadScale's table reached the evaluation through its run."""
    steps = [STEPS[0][0], dict(STEPS[2][0], overrides=["target_lengths=[128]", "grid=[1.0,1.5]", "ppl_tokens=256"]),
             dict(STEPS[3][0], overrides=["init=search", "steps=2", "entropy_windows=0"]),
             dict(STEPS[9][0], temperature={"headscale": "headscale", "search": "search_nope", "at": 128},
                  overrides=["eval_lengths=[64,128]", "ppl_tokens=256", "passkey_keys=0", "longctx_samples=0"])]
    links = {typed["id"]: text for typed, text in STEPS}
    typed = write(tmp_path, "typed", steps, report=False)
    twin = write(tmp_path, "text", [text_form(step, links[step["id"]]) for step in steps], report=False)
    where = [f"tracking.uri=sqlite:///{tmp_path}/mlflow.db", f"tracking.artifact_root={tmp_path}/artifacts",
             f"common=[trainer.progress_bar=false,data.cache_dir={data_cache}]"]
    os.chdir(tmp_path)
    try:
        result = run_stage("pipeline", stage_config("pipeline", str(typed), where))
    finally:
        os.chdir(Path(__file__).parents[1])
    cfg = stage_config("pipeline", str(twin), where)
    records = tracking.step_records(cfg.tracking, result["run_id"])
    results = {step: record["result"] for step, record in records.items()}
    for instance in expand(cfg):
        assert records[instance.id]["hash"] == step_hash(step_config(instance, cfg, results, result["run_id"]))
    assert "test/len128/ppl" in results["eval_table"]
