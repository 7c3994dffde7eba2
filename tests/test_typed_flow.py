"""A study's steps hand each other typed values, never text: a searched lambda as a reference to its
scale-search (``extension.temperature.uniform_search``), checked against the evaluated model as HeadScale's
``init=search`` is; a replicate's seed as an int in a typed config layer."""

from __future__ import annotations

import dataclasses
import hashlib
import struct
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from nope_lightning.config.core import flatten, load_config, to_dict
from nope_lightning.config.parts import AttentionTemperature, TrackingConfig
from nope_lightning.config.stages import PretrainConfig
from nope_lightning.model.checkpoint import WEIGHTS
from nope_lightning.model.extension import BETA_UNITS, extension_label, resolve_temperature
from nope_lightning.pipeline.steps import (
    Instance,
    config_path,
    defaults,
    expand,
    reference_problems,
    searched_lambda_problem,
    step_config,
    step_hash,
    substitute,
)
from nope_lightning.results.search import ScaleSearchResult
from nope_lightning.stages.evaluate import applied_setting
from nope_lightning.stages.registry import get_stage, run_stage, stage_config
from tests.conftest import REPO

#: Best lambdas whose decimal text is long: the text route printed and parsed them back.
AWKWARD = [0.1 + 0.2, 1.2345678901234567, 2.0 / 3.0, 1.0 + 2.0 ** -52]


def export(folder: Path, weights: bytes) -> str:
    """A stand-in export folder: only its weights file matters (its sha256 identifies the model)."""
    folder.mkdir()
    (folder / WEIGHTS).write_bytes(weights)
    return hashlib.sha256(weights).hexdigest()


def search_file(path: Path, fingerprint: str, best: dict[int, float], units: str = "1/sqrt(head_size)") -> str:
    ScaleSearchResult(train_len=64, best=best, model_fingerprint=fingerprint, units=units).save(path)
    return str(path)


def bits(x: float) -> bytes:
    return struct.pack("<d", x)


@pytest.mark.parametrize("best", AWKWARD)
def test_the_searched_lambda_is_the_float_the_text_route_gave_bit_for_bit(best, tmp_path):
    fingerprint = export(tmp_path / "model", b"weights of model A")
    searched = search_file(tmp_path / "scale_search.json", fingerprint, {128: 9.0, 256: best})
    typed = resolve_temperature(AttentionTemperature(uniform_search=searched, uniform_search_len=256),
                                tmp_path / "model", TrackingConfig())
    # The old route: the search step's result substituted into the override as text, parsed by the config.
    step = stage_config("pipeline", None, ["name=x", "steps=[{id: e, stage: evaluate}]"]).steps[0]
    text = substitute("extension.temperature.uniform=@{search.scale_search/len256/best_lambda}",
                      Instance(step, None, ()), {"search": {"scale_search/len256/best_lambda": best}})
    parsed = stage_config("evaluate", None, ["checkpoint=x", text]).extension.temperature.uniform
    assert bits(typed.uniform) == bits(parsed) == bits(best)
    # Resolved: what a model config takes (no reference left).
    assert (typed.uniform_search, typed.uniform_search_len) == ("", 0)


def test_a_search_on_another_model_is_refused_in_one_line(tmp_path):
    other = export(tmp_path / "a", b"weights of model A")
    export(tmp_path / "b", b"weights of model B")
    searched = search_file(tmp_path / "scale_search.json", other, {256: 1.5})
    settings = AttentionTemperature(uniform_search=searched, uniform_search_len=256)
    with pytest.raises(ValueError) as err:
        resolve_temperature(settings, tmp_path / "b", TrackingConfig())
    assert str(err.value) == (f"extension.temperature.uniform_search={searched} was run on another model "
                              f"(fingerprint {other[:12]}, this checkpoint is "
                              f"{hashlib.sha256(b'weights of model B').hexdigest()[:12]}); run scale-search on "
                              f"this checkpoint")
    with pytest.raises(ValueError, match=r"has no result for target_len=512 \(it has \[256\]\)"):
        resolve_temperature(AttentionTemperature(uniform_search=searched, uniform_search_len=512), tmp_path / "a",
                            TrackingConfig())
    beta = search_file(tmp_path / "beta.json", other, {256: 0.1}, units=BETA_UNITS)
    with pytest.raises(ValueError, match="searched iRoPE's beta, not lambda"):
        resolve_temperature(AttentionTemperature(uniform_search=beta, uniform_search_len=256), tmp_path / "a",
                            TrackingConfig())


@pytest.mark.parametrize("overrides, message", [
    (["extension.temperature.uniform_search=abc"], r"give both \(and no uniform\), or neither"),
    (["extension.temperature.uniform_search_len=256"], r"give both \(and no uniform\), or neither"),
    (["extension.temperature.uniform_search=abc", "extension.temperature.uniform_search_len=-256"],
     "uniform_search_len=-256 is out of range"),
    (["extension.temperature.uniform_search=abc", "extension.temperature.uniform_search_len=256",
      "extension.temperature.uniform=1.5"], r"whose best lambda is extension.temperature.uniform: give both \(and "
                                            r"no uniform\), or neither"),
])
def test_the_typed_reference_is_validated_where_it_is_written(overrides, message):
    with pytest.raises(ValueError, match=message):
        stage_config("evaluate", None, ["checkpoint=x", *overrides])


def test_a_model_takes_its_lambda_resolved_and_past_only_accepts_a_searched_one():
    with pytest.raises(ValueError, match=r"model.temperature.uniform_search: a model takes the value itself \(model.temperature.uniform=<lambda>\)"):
        stage_config("pretrain", "conf/pretrain/tiny.yaml", ["model.temperature.uniform_search=abc",
                                                             "model.temperature.uniform_search_len=256"])
    cfg = stage_config("evaluate", None, ["checkpoint=x", "extension.temperature.uniform_search=abc",
                                          "extension.temperature.uniform_search_len=256",
                                          "extension.temperature.past_only=true"])
    assert extension_label(cfg.extension) == "lamsearch256-past"


def test_an_evaluation_names_the_lambda_its_search_resolved_to(tmp_path):
    """The run's params hold the search's id, not the lambda: the result's setting label carries it."""
    fingerprint = export(tmp_path / "model", b"weights of model A")
    searched = search_file(tmp_path / "scale_search.json", fingerprint, {256: 1.45, 512: 1.8})
    cfg = stage_config("evaluate", None, ["checkpoint=x", f"extension.temperature.uniform_search={searched}",
                                          "extension.temperature.uniform_search_len=512"])
    assert applied_setting(cfg, SimpleNamespace(folder=tmp_path / "model")) == "lamsearch512=1.8"
    plain = stage_config("evaluate", None, ["checkpoint=x", "extension.temperature.uniform=1.5"])
    assert applied_setting(plain, SimpleNamespace(folder=tmp_path / "model")) == "lam1.5"


def test_the_text_route_is_refused_in_one_line_naming_the_typed_one():
    assert searched_lambda_problem("extension.temperature.uniform=@{search_nope.scale_search/len512/best_lambda}") == [
        "extension.temperature.uniform=@{search_nope.scale_search/len512/best_lambda}: a searched lambda as text is "
        "not checked against the evaluated model; give the step temperature: {search: search_nope, at: 512}"]
    # A number, another result or another key is no searched lambda.
    assert searched_lambda_problem("extension.temperature.uniform=1.5") == []
    assert searched_lambda_problem("extension.temperature.uniform_search=@{search_nope.run_id}") == []
    assert searched_lambda_problem("extension.temperature.log_slope=@{search_nope.scale_search/fit_a}") == []
    cfg = stage_config("pipeline", None, ["name=x", "steps=[{id: s, stage: scale-search}, {id: e, stage: evaluate, "
                                          "overrides: ['extension.temperature.uniform=@{s.scale_search/len128/"
                                          "best_lambda}']}]"])
    assert [p.split(":")[0] for p in reference_problems(cfg)["e"]] == [
        "extension.temperature.uniform=@{s.scale_search/len128/best_lambda}"]


def test_the_dry_run_refuses_a_lambda_searched_on_another_model_of_the_file(tmp_path, tracking_overrides,
                                                                             monkeypatch):
    monkeypatch.setenv("NOPE_LIGHTNING_CACHE", str(tmp_path / "cache"))
    steps = [{"id": "pretrain_a", "stage": "pretrain", "config": "conf/pretrain/tiny.yaml", "label": "a"},
             {"id": "pretrain_b", "stage": "pretrain", "config": "conf/pretrain/tiny.yaml", "label": "b"},
             {"id": "search_a", "stage": "scale-search",
              "overrides": ["checkpoint=runs:/@{pretrain_a.run_id}/model", "target_lengths=[128]", "grid=[1.0,1.5]"]},
             {"id": "eval_b", "stage": "evaluate",
              "overrides": ["checkpoint=runs:/@{pretrain_b.run_id}/model", "eval_lengths=[64,128]",
                            "extension.temperature.uniform_search=@{search_a.run_id}",
                            "extension.temperature.uniform_search_len=128"]}]
    path = tmp_path / "other_model.yaml"
    path.write_text(yaml.safe_dump({"name": "other_model", "steps": steps}))
    with pytest.raises(ValueError) as err:
        run_stage("pipeline", stage_config("pipeline", str(path), [*tracking_overrides, "dry_run=true"]))
    assert str(err.value).splitlines()[1:] == [
        "step eval_b: extension.temperature.uniform_search: step 'search_a' searches the model step 'pretrain_a' "
        "trains, this step evaluates the one step 'pretrain_b' trains; the run refuses a lambda searched on "
        "another model: search this one"]


# --- a replicate's seed: a typed layer, an int from the file to the stage config -------------------------


def test_a_stage_takes_its_replicate_seed_as_a_typed_layer():
    assert get_stage("pretrain").seed_layer(1234) == {"seed": 1234}
    assert get_stage("synthetic-grid").seed_layer(1234) == {"seeds": [1234]}
    assert type(get_stage("pretrain").seed_layer(1234)["seed"]) is int
    assert get_stage("evaluate").seed == ""  # an evaluation keeps its own prompts in every replicate
    # Layers sit between the YAML and the overrides, in order: the last word is the overrides'.
    assert load_config(PretrainConfig, "conf/pretrain/tiny.yaml", layers=[["seed=3"], {"seed": 5}]).seed == 5
    assert load_config(PretrainConfig, "conf/pretrain/tiny.yaml", ["seed=7"], layers=[{"seed": 5}]).seed == 7


@pytest.mark.parametrize("path, stage, text", [("experiments/tiny/tiny.yaml", "pretrain", "seed=4321"),
                                               ("experiments/synthetic/synthetic_quick.yaml", "synthetic-grid",
                                                "seeds=[4321]")])
def test_a_replicates_seed_reaches_its_config_and_hash_as_the_text_route_gave(path, stage, text, tracking_overrides):
    """YAML <- common <- seed <- step overrides <- tracking, the seed an int, where it was the text ``text``."""
    cfg = stage_config("pipeline", str(REPO / path), [*tracking_overrides, "seeds=[4321]"])
    instance = next(i for i in expand(cfg) if i.step.stage == stage)
    typed = step_config(instance, cfg, {}, "parent")
    # The text route, one dotlist (as step_config built it before the typed layer).
    keys = set(flatten(defaults(get_stage(stage).config_class())))
    t, where = cfg.tracking, get_stage(stage).tracking
    tracked = [f"{where}.{k}={v}" for k, v in (("uri", t.uri), ("artifact_root", t.artifact_root),
                                               ("experiment", t.experiment), ("parent_run_id", "parent"))]
    tracked += [f"name={instance.step.label}{instance.key.suffix}"] if instance.step.label and "name" in keys else []
    old = stage_config(stage, config_path(instance.step.config), [
        *[o for o in cfg.common if o.split("=", 1)[0] in keys], text,
        *[substitute(o, instance, {}) for o in instance.step.overrides], *tracked])
    assert to_dict(typed) == to_dict(old) and step_hash(typed) == step_hash(old)
    seeds = [typed.seed] if stage == "pretrain" else typed.seeds
    assert seeds == [4321] and type(seeds[0]) is int


def test_a_step_that_sets_its_seed_keeps_it(tracking_overrides):
    cfg = stage_config("pipeline", str(REPO / "experiments/tiny/tiny.yaml"), [*tracking_overrides, "seeds=[4321]"])
    pretrain = next(i for i in expand(cfg) if i.step.stage == "pretrain")
    step = dataclasses.replace(pretrain.step, overrides=[*pretrain.step.overrides, "seed=99"])
    assert step_config(Instance(step, 4321, ()), cfg, {}, "parent").seed == 99
