"""The synthetic stage: MRR with ties, JSD, attended distance, decoding + scoring, tiny end-to-end runs, bad input."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

import pytest
import torch
import yaml
from mlflow.tracking import MlflowClient

from nope_lightning.analysis.synthetic.grid import (
    attended_distance_hist,
    attended_distances,
    jsd,
    min_head_jsd,
    mrr_with_ties,
)
from nope_lightning.config import load_config
from nope_lightning.config.synthetic import SyntheticConfig, SyntheticGridConfig
from nope_lightning.data.synthetic_batches import IGNORE, pad_batch
from nope_lightning.results import BucketAccuracy, SyntheticCell
from nope_lightning.stages import synthetic as stage
from nope_lightning.stages import synthetic_grid
from nope_lightning.stages.registry import run_stage, stage_config
from nope_lightning.synthetic import BOS, EOS, SEP, Example, Vocabulary, make_split
from nope_lightning.synthetic.scratchpad import ERROR_KINDS
from tests.conftest import REPO

TINY = REPO / "conf/synthetic/tiny.yaml"

# --- MRR ----------------------------------------------------------------------------------------------


def test_mrr_two_methods_tied_first_share_rank_one_and_a_half():
    mrr = mrr_with_ties({"nope": [1.0], "t5": [1.0], "rope": [0.5]})
    assert mrr["nope"] == mrr["t5"] == pytest.approx(1 / 1.5)
    assert mrr["rope"] == pytest.approx(1 / 3)


def test_mrr_over_queries_by_hand_and_independent_of_order():
    # q1: a=0.9 b=0.5 c=0.5 -> ranks 1, 2.5, 2.5; q2: all 0.1 -> ranks 2, 2, 2.
    scores = {"a": [0.9, 0.1], "b": [0.5, 0.1], "c": [0.5, 0.1]}
    expected = {"a": (1 + 1 / 2) / 2, "b": (1 / 2.5 + 1 / 2) / 2, "c": (1 / 2.5 + 1 / 2) / 2}
    assert mrr_with_ties(scores) == pytest.approx(expected)
    reordered = {name: scores[name] for name in ("c", "b", "a")}
    assert mrr_with_ties(reordered) == pytest.approx(expected)  # row order never breaks a tie


def test_mrr_rejects_nan_and_ragged_scores():
    with pytest.raises(ValueError, match="NaN"):
        mrr_with_ties({"a": [float("nan")], "b": [0.0]})
    with pytest.raises(ValueError):
        mrr_with_ties({"a": [0.1, 0.2], "b": [0.0]})


# --- JSD and attended distance --------------------------------------------------------------------------


def test_jsd_matches_a_hand_computation():
    p, q = torch.tensor([0.5, 0.5, 0.0]), torch.tensor([1.0, 0.0, 0.0])
    # m = (0.75, 0.25, 0): KL(p||m) = ln(4/3)/2, KL(q||m) = ln(4/3), JSD = their mean = 0.75 ln(4/3).
    assert float(jsd(p, q)) == pytest.approx(0.75 * math.log(4 / 3), rel=1e-6)
    assert float(jsd(q, p)) == pytest.approx(float(jsd(p, q)), rel=1e-6)
    assert float(jsd(p, p)) == pytest.approx(0.0, abs=1e-7)
    assert float(jsd(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0]))) == pytest.approx(math.log(2))


def test_jsd_is_bounded_by_ln2_and_symmetric_on_random_rows():
    gen = torch.Generator().manual_seed(0)
    p = torch.rand(64, 10, generator=gen).softmax(-1) ** 4
    q = torch.rand(64, 10, generator=gen).softmax(-1) ** 4
    p, q = p / p.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True)
    d = jsd(p, q)
    assert d.shape == (64,) and bool((d >= 0).all()) and bool((d <= math.log(2) + 1e-6).all())
    assert torch.allclose(d, jsd(q, p))


def causal_rows(*rows: list[float]) -> torch.Tensor:
    return torch.tensor(rows)


def test_min_head_jsd_searches_every_head_pair():
    uniform = causal_rows([1, 0, 0], [0.5, 0.5, 0], [1 / 3, 1 / 3, 1 / 3])
    local = causal_rows([1, 0, 0], [0, 1, 0], [0, 0, 1])
    first = causal_rows([1, 0, 0], [1, 0, 0], [1, 0, 0])
    probs = torch.stack([first, local])[None]  # (L=1, H=2, T, T)
    reference = torch.stack([local, uniform])[None]
    # Only PE head 1 vs NoPE head 0 matches (i > j: a pair the reference implementation never compared).
    assert min_head_jsd(probs, reference).tolist() == pytest.approx([0.0], abs=1e-7)
    assert float(min_head_jsd(first[None, None], uniform[None, None])[0]) == pytest.approx(
        float(jsd(first, uniform).mean()))


def test_attended_distance_on_a_hand_made_matrix():
    probs = causal_rows([1, 0, 0, 0], [0.2, 0.8, 0, 0], [0.7, 0.2, 0.1, 0], [0.1, 0.6, 0.2, 0.1])[None, None]
    # rows 1..3 attend most to 1, 0, 1: (1-1)/2 = 0, (2-0)/3 = 2/3, (3-1)/4 = 1/2.
    assert attended_distances(probs, 1).tolist() == pytest.approx([0.0, 2 / 3, 0.5])
    assert attended_distances(probs, 1, 3).tolist() == pytest.approx([0.0, 2 / 3])
    counts, edges = attended_distance_hist(probs, 1, bins=4)
    assert counts.tolist() == [1, 0, 2, 0] and edges.tolist() == [0.0, 0.25, 0.5, 0.75, 1.0]


# --- data, decoding and scoring -------------------------------------------------------------------------


def test_pad_batch_puts_the_loss_on_target_tokens_only():
    vocab = Vocabulary.for_task("copy")
    short = Example(prompt=["copy", ":", "a"], target=["a"], answer=["a"], length=1)
    long = Example(prompt=["copy", ":", "a", "b"], target=["a", "b"], answer=["a", "b"], length=2)
    ids, labels = pad_batch([vocab.encode(short), vocab.encode(long)], vocab.pad_id)
    assert ids.shape == (2, 9) and labels.shape == (2, 8)
    assert vocab.decode(ids[0]) == [BOS, "copy", ":", "a", SEP, "a", EOS, "<pad>", "<pad>"]
    ignore = IGNORE
    assert labels[0].tolist() == [ignore] * 4 + vocab.encode_tokens(["a", EOS]) + [ignore] * 2
    assert labels[1].tolist() == [ignore] * 5 + vocab.encode_tokens(["a", "b", EOS])


class CopyOracle(torch.nn.Module):
    """Logits (B, T, V) of a perfect copy model: after ``<sep>`` it repeats the symbols of ``copy : s...``."""

    def __init__(self, vocab: Vocabulary, padded: int = 128) -> None:
        super().__init__()
        self.sep, self.eos, self.padded = vocab.sep_id, vocab.eos_id, padded

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        B, T = ids.shape
        logits = torch.zeros(B, T, self.padded)
        logits[..., -1] = 1e-3  # a padded id must never win: decoding restricts the argmax to the vocab
        for row in range(B):
            sep = int((ids[row] == self.sep).nonzero()[0])
            for t in range(sep, T):
                k = t - sep  # output index: symbol k sits at position 3 + k (<bos> copy : s0 s1 ...)
                logits[row, t, int(ids[row, 3 + k]) if 3 + k < sep else self.eos] = 1.0
        return logits


def test_greedy_decode_on_right_padded_prompts_of_mixed_lengths():
    vocab = Vocabulary.for_task("copy")
    examples = make_split("copy", "test", n=6, seed=3, train_max_len=2, test_max_len=8)
    assert len({e.length for e in examples}) == 6
    prompts = [vocab.encode_prompt(e) for e in examples]
    generated = stage.greedy_decode(CopyOracle(vocab), prompts, max_new_tokens=9, eos_id=vocab.eos_id,
                                    pad_id=vocab.pad_id, vocab_size=len(vocab))
    assert [vocab.decode(g) for g in generated] == [[*e.target, EOS] for e in examples]
    assert all(stage.score(vocab, examples, generated))
    short = stage.greedy_decode(CopyOracle(vocab), prompts, max_new_tokens=2, eos_id=vocab.eos_id,
                                pad_id=vocab.pad_id, vocab_size=len(vocab))
    assert [len(g) for g in short] == [2] * 6  # the budget stops rows that have not ended


def test_exact_match_scoring_on_hand_made_predictions():
    vocab = Vocabulary.for_task("copy")
    example = Example(prompt=["copy", ":", "a", "b"], target=["a", "b"], answer=["a", "b"], length=2)
    predictions = {
        ("a", "b", EOS): True,
        ("a", "b"): True,  # the budget ran out right after the answer
        ("a", "b", EOS, "c", "<pad>"): True,  # whatever follows <eos> is ignored
        ("a", "c", EOS): False,
        ("a", "b", "b", EOS): False,
        ("a", EOS): False,
        ("x", SEP, "a", "b", EOS): False,  # a generated <sep> does not hide the wrong start
    }
    generated = [vocab.encode_tokens(tokens) for tokens in predictions]
    assert stage.score(vocab, [example] * len(predictions), generated) == list(predictions.values())


def test_scratchpad_errors_read_the_wrong_ood_outputs_only():
    """Of parity's full-scratchpad outputs: a right one and a wrong in-distribution one are not read; two wrong OOD
    ones, by hand, first go wrong in the remaining input at step 2 and in the answer after all 5 steps."""
    vocab = Vocabulary.for_task("parity")
    ood = make_split("parity", "test", 3, seed=0, scratchpad="full", train_max_len=4, test_max_len=5)
    short = make_split("parity", "train", 1, seed=0, scratchpad="full", train_max_len=2)
    flip = {"even": "odd", "odd": "even"}
    right, rem_wrong, answer_wrong = (list(e.target) for e in ood)
    cut = [i for i, t in enumerate(rem_wrong) if t == "<rem>"][1] + 1  # step 2's remaining input
    rem_wrong[cut] = "1" if rem_wrong[cut] == "0" else "0"
    answer_wrong[-1] = flip[answer_wrong[-1]]
    outputs = [right, rem_wrong, answer_wrong, ["<ans>", flip[short[0].answer[0]]]]
    generated = [vocab.encode_tokens([*tokens, EOS]) for tokens in outputs]
    examples = [*ood, *short]
    correct = stage.score(vocab, examples, generated)
    assert correct == [True, True, False, False]  # a wrong scratchpad may still end right
    found = stage.scratchpad_errors(vocab, examples, generated, correct, train_max=4, scratchpad="full")
    assert found == {"answer": [5]}
    correct[1] = False  # as if its answer were wrong too: read where its steps went wrong first
    found = stage.scratchpad_errors(vocab, examples, generated, correct, train_max=4, scratchpad="full")
    assert found == {"remaining_input": [2], "answer": [5]}
    assert stage.scratchpad_errors(vocab, examples, generated, [False] * 4, train_max=4, scratchpad="none") == {}


def test_bucket_accuracies_split_id_and_ood():
    examples = [Example([], [], [], length) for length in (1, 2, 2, 3, 4, 4)]
    correct = [True, True, False, True, False, False]
    buckets = stage.bucket_accuracies(examples, correct, train_max=2, width=2)
    assert buckets == [BucketAccuracy("1-2", "id", 3, pytest.approx(2 / 3)),
                       BucketAccuracy("3-4", "ood", 3, pytest.approx(1 / 3))]


# --- end to end ----------------------------------------------------------------------------------------


def test_tiny_run_logs_metrics_and_artifacts(tracking_overrides, tmp_path):
    cfg = load_config(SyntheticConfig, TINY, tracking_overrides)
    result = stage.run(cfg)
    assert 0.0 <= result["id_acc"] <= 1.0 and 0.0 <= result["ood_acc"] <= 1.0
    assert result["steps"] == 8 and result["best_step"] in (4, 8)
    buckets = {b["bucket"]: (b["split"], b["n"]) for b in result["buckets"]}
    assert buckets["5"] == buckets["6"] == ("ood", 8)  # the test set cycles through its lengths
    assert {buckets[str(n)][0] for n in range(1, 5)} == {"id"} and sum(n for _, n in buckets.values()) == 32
    client = MlflowClient(cfg.tracking.uri)
    run = client.get_run(result["run_id"])
    prefix = "synthetic/copy_repeat/nope"
    assert run.data.tags["stage"] == "synthetic" and run.data.params["pos_encoding"] == "nope"
    assert run.data.metrics[f"{prefix}/ood_acc"] == pytest.approx(result["ood_acc"])
    assert {f"{prefix}/id_acc", f"{prefix}/len1/acc", f"{prefix}/len6/acc", "val/id_acc"} <= set(run.data.metrics)
    assert len(client.get_metric_history(run.info.run_id, "val/id_acc")) == 2  # steps 4 and 8
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"results.json", "per_length_acc.png", "model.safetensors", "config.yaml"} <= artifacts
    logged = Path(client.download_artifacts(run.info.run_id, "results.json", str(tmp_path)))
    assert json.loads(logged.read_text())["ood_acc"] == result["ood_acc"]


def test_a_scratchpad_cell_records_where_each_wrong_ood_output_first_went_wrong(tracking_overrides):
    """A tiny parity cell with the full scratchpad (8 steps: it learns nothing): every wrong OOD output has one first
    error, so the kinds' steps count the zeros of ``ood_correct``; a cell without a scratchpad records none."""
    cfg = load_config(SyntheticConfig, TINY, [*tracking_overrides, "task=parity", "scratchpad=full",
                                              "model.max_positions=400", "log_model=false"])
    result = stage.run(cfg)
    cell = SyntheticCell.from_dict(json.loads(Path(MlflowClient(cfg.tracking.uri).download_artifacts(
        result["run_id"], "results.json", str(Path(cfg.tracking.artifact_root).parent))).read_text()), "cell")
    wrong = cell.ood_correct.count(False)
    assert wrong > 0 and sum(map(len, cell.scratchpad_errors.values())) == wrong
    assert set(cell.scratchpad_errors) <= set(ERROR_KINDS)
    assert all(1 <= s <= cell.test_max_len for steps in cell.scratchpad_errors.values() for s in steps)


def test_tiny_grid_nests_children_and_logs_the_aggregate(tracking_overrides, tmp_path):
    base = load_config(SyntheticConfig, TINY, [*tracking_overrides, "log_model=false"])
    cfg = SyntheticGridConfig(base=base, tasks=["copy_repeat"], pos_encodings=["nope", "alibi"], seeds=[0],
                              attention_examples_per_length=1, distance_bins=5)
    summary = synthetic_grid.run(cfg)
    client = MlflowClient(cfg.base.tracking.uri)
    parent = client.get_run(summary["parent_run_id"])
    assert parent.info.status == "FINISHED" and parent.data.tags["stage"] == "synthetic-grid"
    children = client.search_runs([parent.info.experiment_id],
                                  f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert sorted(c.data.params["pos_encoding"] for c in children) == ["alibi", "nope"]
    assert set(summary["mrr"]) == {"nope", "alibi"} and set(parent.data.metrics) >= {"mrr/nope", "mrr/alibi"}
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"ood_table.md", "ood_table.png", "results.json"} <= artifacts
    assert {a.path for a in client.list_artifacts(parent.info.run_id, "attention")} == {
        "attention/jsd_copy_repeat.png", "attention/jsd_by_layer_copy_repeat.png", "attention/distance_copy_repeat.png"}
    assert "per_length/copy_repeat.png" in {a.path for a in client.list_artifacts(parent.info.run_id, "per_length")}
    jsd_curve = summary["attention"]["copy_repeat"]["jsd"]["ALiBi"]
    assert sorted(jsd_curve) == [1, 2, 3, 4, 5, 6] and all(0 <= v <= math.log(2) for v in jsd_curve.values())
    by_layer = summary["attention"]["copy_repeat"]["jsd_by_layer"]["ALiBi"]
    for length, layers in by_layer.items():  # per layer, and the layer mean is the curve above
        assert len(layers) >= 2 and all(0 <= v <= math.log(2) for v in layers)
        assert sum(layers) / len(layers) == pytest.approx(jsd_curve[length], rel=1e-6)
    hist = summary["attention"]["copy_repeat"]["hist"]
    assert set(hist) == {"NoPE", "ALiBi"} and sum(hist["NoPE"]) > 0
    assert "| copy_repeat |" in summary["tables"]["ood"] and "**MRR**" in summary["tables"]["ood"]
    assert list((tmp_path / "checkpoints/synthetic-grid").iterdir()) == []  # kept weights gone once analysed
    # The same config again continues the finished grid: nothing trains, and the aggregate (the attention
    # analysis read back from the parent) is the same, number for number.
    assert synthetic_grid.run(cfg) == summary
    assert len(client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")) == 2
    assert client.get_run(parent.info.run_id).info.status == "FINISHED"


# --- bad input -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("overrides,message", [
    (["task=copyy"], "task='copyy' is not a valid choice; pick one of copy_repeat"),
    (["pos_encoding=xpos"], "pos_encoding='xpos' is not a valid choice"),
    (["train_max_len=20", "test_max_len=20"], "test_max_len=20 must exceed train_max_len=20"),
    (["task=copy", "scratchpad=full"], "scratchpad='full' is not supported by task 'copy'; supported: none"),
    (["task=sort", "scratchpad=full_minus_intermediate_variables"], "is not supported by task 'sort'"),
    (["task=addition", "eval.bucket_width=3"], "eval.bucket_width=3 must divide the training maximum 8"),
    (["n_train=0"], "n_train=0 is out of range"),
    (["task=lego", "train_max_len=3"], "train_max_len=3 is below lego's shortest training length 4; set train_max_len >= 4"),
    (["task=pcfg", "test_max_len=101"], "test_max_len=101 exceeds pcfg's maximum length 100; set test_max_len <= 100"),
])
def test_bad_config_is_a_clear_error(overrides, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        load_config(SyntheticConfig, None, overrides)


@pytest.mark.parametrize("overrides,message", [
    (["tasks=[copy_repeat,nosuch]"], "task='nosuch' is not a valid choice"),
    (["pos_encodings=[alibi,rope]"], "compares every PE with NoPE"),
    (["seeds=[0,0]"], "seeds=\\[0, 0\\] has duplicates"),
    (["pos_encodings=[]"], "pos_encodings is empty"),
    # every cell is checked, not only base: a bad PE, a format one task lacks, a length one task cannot make
    (["pos_encodings=[nope,xpos]"], "pos_encoding='xpos' is not a valid choice; pick one of"),
    (["tasks=[parity,copy]", "base.task=parity", "base.scratchpad=full"],
     "scratchpad='full' is not supported by task 'copy'; supported: none$"),
    (["tasks=[copy_repeat,lego]", "base.test_max_len=40"],
     "test_max_len=40 exceeds lego's maximum length 26; set test_max_len <= 26$"),
])
def test_bad_grid_is_a_clear_error(overrides, message):
    with pytest.raises(ValueError, match=message):
        load_config(SyntheticGridConfig, None, overrides)


def parity_positions(length: int) -> int:
    """Positions of a parity example with the full scratchpad, by hand: ``parity :`` and the bits (2 + L); per bit
    a step ``<in> b <comp> p xor b <out> p <vars> parity = p <rem>`` (13 tokens) and the bits left (L-1-i);
    L-1 ``<step>``s; ``<ans>`` and the answer (2); ``<bos>``, ``<sep>``, ``<eos>`` (3)."""
    return 2 + length + 13 * length + length * (length - 1) // 2 + length - 1 + 2 + 3


PARITY = ["tasks=[parity]", "base.task=parity", "base.scratchpad=full", "pos_encodings=[nope]"]


def test_model_too_short_for_the_longest_test_sequence_fails_at_config_load():
    # copy_repeat's longest test sequence: <bos> copy : s1..s6 <sep> s1..s6 <eos> = 17 positions
    with pytest.raises(ValueError, match=r"^task 'copy_repeat' with scratchpad=none: the longest test sequence "
                                         r"\(length 6: .*\) needs model.max_positions >= 17, not 16; raise "):
        load_config(SyntheticConfig, TINY, ["model.max_positions=16"])
    assert parity_positions(16) == 366
    for extra in (0, 4):
        needed = parity_positions(16) + extra
        overrides = [*PARITY, f"base.eval.extra_new_tokens={extra}"]
        load_config(SyntheticGridConfig, None, [*overrides, f"base.model.max_positions={needed}"])  # just enough
        with pytest.raises(ValueError, match=rf"^task 'parity' with scratchpad=full: the longest test sequence "
                                             rf"\(length 16: .*extra_new_tokens={extra}\) needs model.max_positions "
                                             rf">= {needed}, not {needed - 1}; raise model.max_positions or lower "
                                             rf"test_max_len$"):
            load_config(SyntheticGridConfig, None, [*overrides, f"base.model.max_positions={needed - 1}"])


def test_model_too_short_for_a_training_sequence_fails_before_training(tracking_overrides):
    """The stage checks every split it generates: here a config changed after its validation."""
    cfg = load_config(SyntheticConfig, TINY, tracking_overrides)
    cfg.model = dataclasses.replace(cfg.model, max_positions=16)
    with pytest.raises(ValueError, match="model.max_positions=16 is too small: .* needs 17 positions"):
        stage.run(cfg)
    client = MlflowClient(cfg.tracking.uri)
    assert client.search_runs([e.experiment_id for e in client.search_experiments()]) == []


def test_dry_runs_name_the_task_length_and_positions_of_a_sequence_too_long(tmp_path, tracking_overrides):
    """A pipeline's dry run lists the config check's line under its step; a grid file (the ``config`` command,
    which a pipeline cannot nest: its steps' tracking keys are top-level) fails with the same line."""
    line = ("task 'parity' with scratchpad=full: the longest test sequence (length 16: <bos> prompt <sep> target "
            "<eos>, plus eval.extra_new_tokens=0) needs model.max_positions >= 366, not 365; raise "
            "model.max_positions or lower test_max_len")

    def plan(max_positions: int) -> dict:
        path = tmp_path / "synthetic.yaml"
        path.write_text(yaml.safe_dump({"name": "synthetic", "steps": [{
            "id": "parity_nope", "stage": "synthetic",
            "overrides": ["task=parity", "scratchpad=full", f"model.max_positions={max_positions}"]}]}))
        return run_stage("pipeline", stage_config("pipeline", str(path), [*tracking_overrides, "dry_run=true"]))

    assert plan(366)["problems"] == []
    with pytest.raises(ValueError) as err:
        plan(365)
    assert str(err.value).splitlines()[1:] == [f"step parity_nope: {line}"]
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump({"tasks": ["parity"], "pos_encodings": ["nope"], "base": {
        "task": "parity", "scratchpad": "full", "model": {"max_positions": 365}}}))
    with pytest.raises(ValueError, match=f"^{re.escape(line)}$"):
        stage_config("synthetic-grid", str(grid))


def test_model_pos_encoding_follows_the_stage_key():
    assert load_config(SyntheticConfig, TINY, ["pos_encoding=t5"]).model.pos_encoding == "t5"
    with pytest.warns(UserWarning, match="model.pos_encoding=rope is ignored"):
        cfg = load_config(SyntheticConfig, TINY, ["pos_encoding=alibi", "model.pos_encoding=rope"])
    assert cfg.model.pos_encoding == "alibi"


def test_config_files_load_and_agree():
    assert load_config(SyntheticConfig, REPO / "conf/synthetic/small.yaml") == SyntheticConfig()  # documents defaults
    paper_grid = load_config(SyntheticGridConfig, REPO / "conf/synthetic-grid/paper.yaml")
    assert paper_grid.base == load_config(SyntheticConfig, REPO / "conf/synthetic/paper.yaml")
    assert len(paper_grid.cells()) == 17 * 5 * 3
    reduced = load_config(SyntheticGridConfig, REPO / "conf/synthetic-grid/reduced.yaml")
    assert reduced.pos_encodings == ["nope", "t5", "alibi", "rope", "sinusoidal"]
