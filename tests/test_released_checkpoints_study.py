"""The study ``experiments/released_checkpoints``: paper 001's tables on its released checkpoints.

Its dry run, on tiny stand-in Llama folders built by transformers (L = 2,048, as TinyLlama's), plans every
step at the lengths and token budgets its README costs; the optional benchmarks follow the environment; the
training steps run the paper's recipe in micro-batches of the measured size; and the dry run reads a Hugging
Face folder's shape from its config.json, refusing a missing folder in one line."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import yaml

from nope_lightning.pipeline.steps import expand, step_config
from nope_lightning.stages.registry import run_stage, stage_config
from tests.conftest import REPO
from tests.helpers import tiny_llama_folder

FILE = REPO / "experiments/released_checkpoints/released_checkpoints.yaml"
#: The checkpoints' variables, each with its stand-in's HeadScale ``scale_param`` (None: a plain model).
MODELS = {"NOPE_1B": None, "HEADSCALE_8K": [[1.5, 1.2, 1.1, 1.0], [1.3, 1.0, 1.6, 1.2]], "ROPE_1B": None}
BENCHMARKS = ("HARNESS_TASKS", "LONGBENCH_FILES", "LONGBENCH_CONFIG")
LENGTHS = [2048, 4096, 8192, 16384]
FINETUNES = [f"finetune_{method}_{multiple}_{budget}" for method in ("pi", "yarn")
             for multiple in ("2x", "4x") for budget in ("fair", "raw")]


@pytest.fixture(scope="module")
def environment(tmp_path_factory) -> dict[str, str]:
    """The file's variables: stand-in checkpoint folders and tiny corpus folders, the data cache in a
    temporary folder (the tracking store goes beside it, ``store``)."""
    root = tmp_path_factory.mktemp("released")
    env = {"NOPE_LIGHTNING_CACHE": str(root / "cache")}
    for key, scales in MODELS.items():
        tiny_llama_folder(root / key, max_positions=2048, scale_param=scales)
        env[key] = str(root / key)
    for key in ("CORPUS", "PG19", "PROOFPILE"):
        (root / key).mkdir()
        (root / key / "book.txt").write_text("the grass is green and the sky is blue. " * 50)
        env[key] = str(root / key)
    return env


def store(env: dict[str, str]) -> list[str]:
    """Tracking overrides for a store beside the cache (never the repository's ``mlruns/``)."""
    root = Path(env["NOPE_LIGHTNING_CACHE"]).parent
    return [f"tracking.uri=sqlite:///{root}/mlflow.db", f"tracking.artifact_root={root}/artifacts"]


@contextlib.contextmanager
def with_environment(env: dict[str, str], **changes: str | None):
    """``env`` updated by ``changes`` (None: unset); the optional benchmarks unset unless changed."""
    with pytest.MonkeyPatch.context() as patch:
        for key, value in {**env, **dict.fromkeys(BENCHMARKS), **changes}.items():
            if value is None:
                patch.delenv(key, raising=False)
            else:
                patch.setenv(key, value)
        yield


def dry_run(env: dict[str, str], path: Path = FILE, **changes: str | None) -> dict:
    with with_environment(env, **changes):
        return run_stage("pipeline", stage_config("pipeline", str(path), [*store(env), "dry_run=true"]))


def resolved(env: dict[str, str], step_id: str, **changes: str | None):
    """``step_id``'s stage config as the run resolves it, the earlier steps' results stand-ins."""
    cfg = stage_config("pipeline", str(FILE))
    results = {f"import_{name}": {"checkpoint": f"/export/{name}"} for name in ("nope", "rope", "headscale")}
    results["search_nope"] = {"run_id": "s0"}
    instance = next(i for i in expand(cfg) if i.id == step_id)
    with with_environment(env, **changes):
        return step_config(instance, cfg, results, "parent")


@pytest.fixture(scope="module")
def plan(environment) -> dict[str, dict]:
    return {step["id"]: step for step in dry_run(environment)["steps"]}


def test_the_plan_has_the_papers_rows_at_its_lengths_and_budgets(plan, environment):
    assert list(plan) == [
        "import_nope", "import_headscale", "import_rope", "eval_nope", "search_nope", "eval_nope_search_2x",
        "eval_nope_search_4x", "eval_nope_search_8x", "eval_nope_12", "eval_nope_15", "eval_nope_18",
        "headscale_4x", "eval_headscale_4x", "eval_headscale_4x_released", "eval_rope", "eval_rope_ntk",
        "eval_rope_yarn", *[step for tune in FINETUNES for step in (tune, tune.replace("finetune", "eval"))]]
    assert all(not step["problems"] and not step["notes"] for step in plan.values())
    # Each import reads its folder's config.json: the size, L = max_position_embeddings, 16 L positions.
    for step, key, encoding in [("import_nope", "NOPE_1B", "nope"), ("import_rope", "ROPE_1B", "rope"),
                                ("import_headscale", "HEADSCALE_8K", "nope")]:
        assert plan[step]["model"] == {"from": step, "pos_encoding": encoding, "train_len": 2048,
                                       "size": "2 layers x 64, 4 heads", "max_positions": 32768,
                                       "source": environment[key]}
    evaluations = [step for step in plan.values() if step["stage"] == "evaluate"]
    assert len(evaluations) == 20
    for step in evaluations:  # Table 2's 1x-8x, passkey (Fig 9) at each, no generation past 16K + 8 tokens
        assert step["lengths"] == {"eval": LENGTHS, "passkey": LENGTHS, "max_new_tokens": 8,
                                   "longctx_new_tokens": 0}
    assert plan["search_nope"]["lengths"] == {"targets": [4096, 8192, 16384]}
    assert plan["headscale_4x"]["lengths"] == {"target_len": 8192}
    assert plan["headscale_4x"]["training_tokens"] == 200 * 8 * 8192  # 13.1 M, the paper's 13M at 8K
    for tune in FINETUNES:
        length = 4096 if "_2x_" in tune else 8192
        assert plan[tune]["lengths"] == {"target_len": length}
        assert plan[tune]["training_tokens"] == 200 * 8 * length * (5 if tune.endswith("raw") else 1)
    assert sum(step["training_tokens"] for step in plan.values()) == 249_036_800  # the README's 249 M
    # Selection and tuning read CORPUS (its validation and train splits); evaluation the test folders.
    for step in ("search_nope", "headscale_4x", *FINETUNES):
        assert plan[step]["data"]["corpus"] == environment["CORPUS"]


def test_every_model_comes_from_a_folder_the_environment_names(plan):
    """Every evaluation, search and tuning reads an imported folder, or a fine-tune of the RoPE one."""
    imported = {"import_nope": "nope", "import_headscale": "nope", "import_rope": "rope"}
    for step in plan.values():
        if step["stage"] == "import":
            continue
        origin = step["model"]["from"]
        base = plan[origin]["model"]["from"] if origin in FINETUNES else origin
        assert step["model"]["pos_encoding"] == imported[base]
    assert plan["eval_headscale_4x_released"]["model"]["from"] == "import_headscale"
    assert {plan[tune]["model"]["from"] for tune in FINETUNES} == {"import_rope"}
    assert {plan[tune.replace("finetune", "eval")]["model"]["from"] for tune in FINETUNES} == set(FINETUNES)


def test_the_benchmarks_follow_the_environment(environment):
    unset = resolved(environment, "eval_nope")
    assert (unset.harness_tasks, unset.longbench_files, unset.longbench_config) == ([], [], "")
    given = resolved(environment, "eval_nope", HARNESS_TASKS="[arc_easy,piqa,winogrande]",
                     LONGBENCH_FILES="[/lb/data/hotpotqa.jsonl]", LONGBENCH_CONFIG="/lb/config")
    assert given.harness_tasks == ["arc_easy", "piqa", "winogrande"]
    assert (given.longbench_files, given.longbench_config, given.longbench_max_length) == (
        ["/lb/data/hotpotqa.jsonl"], "/lb/config", 7500)
    # Table 1 on the NoPE and RoPE models; Table 3 on the rows extended to 8K and their baselines.
    texts = {step.id: " ".join(step.overrides) for step in stage_config("pipeline", str(FILE)).steps}
    assert [step for step, text in texts.items() if "HARNESS_TASKS" in text] == ["eval_nope", "eval_rope"]
    assert [step for step, text in texts.items() if "LONGBENCH_FILES" in text] == [
        "eval_nope", "eval_nope_search_4x", "eval_headscale_4x", "eval_headscale_4x_released", "eval_rope",
        "eval_rope_ntk", "eval_rope_yarn", "eval_pi_4x_fair", "eval_yarn_4x_fair"]


def test_training_runs_the_papers_recipe_on_one_gpu(environment):
    headscale = resolved(environment, "headscale_4x")
    assert (headscale.steps, headscale.optim.lr, headscale.init, headscale.scale_search) == (
        200, 0.1, "search", "s0")
    tunes = [resolved(environment, step) for step in ("finetune_pi_2x_fair", "finetune_yarn_4x_raw")]
    assert [(cfg.rope_scaling.method, cfg.budget, cfg.total_steps, cfg.optim.lr) for cfg in tunes] == [
        ("pi", "fair", 200, 1e-4), ("yarn", "raw", 1000, 1e-4)]
    for cfg in (headscale, *tunes):
        trainer = cfg.trainer
        assert (cfg.data_mix, trainer.precision, trainer.devices, trainer.strategy) == (
            "text", "bf16-mixed", 1, "fsdp2")
        assert trainer.compile and cfg.optim.fused
        # 16,384 tokens a micro-batch (the step measured on the H200), the paper's 8 sequences a step
        assert cfg.batch_size * cfg.target_len == 16384
        assert cfg.batch_size * trainer.accumulate_grad_batches == 8


def test_the_dry_run_reads_a_hugging_face_folder_and_refuses_a_missing_one(environment, tmp_path):
    path = tmp_path / "direct.yaml"
    path.write_text(yaml.safe_dump({"name": "direct", "steps": [
        {"id": f"eval_{encoding}", "stage": "evaluate",
         "overrides": [f"checkpoint={encoding}:${{oc.env:{key}}}", "eval_lengths=[64]"]}
        for encoding, key in (("nope", "NOPE_1B"), ("rope", "ROPE_1B"))]}))
    steps = {step["id"]: step for step in dry_run(environment, path)["steps"]}
    for encoding, key in (("nope", "NOPE_1B"), ("rope", "ROPE_1B")):
        step = steps[f"eval_{encoding}"]
        assert step["model"] == {"from": f"{encoding}:{environment[key]}", "pos_encoding": encoding,
                                 "size": "2 layers x 64, 4 heads", "train_len": 2048, "max_positions": 32768}
        assert step["notes"] == []  # read, not "unchecked"
    missing = tmp_path / "not_downloaded"
    for file, step in ((path, "eval_nope"), (FILE, "import_nope")):
        with pytest.raises(ValueError, match="problem") as err:
            dry_run(environment, file, NOPE_1B=str(missing))
        # one line, for the step naming the folder: the steps after it are not blamed for it
        assert str(err.value).splitlines()[1:] == [
            f"step {step}: {missing}: no such folder; download the model there first (huggingface-cli "
            f"download <repo> --local-dir {missing}) or point the variable at its folder"]
