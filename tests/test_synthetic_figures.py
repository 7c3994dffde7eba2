"""Paper 002's report figures over several grids (``analysis.synthetic.figures``): per-length exact match is the mean
over seeds of every grid's cells, one panel per (task, scratchpad); the JSD figure plots each PE's per-layer mean
over seeds beside the floor; attended-distance histograms sum the grids' counts per (task, scratchpad). Each
comes with the caption the report prints under it, naming the seeds it draws."""

from __future__ import annotations

import numpy as np

from nope_lightning.analysis.synthetic.figures import (
    accuracy_by_length,
    distance_histograms,
    jsd_by_layer,
    study_figures,
)
from nope_lightning.analysis.synthetic.grid_plots import FLOOR
from nope_lightning.results.synthetic import SyntheticGridResult, TaskAttention
from nope_lightning.synthetic.tasks import TASKS
from tests.test_attention_claims import made_up_grid
from tests.test_synthetic_claims import make_cell


def one_seed_grid(seed: int, scratchpad: str = "none", hist=None) -> SyntheticGridResult:
    """copy_repeat (NoPE 0.8 / 0.6 OOD, T5 0.2 at seed 0 / 0.4 at seed 1), a grid per seed as a pipeline runs it,
    with an attended-distance histogram of 4 bins per PE."""
    cells = [make_cell("copy_repeat", "nope", seed, 0.8 - 0.2 * seed, scratchpad=scratchpad),
             make_cell("copy_repeat", "t5", seed, 0.2 + 0.2 * seed, scratchpad=scratchpad)]
    hist = hist or {"NoPE": [1, 0, 0, 3], "T5": [4, 0, 0, 0]}
    attention = TaskAttention({}, {}, hist, [0.0, 0.25, 0.5, 0.75, 1.0])
    return SyntheticGridResult(f"g{seed}", {}, {}, {}, {"copy_repeat": attention}, cells)


def lines(ax) -> dict[str, tuple[list, list]]:
    return {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.get_lines()}


def test_accuracy_by_length_is_the_mean_over_seeds_of_every_grid():
    fig, caption = accuracy_by_length([one_seed_grid(0), one_seed_grid(1), one_seed_grid(0, "full")])
    assert "mean over seeds 0, 1 (`copy_repeat (full)`: seed 0 only)" in caption
    visible = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in visible] == ["copy_repeat, seeds 0, 1", "copy_repeat (full), seed 0"]
    plain = lines(visible[0])
    assert plain["NoPE"] == ([1, 21], [1.0, 0.7])  # buckets "1-20" (ID) and "21-40" (OOD): (0.8 + 0.6) / 2
    assert np.allclose(plain["T5"][1], [1.0, 0.3])
    assert lines(visible[1])["NoPE"] == ([1, 21], [1.0, 0.8])  # the full-scratchpad grid alone
    assert accuracy_by_length([]) is None



def test_accuracy_panels_follow_the_task_registry_as_the_tables_do():
    """Panels in ``TASKS`` order (copy_repeat before copy, parity before scan), plain tasks before scratchpad ones,
    whatever order the grids came in and whatever the alphabet says."""
    cells = [make_cell(task, "nope", 0, 0.5, scratchpad=pad)
             for task, pad in [("scan", "none"), ("copy", "none"), ("parity", "full"), ("copy_repeat", "none"),
                               ("parity", "none")]]
    fig, _ = accuracy_by_length([SyntheticGridResult("g", {}, {}, {}, {}, cells)])
    titles = [ax.get_title().split(",")[0] for ax in fig.axes if ax.get_visible()]
    registry = list(TASKS)
    assert titles == sorted(["scan", "copy", "copy_repeat", "parity"], key=registry.index) + ["parity (full)"]
    assert titles.index("copy_repeat") < titles.index("copy")  # alphabetical order would put copy first

def test_distance_histograms_sum_counts_over_the_grids_of_a_task_and_scratchpad():
    grids = [one_seed_grid(0), one_seed_grid(1, hist={"NoPE": [0, 2, 0, 0], "T5": [1, 1, 0, 0]}),
             one_seed_grid(0, "full")]
    figures = distance_histograms(grids)
    assert sorted(figures) == ["synthetic_distance_copy_repeat.png", "synthetic_distance_copy_repeat_full.png"]
    nope = figures["synthetic_distance_copy_repeat.png"].figure.axes[0]
    heights = [bar.get_height() for bar in nope.patches]
    assert np.allclose(heights, np.array([1, 2, 0, 3]) / 6)  # [1, 0, 0, 3] + [0, 2, 0, 0], as fractions
    # the title says how many seeds a histogram sums: the full-scratchpad one has a single grid
    plain = figures["synthetic_distance_copy_repeat.png"]
    full = figures["synthetic_distance_copy_repeat_full.png"]
    assert plain.figure.get_suptitle().endswith("summed over 2 seeds)")
    assert full.figure.get_suptitle().endswith("one seed)")
    assert plain.caption.endswith("summed over seeds 0, 1.") and full.caption.endswith("summed over seed 0.")


def test_a_distance_histogram_s_title_counts_seeds_not_grids():
    """One grid may hold several seeds (a matrix of seed pairs): its histogram sums all of them, and so does its
    title's count."""
    pair = one_seed_grid(0)
    pair.runs.extend(make_cell("copy_repeat", pe, 1, 0.5) for pe in ("nope", "t5"))
    plot = distance_histograms([pair, one_seed_grid(2)])["synthetic_distance_copy_repeat.png"]
    assert plot.figure.get_suptitle().endswith("summed over 3 seeds)")
    assert plot.caption.endswith("summed over seeds 0, 1, 2.")


def test_the_jsd_figure_plots_each_pe_s_mean_over_seeds_beside_the_floor():
    by_seed = {0: {"T5": [0.1, 0.3], "ALiBi": [0.2, 0.2]}, 1: {"T5": [0.3, 0.5], "ALiBi": [0.4, 0.6]}}
    figures = jsd_by_layer([made_up_grid(by_seed, floors={1: (0, [0.05, 0.15])})])
    (ax,) = figures["synthetic_jsd_scan.png"].figure.axes
    assert "mean over seeds 0, 1;" in figures["synthetic_jsd_scan.png"].caption
    drawn = lines(ax)
    assert drawn["T5 (2)"] == ([1, 2], [0.2, 0.4]) and np.allclose(drawn["ALiBi (2)"][1], [0.3, 0.4])
    assert np.allclose(drawn[f"{FLOOR} (1)"][1], [0.05, 0.15])  # the name the attention table gives the floor
    assert jsd_by_layer([one_seed_grid(0)]) == {}  # no per-seed attention values: no figure


def test_study_figures_names_every_figure_with_its_own_title_and_caption():
    figures = study_figures([one_seed_grid(0), one_seed_grid(1), one_seed_grid(0, "full")])
    assert sorted(figures) == ["synthetic_accuracy_by_length.png", "synthetic_distance_copy_repeat.png",
                               "synthetic_distance_copy_repeat_full.png"]
    titles = [plot.figure.get_suptitle() or plot.figure.axes[0].get_title() for plot in figures.values()]
    captions = [plot.caption for plot in figures.values()]
    assert len(set(titles)) == len(titles) and len(set(captions)) == len(captions)
    assert all("seed" in caption for caption in captions)
