"""Paper 002's attention claim and its NoPE-vs-NoPE floor (``analysis.synthetic.attention_claims``,
``analysis.synthetic.grid.floor_partner`` / ``analyse_attention(floor=...)`` / ``task_attention``): the floor pairs each seed
with the one before it and is the min-head JSD between two NoPE models on one seed's inputs; the claim gives each
verdict on made-up per-seed JSDs, its numbers checked against Student t by hand; the per-layer table's intervals and
floor; and result files written before the floor load with it empty."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from mlflow.tracking import MlflowClient
from scipy import stats as scipy_stats

from nope_lightning.analysis.synthetic.attention_claims import (
    FLOOR,
    T5_CLOSEST,
    T5_OVER_FLOOR,
    attention_table,
    evaluate_attention_claims,
)
from nope_lightning.analysis.synthetic.figures import jsd_by_layer
from nope_lightning.analysis.synthetic.grid import (
    AttentionReport,
    analyse_attention,
    analysis_sequences,
    attention_maps,
    floor_partner,
    min_head_jsd,
    task_attention,
)
from nope_lightning.analysis.synthetic.grid_plots import attention_figures
from nope_lightning.analysis.synthetic.tables import claims_table
from nope_lightning.analysis.verdicts import NO_SEED_VERDICT
from nope_lightning.config import load_config
from nope_lightning.config.synthetic import SyntheticConfig, SyntheticGridConfig
from nope_lightning.results.synthetic import SeedAttention, SyntheticGridResult, TaskAttention
from nope_lightning.runtime import tracking
from nope_lightning.stages import synthetic as stage
from nope_lightning.stages import synthetic_grid
from tests.conftest import REPO
from tests.test_synthetic_claims import make_cell

TINY = REPO / "conf/synthetic/tiny.yaml"
PES = ("T5", "ALiBi", "Rotary", "APE")


def t_bounds(values) -> tuple[float, float, float]:
    """Mean and 95 % Student t interval (df = n - 1) of ``values``, computed here, not by ``stats``."""
    x = np.asarray(values, dtype=float)
    half = scipy_stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x))
    return x.mean(), x.mean() - half, x.mean() + half


def seed_values(margin: float, seed: int) -> dict[str, list[float]]:
    """One seed's per-layer JSD (2 layers): T5 at 0.05 + 0.01 * seed (mean over layers), the closest rival ``margin``
    above it, a rival that changes from seed to seed (Rotary in even seeds, ALiBi in odd ones), APE far."""
    t5 = 0.05 + 0.01 * seed
    close, far = [t5 + margin - 0.01, t5 + margin + 0.01], [t5 + margin + 0.1] * 2
    rotary, alibi = (close, far) if seed % 2 == 0 else (far, close)
    return {"T5": [t5 - 0.02, t5 + 0.02], "ALiBi": alibi, "Rotary": rotary, "APE": [0.5, 0.4]}


def made_up_grid(by_seed: dict[int, dict[str, list[float]]], task: str = "scan",
                 floors: dict[int, tuple[int, list[float]]] | None = None) -> SyntheticGridResult:
    """A grid whose only result is ``task``'s per-seed attention values and floors (seed -> (partner, layers))."""
    floors = floors or {}
    attention = TaskAttention({}, {}, {}, [], {}, {s: p for s, (p, _) in floors.items()}, by_seed,
                              {s: layers for s, (_, layers) in floors.items()})
    return SyntheticGridResult(f"grid-{task}", {}, {}, {}, {task: attention}, [])


# --- the floor --------------------------------------------------------------------------------------------------


def test_the_floor_pairs_each_seed_with_the_one_before_it():
    seeds = [256788, 234054, 146317]  # the grid's order, not sorted
    assert [floor_partner(seeds, s) for s in seeds] == [None, 256788, 234054]
    assert floor_partner([7], 7) is None  # one seed: no floor


def test_the_floor_is_the_min_head_jsd_of_another_seeds_nope_on_this_seeds_inputs():
    cfg = load_config(SyntheticConfig, TINY)
    data = stage.SyntheticData(cfg)
    nope, other = (stage.build_model(cfg.cell(cfg.task, "nope", seed), data) for seed in (0, 1))
    sequences = analysis_sequences(data.vocab, data.valid + data.test, 2, cfg.train_max)
    report = analyse_attention({"nope": nope}, sequences, floor=(1, other))
    assert report.floor_seed == 1 and sorted(report.floor_layers) == sorted({s.length for s in sequences})
    for length, layers in report.floor_layers.items():  # mean over that length's examples of each's min-head JSD
        each = [min_head_jsd(attention_maps(other, s.ids), attention_maps(nope, s.ids)).numpy()
                for s in sequences if s.length == length]
        assert layers == pytest.approx(np.mean(each, axis=0).tolist(), rel=1e-6)
        assert len(layers) == cfg.model.n_layer and all(0 < v <= math.log(2) for v in layers)
    itself = analyse_attention({"nope": nope}, sequences, floor=(0, nope))
    assert all(v == pytest.approx(0.0, abs=1e-6) for layers in itself.floor_layers.values() for v in layers)
    assert analyse_attention({"nope": nope}, sequences).floor_layers == {}


def test_a_task_s_attention_keeps_each_seed_s_values_and_floor():
    def report(alibi: dict[int, list[float]], floor: dict[int, list[float]], partner: int | None) -> AttentionReport:
        return AttentionReport({"alibi": {n: float(np.mean(v)) for n, v in alibi.items()}}, {"alibi": alibi},
                               {"nope": np.array([1, 2]), "alibi": np.array([0, 3])}, np.array([0.0, 0.5, 1.0]),
                               floor, partner)

    first = report({5: [0.1, 0.3], 6: [0.2, 0.6]}, {}, None)  # a grid's first seed: no floor
    second = report({5: [0.3, 0.1], 6: [0.4, 0.2]}, {5: [0.02, 0.04], 6: [0.06, 0.08]}, 3)
    a = task_attention({3: first, 8: second}, {"alibi": "ALiBi", "nope": "NoPE"})
    assert a.by_seed == {3: {"ALiBi": pytest.approx([0.15, 0.45])}, 8: {"ALiBi": pytest.approx([0.35, 0.15])}}
    assert a.floor_by_seed == {8: pytest.approx([0.04, 0.06])} and a.floor_partners == {8: 3}
    assert a.floor_by_layer == {5: [0.02, 0.04], 6: [0.06, 0.08]}  # the mean over the one seed that has one
    assert a.jsd_by_layer["ALiBi"] == {5: pytest.approx([0.2, 0.2]), 6: pytest.approx([0.3, 0.4])}
    assert a.hist == {"NoPE": [2, 4], "ALiBi": [0, 6]}
    stored = second.stored(8)  # what a resumed grid reads back
    assert stored.floor_partners == {8: 3} and AttentionReport.from_stored(stored, 8).stored(8) == stored
    assert AttentionReport.from_stored(first.stored(3), 3).floor_seed is None


@pytest.mark.slow  # about 25 s on 2 shared CPU cores: four tiny cells, then the grid again
def test_a_two_seed_grid_stores_each_floor_once_and_releases_the_weights(tracking_overrides, tmp_path):
    base = load_config(SyntheticConfig, TINY, [*tracking_overrides, "log_model=false"])
    cfg = SyntheticGridConfig(base=base, tasks=["copy_repeat"], pos_encodings=["nope", "alibi"], seeds=[5, 2],
                              attention_examples_per_length=1, distance_bins=5)
    summary = synthetic_grid.run(cfg)
    a = SyntheticGridResult.from_dict(summary).attention["copy_repeat"]
    stored = {seed: SeedAttention.load(tracking.download(base.tracking, summary["parent_run_id"],
                                                         f"attention_by_seed/copy_repeat_s{seed}.json")).attention
              for seed in (5, 2)}
    assert stored[5].floor_by_layer == {} and stored[2].floor_partners == {2: 5}  # seed 2 against seed 5's NoPE
    assert a.floor_partners == {2: 5} and a.floor_by_layer == stored[2].floor_by_layer
    assert all(0 < v <= math.log(2) for layers in a.floor_by_layer.values() for v in layers)
    assert a.floor_by_seed == {2: pytest.approx(np.mean(list(stored[2].floor_by_layer.values()), axis=0))}
    assert a.by_seed[5]["ALiBi"] == pytest.approx(np.mean(list(stored[5].jsd_by_layer["alibi"].values()), axis=0))
    assert list((tmp_path / "checkpoints/synthetic-grid").iterdir()) == []  # every kept NoPE released
    assert synthetic_grid.run(cfg) == summary  # resumed: the stored floors read back, number for number


def test_a_grid_of_nope_alone_measures_the_floor_and_plots_and_tabulates_only_it(tracking_overrides, tmp_path):
    """A floor study's grid (NoPE alone, two seeds): the second seed's floor is stored and read back, the grid's own
    JSD plots draw the floor's line only, and a report's table and figure show the floor row and line alone."""
    base = load_config(SyntheticConfig, TINY, [*tracking_overrides, "log_model=false"])
    cfg = SyntheticGridConfig(base=base, tasks=["copy_repeat"], pos_encodings=["nope"], seeds=[5, 2],
                              attention_examples_per_length=1, distance_bins=5)
    summary = synthetic_grid.run(cfg)
    grid = SyntheticGridResult.from_dict(summary)
    a = grid.attention["copy_repeat"]
    assert a.floor_partners == {2: 5} and a.jsd_by_layer == {} and a.by_seed == {5: {}, 2: {}}
    assert all(0 < v <= math.log(2) for layers in a.floor_by_layer.values() for v in layers)
    artifacts = {f.path for f in MlflowClient(base.tracking.uri).list_artifacts(grid.parent_run_id, "attention")}
    assert {"attention/jsd_copy_repeat.png", "attention/jsd_by_layer_copy_repeat.png"} <= artifacts
    rows = table_rows(attention_table([grid]))
    floor = np.asarray(list(a.floor_by_seed.values()))  # (1 seed, layers)
    assert list(rows) == [FLOOR] and rows[FLOOR][-2:] == [f"{floor.mean():.3f}", "1 of 2: 2 vs 5"]
    (figure,) = jsd_by_layer([grid]).values()
    (line,) = figure.figure.axes[0].get_lines()  # the floor's, dashed: no PE line
    assert line.get_linestyle() == "--" and line.get_ydata() == pytest.approx(floor[0])


def test_the_grid_s_jsd_plots_draw_each_pe_and_the_floor_and_none_without_either():
    a = TaskAttention({"ALiBi": {5: 0.2, 6: 0.4}}, {"ALiBi": {5: [0.1, 0.3], 6: [0.2, 0.6]}}, {"NoPE": [1, 2]},
                      [0.0, 0.5, 1.0], {5: [0.02, 0.04], 6: [0.06, 0.10]})
    figures = attention_figures("scan", a, train_max=5)
    assert set(figures) == {"attention/jsd_scan.png", "attention/jsd_by_layer_scan.png", "attention/distance_scan.png"}
    mean = {line.get_label(): list(line.get_ydata()) for line in figures["attention/jsd_scan.png"].axes[0].get_lines()}
    assert mean == {"ALiBi": [0.2, 0.4], FLOOR: pytest.approx([0.03, 0.08]), "train max": [0, 1]}
    layer2 = {line.get_label(): list(line.get_ydata())
              for line in figures["attention/jsd_by_layer_scan.png"].axes[1].get_lines()}
    assert layer2["ALiBi"] == [0.3, 0.6] and layer2[FLOOR] == [0.04, 0.10]
    alone = TaskAttention({}, {}, {"NoPE": [1, 2]}, [0.0, 0.5, 1.0])  # NoPE alone, one seed: nothing to compare
    assert set(attention_figures("scan", alone, train_max=5)) == {"attention/distance_scan.png"}


# --- the claim ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("margins,expected", [
    ((0.02, 0.03, 0.025), "reproduced"),  # T5 the closest in every seed
    ((-0.02, -0.03, -0.025), "not reproduced"),  # T5 farther than a rival in every seed
    ((0.02, -0.03, 0.01), "inconclusive"),  # seeds disagree
    ((0.02,), NO_SEED_VERDICT),
])
def test_the_claim_gives_each_verdict(margins, expected):
    grid = made_up_grid({seed: seed_values(m, seed) for seed, m in enumerate(margins)})
    (outcome,) = evaluate_attention_claims([grid])
    assert outcome.verdict == expected and outcome.tasks == ("scan",) and outcome.left_out == ()
    assert outcome.across.per_seed == pytest.approx(margins)  # the closest rival found in each seed
    if len(margins) > 1:
        mean, low, high = t_bounds(margins)
        assert (outcome.across.estimate, outcome.across.low, outcome.across.high) == pytest.approx((mean, low, high))
    row = claims_table([outcome])
    assert f"**{expected}**" in row and "none (no per-example results)" in row


def test_without_scan_the_claim_averages_the_analysed_tasks_and_says_so():
    copy = made_up_grid({s: seed_values(m, s) for s, m in enumerate((0.02, 0.04, 0.03))}, "copy")
    reverse = made_up_grid({s: seed_values(m, s) for s, m in enumerate((0.00, -0.02, 0.01))}, "reverse")
    (outcome,) = evaluate_attention_claims([copy, reverse])
    assert outcome.tasks == ("copy", "reverse") and outcome.left_out[0][0] == "scan"
    assert outcome.across.per_seed == pytest.approx([0.01, 0.01, 0.02])  # per seed, the mean over the two tasks
    assert "left out scan: not analysed by these grids" in claims_table([outcome])
    assert "SCAN, the paper's task, was not analysed" in attention_table([copy, reverse])
    with_scan = made_up_grid({s: seed_values(-0.05, s) for s in range(3)})
    assert evaluate_attention_claims([copy, with_scan])[0].tasks == ("scan",)  # the paper's task when there is one


def test_missing_values_are_not_measured_and_scratchpad_grids_are_not_read():
    old = SyntheticGridResult("old", {}, {}, {}, {"scan": TaskAttention({"T5": {5: 0.1}}, {"T5": {5: [0.1]}}, {}, [])},
                              [])  # written before per-seed values
    (outcome,) = evaluate_attention_claims([old])
    assert outcome.verdict == "not measured" and "no grid holds per-seed attention values" in outcome.reason
    no_ape = made_up_grid({s: {pe: v for pe, v in seed_values(0.02, s).items() if pe != "APE"} for s in range(2)})
    assert "APE was not analysed in every (task, seed) of scan" in evaluate_attention_claims([no_ape])[0].reason
    with pytest.raises(ValueError, match=r"two attention analyses of \(scan, seed 0\)"):
        evaluate_attention_claims([made_up_grid({0: seed_values(0.02, 0)})] * 2)
    plain, padded = (made_up_grid({s: seed_values(m, s) for s in range(2)}) for m in (0.02, -0.02))
    padded = dataclasses.replace(padded, runs=[make_cell("scan", "nope", 0, 0.5, scratchpad="full")])
    assert evaluate_attention_claims([plain, padded])[0].across.per_seed == pytest.approx([0.02, 0.02])
    assert "not measured: no grid holds per-seed attention values" in attention_table([old])


# --- the per-layer table -----------------------------------------------------------------------------------------


def table_rows(text: str) -> dict[str, list[str]]:
    """The markdown table's rows by their first cell."""
    rows = [line.strip("|").split(" | ") for line in text.splitlines() if line.startswith("| ")]
    return {cells[0].strip(): [c.strip() for c in cells[1:]] for cells in rows[1:]}


def interval_text(values, signed: bool = False) -> str:
    show = "{:+.3f}" if signed else "{:.3f}"
    mean, low, high = t_bounds(values)
    if not signed:
        low, high = max(low, 0.0), min(high, math.log(2))
    return f"{show.format(mean)} [{show.format(low)}, {show.format(high)}]"


def test_the_table_gives_each_layer_its_interval_and_the_floor():
    by_seed = {s: seed_values(m, s) for s, m in enumerate((0.02, 0.03, 0.025))}
    floors = {1: (0, [0.03, 0.05]), 2: (1, [0.04, 0.02])}
    rows = table_rows(attention_table([made_up_grid(by_seed, floors=floors)]))
    t5 = np.array([by_seed[s]["T5"] for s in range(3)])  # (seeds, layers)
    assert rows["T5"] == [interval_text(t5[:, 0]), interval_text(t5[:, 1]), interval_text(t5.mean(1)), "3"]
    assert list(rows)[:4] == list(PES)  # the paper's order
    floor = np.array([floors[1][1], floors[2][1]])
    assert rows[FLOOR] == [interval_text(floor[:, 0]), interval_text(floor[:, 1]), interval_text(floor.mean(1)),
                           "2 of 3: 1 vs 0, 2 vs 1"]
    over = t5[1:] - floor  # paired: seeds 1 and 2, each T5 minus its own floor
    assert rows[T5_OVER_FLOOR] == [interval_text(over[:, 0], True), interval_text(over[:, 1], True),
                                   interval_text(over.mean(1), True), "2, paired"]
    one_seed = table_rows(attention_table([made_up_grid({0: by_seed[0]})]))
    assert one_seed["T5"][0] == f"{by_seed[0]['T5'][0]:.3f}"  # one seed: the value, no interval
    assert one_seed[FLOOR][:3] == ["—"] * 3 and one_seed[FLOOR][3].startswith("absent:")


# --- files ---------------------------------------------------------------------------------------------------


def test_attention_files_written_before_the_floor_load_with_it_empty(tmp_path):
    old = {"jsd": {"alibi": {"5": 0.1}}, "jsd_by_layer": {"alibi": {"5": [0.1, 0.1]}}, "hist": {"nope": [1]},
           "edges": [0.0, 1.0]}
    (tmp_path / "scan_s0.json").write_text(json.dumps({"version": 1, "task": "scan", "seed": 0, "attention": old}))
    a = SeedAttention.load(tmp_path / "scan_s0.json").attention
    assert a.jsd_by_layer == {"alibi": {5: [0.1, 0.1]}}
    assert a.floor_by_layer == a.floor_partners == a.by_seed == a.floor_by_seed == {}
    assert AttentionReport.from_stored(a, 0).floor_seed is None
    grid = SyntheticGridResult.from_dict({"version": 2, "parent_run_id": "p", "mrr": {}, "ood": {}, "tables": {},
                                          "attention": {"scan": old}, "runs": []})
    assert grid.attention["scan"].floor_by_seed == {}
    new = made_up_grid({3: seed_values(0.02, 3), 9: seed_values(0.01, 9)}, floors={9: (3, [0.1, 0.2])})
    new.save(tmp_path / "results.json")
    assert SyntheticGridResult.load(tmp_path / "results.json") == new  # seeds are ints again
    assert T5_CLOSEST.tasks == ("scan",) and T5_CLOSEST.rule == "effect > 0 (nats)"
