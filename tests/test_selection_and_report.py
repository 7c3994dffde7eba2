"""Selection on validation data, reporting on test data: the lambda grid, the search's split, and the report's
position ranges, tables with intervals and seed counts, and ablation notes (computed from hand-made results)."""

from __future__ import annotations

import math
import re
from types import SimpleNamespace

import pytest

from nope_lightning.claims import evaluate_claim
from nope_lightning.config import ScaleSearchConfig, load_config
from nope_lightning.eval.summary import octaves
from nope_lightning.paper import CLAIMS_BY_ID
from nope_lightning.stages.scale_search import trial_config
from nope_lightning.stats import t_interval, wilson
from nope_lightning.tables import (
    MISSING,
    RECIPE_KEYS,
    ablation_table,
    passkey_table,
    ppl_tables,
    recipe_section,
    search_section,
)


def test_the_default_grid_reaches_below_one_and_must_contain_it():
    cfg = ScaleSearchConfig(checkpoint="x", target_lengths=[256])
    assert cfg.lambdas[0] == 0.8 and 1.0 in cfg.lambdas and cfg.lambdas[-1] == 2.5
    with pytest.raises(ValueError, match="does not contain 1.0"):
        load_config(ScaleSearchConfig, None, ["checkpoint=x", "target_lengths=[256]", "grid=[1.2,1.5]"])
    with pytest.raises(ValueError, match="does not contain 1.0"):
        load_config(ScaleSearchConfig, None, ["checkpoint=x", "target_lengths=[256]", "grid_min=0.85",
                                              "grid_step=0.1"])


def test_search_trials_score_the_validation_split():
    cfg = ScaleSearchConfig(checkpoint="x", target_lengths=[256, 512])
    trial = trial_config(cfg, 1.3, "parent", 0)
    assert trial.split == "val" and trial.extension.temperature.uniform == 1.3 and trial.eval_lengths == [256, 512]


def test_octaves_are_the_ranges_past_L():
    assert octaves(128, 1024) == [(0, 128), (128, 256), (256, 512), (512, 1024)]
    assert octaves(100, 250) == [(0, 100), (100, 200), (200, 250)]  # the last one cut at the longest window


def run_result(nll: float, lengths=(100, 200), passkey: list[bool] | None = None) -> dict:
    """An evaluate ``results.json`` as the tables read it (one corpus, per-length NLL with its interval)."""
    out = {"train_len": 100, "split": "test", "stride": 12, "lengths": list(lengths), "corpora": ["kjv"],
           "ppl": {"kjv": {str(n): {"nll": nll + n / 1000, "nll_low": nll + n / 1000 - 0.05,
                                    "nll_high": nll + n / 1000 + 0.05, "ppl": math.exp(nll + n / 1000)}
                           for n in lengths}}}
    if passkey is not None:
        out["passkey"] = {"prompt": "compact", "samples": [[100, 0.0, str(i), ok] for i, ok in enumerate(passkey)]}
    return out


def test_tables_show_intervals_seed_counts_and_a_dash_for_what_did_not_run():
    one_seed = {"nope": {None: run_result(3.0, passkey=[True, True, False, False])},
                "rope": {None: run_result(2.9, lengths=(100,))}}
    text = ppl_tables(one_seed)
    assert "1 seed: [95 % interval of the run" in text
    assert f"| nope | {math.exp(3.1):.1f} [{math.exp(3.05):.1f}, {math.exp(3.15):.1f}] |" in text
    assert text.split("| rope |")[1].split("|")[1].strip() == "—"  # rope was not run at 2x
    passkey = passkey_table(one_seed)
    low, high = wilson(2, 4).low, wilson(2, 4).high
    assert f"| nope | 0.50 [{low:.2f}, {high:.2f}] |" in passkey
    three = {"nope": {s: run_result(3.0 + 0.01 * s) for s in (1, 2, 3)}}
    interval = t_interval([3.0 + 0.01 * s + 0.1 for s in (1, 2, 3)])
    assert (f"{math.exp(interval.estimate):.1f} [{math.exp(interval.low):.1f}, {math.exp(interval.high):.1f}]"
            in ppl_tables(three))
    assert "3 seeds: mean over seeds, [95 % t interval across seeds]" in ppl_tables(three)


def test_a_degenerate_ablation_is_noted_and_an_edge_optimum_flagged():
    table = [[1.2, 1.3]]
    runs = {"headscale 4x": {None: {**run_result(3.0, lengths=(400,)), "temperature_table": table,
                                    "passkey": {"samples": [[100, 0.0, "1", True]] * 10,
                                                "by_length": {"100": 1.0}}}},
            "headscale 4x w/o init": {None: {**run_result(3.0, lengths=(400,)), "temperature_table": table,
                                             "passkey": {"samples": [[100, 0.0, "1", True]] * 10,
                                                         "by_length": {"100": 1.0}}}}}
    outcome = evaluate_claim(CLAIMS_BY_ID["no_init_loses_retrieval"], runs, 200)
    assert outcome.verdict == "untestable"
    text = ablation_table(runs, [outcome])
    assert "Note: headscale 4x w/o init's temperature table is within 0.01 of headscale 4x's" in text
    search = {"best": {"256": 1.0, "512": 2.0}, "best_on_grid_edge": {"256": False, "512": True},
              "grid": [0.8, 2.0], "split": "val", "fit": {"a": 0.1, "r2": 0.5},
              "intervals": {"best": {"256": [1.0, 1.2], "512": [1.8, 2.0]}, "fit": {"a": [0.05, 0.2], "r2": [0.1, 0.7]}}}
    text = search_section("search_nope", {1234: search})
    assert "chosen on the val split" in text and "512: 2 [1.8, 2] (grid edge)" in text
    assert "256: 1 [1, 1.2]," in text and "0.100 [0.050, 0.200]" in text


def test_study_names_are_readable_and_stable():
    from nope_lightning.search import study_name

    settings = {"model": "abc", "targets": [256, 512], "grid": [0.8, 1.0]}
    name = study_name("pretrain-nope-kjv-L128", "scale-search L128->256,512 grid lambda 0.8-1", settings)
    assert re.fullmatch(r"pretrain-nope-kjv-L128 scale-search L128->256,512 grid lambda 0\.8-1 \([0-9a-f]{6}\)", name)
    assert name == study_name("pretrain-nope-kjv-L128", "scale-search L128->256,512 grid lambda 0.8-1",
                              dict(reversed(settings.items())))  # a killed search finds its study again
    assert name != study_name("pretrain-nope-kjv-L128", "scale-search L128->256,512 grid lambda 0.8-1",
                              {**settings, "model": "abd"})  # another model: another study


def test_the_html_report_embeds_its_images_and_renders_tables(tmp_path):
    import base64

    import matplotlib.pyplot as plt

    from nope_lightning.stages.report import report_html

    fig, ax = plt.subplots()
    ax.plot([1, 2], [3, 4])
    fig.savefig(tmp_path / "curve.png")
    page = report_html("# R\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n![curve.png](curve.png)\n", tmp_path, "R")
    assert "<table>" in page and "<td>2</td>" in page
    encoded = re.search(r'src="data:image/png;base64,([^"]+)"', page).group(1)
    assert base64.b64decode(encoded) == (tmp_path / "curve.png").read_bytes()  # embedded, not linked
    assert 'src="curve.png"' not in page


def test_the_recipe_table_shows_an_unset_setting_as_not_set():
    # MLflow stores params as strings: tokens_per_parameter=None (the budget given by max_steps) arrives as "None".
    params = {"model.pos_encoding": "nope", "trainer.max_steps": "2750", "tokens_per_parameter": "None"}
    run = SimpleNamespace(info=SimpleNamespace(run_name="pretrain-nope"), data=SimpleNamespace(params=params))
    (row,) = [line for line in recipe_section([run]).splitlines() if line.startswith("| pretrain-nope")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1 + RECIPE_KEYS.index("tokens_per_parameter")] == MISSING
    assert cells[1 + RECIPE_KEYS.index("trainer.max_steps")] == "2750"
    assert cells[1 + RECIPE_KEYS.index("seed")] == MISSING and "None" not in row
