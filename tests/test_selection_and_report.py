"""Selection on validation data, reporting on test data: the lambda grid, the search's split, and the report's
per-position buckets, claim verdicts and ablation notes (computed from hand-made results)."""

from __future__ import annotations

import math
import re

import pytest

from nope_lightning.config import ScaleSearchConfig, load_config
from nope_lightning.stages.report import ablation_table, bucket_ppl, claims_table, search_section
from nope_lightning.stages.scale_search import trial_config


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


def result(logppl_by_bucket: list[float], ppl: dict[int, float], train_len: int = 100, **extra) -> dict:
    """An evaluate ``results.json`` with 8 linear position buckets of 100 tokens over 800 positions."""
    edges = list(range(0, 801, 100))
    return {"train_len": train_len, "split": "test", "stride": 12, "lengths": sorted(ppl), "corpora": ["kjv"],
            "ppl": {"kjv": {str(n): {"ppl": v} for n, v in ppl.items()}},
            "position": {"edges": edges, "logppl": {"kjv": logppl_by_bucket}}, **extra}


def test_bucket_ppl_is_the_token_weighted_mean_log_ppl_of_each_ratio_bucket():
    r = result([1.0, 2.0, 3.0, 5.0, 4.0, 4.0, 6.0, 6.0], {100: 1.0})
    got = bucket_ppl(r, train_len=100)
    # [0,L) = bucket 0; [L,2L) = bucket 1; [2L,4L) = buckets 2-3; [4L,8L) = buckets 4-7
    assert got == pytest.approx({"0-1x": math.e, "1-2x": math.e ** 2, "2-4x": math.e ** 4, "4-8x": math.e ** 5})


def test_claims_get_verdicts_from_our_numbers_and_say_when_unmeasured():
    evals = {
        "nope": result([3.0] + [3.5] * 3 + [4.0] * 4, {100: 30.0, 200: 40.0, 400: 60.0},
                       entropy_by_length={"100": 2.0, "200": 3.0, "400": 4.0},
                       passkey={"by_length": {"100": 1.0, "200": 0.6}, "overall": 0.8}),
        "rope": result([2.9] * 8, {100: 29.0, 200: 80.0, 400: 200.0},
                       passkey={"by_length": {"100": 0.9, "200": 0.0}, "overall": 0.45}),
        "nope lambda=best@2x": result([3.0] * 8, {100: 31.0, 200: 35.0, 400: 50.0}),
        "nope lambda=1.5": result([3.0] * 8, {100: 33.0, 200: 36.0, 400: 45.0}),
    }
    table = claims_table(evals, [{"best": {"200": 1.2, "400": 1.4}, "fit": {"a": 0.2, "r2": 0.8}}])
    rows = {line.split(" | ")[0].lstrip("| "): line.rsplit(" | ", 1)[1].rstrip(" |")
            for line in table.splitlines()[4:]}
    verdict = {k.split(" (")[0]: v for k, v in rows.items()}
    assert verdict["NoPE ≈ RoPE within L"] == "reproduced"  # 30 vs 29
    assert verdict["NoPE degrades later than RoPE"] == "reproduced"  # x1.33 vs x2.76
    assert verdict["NoPE breaks down past L"] == "reproduced"  # e^4 / e^3 = 2.7 >= 1.5
    assert verdict["a uniform lambda repairs 2x"] == "reproduced"  # 35 < 40
    assert verdict["a larger lambda hurts near PPL"] == "reproduced"  # 33 > 30
    assert verdict["HeadScale beats the best uniform lambda at 4x"] == "not measured"
    assert verdict["failure co-occurs with rising attention entropy"] == "reproduced"
    assert verdict["NoPE retrieves the passkey past L where RoPE does not"] == "reproduced"  # 0.6 > 0.0
    assert verdict["the best uniform lambda is > 1 past L and rises with length"] == "reproduced"
    assert verdict["the per-position best lambda fits 1 + a ln s"] == "reproduced"
    evals["rope"]["ppl"]["kjv"]["100"]["ppl"] = 20.0  # now NoPE is 50 % worse in distribution
    evals["nope"]["passkey"]["by_length"]["100"] = 0.2  # retrieval never learned: the claim is untestable
    table = claims_table(evals, [{"best": {"200": 1.2, "400": 1.0}, "fit": {"a": 0.1, "r2": 0.1}}])
    assert "| NoPE ≈ RoPE within L (PPL at 1x within 10 %) | 14.6 vs 14.5 | 30.0 vs 20.0 | not reproduced |" in table
    assert "untestable: in-distribution accuracy < 0.5 | not measured |" in table
    assert "a = 0.100, R^2 = 0.10 | not reproduced |" in table  # a > 0 but the fit explains nothing
    assert "1.2 at 200 / 1 at 400 | not reproduced |" in table


def test_a_degenerate_ablation_and_an_edge_optimum_are_flagged():
    evals = {"headscale 4x": result([3.0] * 8, {100: 30.0, 400: 40.0}),
             "headscale 4x w/o init": result([3.0] * 8, {100: 30.0, 400: 40.0})}
    search = {"best": {"256": 1.0, "512": 2.0}, "best_on_grid_edge": {"256": False, "512": True},
              "grid": [0.8, 2.0], "split": "val", "fit": {"a": 0.1, "r2": 0.5}}
    table = ablation_table(evals, [search])
    assert "best lambda at 256 is 1.0, the default init" in table and "degenerate" in table
    assert "512" not in table.split("Note:")[1]
    text = search_section("search_nope", search)
    assert "chosen on the val split" in text and "512: 2.0 (on the grid's edge" in text
    assert "256: 1.0," in text


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
