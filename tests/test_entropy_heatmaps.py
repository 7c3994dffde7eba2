"""Paper 001's Figs 3 and 10 in the report: the matrices drawn are the per-seed entropy arrays averaged by numpy."""

from types import SimpleNamespace

import numpy as np

from nope_lightning.analysis.lengthgen import entropy_figures
from nope_lightning.results.evaluation import HeadEntropy

EDGES = [0, 4, 8, 12, 16]  # four buckets; with L = 8 the last two lie past it


def _run(per_head: np.ndarray) -> SimpleNamespace:
    return SimpleNamespace(train_len=8, entropy=HeadEntropy(EDGES, "nats", per_head.tolist(),
                                                            per_head.mean((0, 1)).tolist()))


def _evals() -> tuple[dict, dict]:
    rng = np.random.default_rng(0)
    arrays = {m: {s: rng.uniform(0, 3, (3, 2, 4)) for s in seeds}
              for m, seeds in (("nope", (1, 2, 3)), ("scaled", (1, 2)))}
    no_entropy = SimpleNamespace(train_len=8, entropy=None)
    evals = {m: {s: _run(a) for s, a in by_seed.items()} for m, by_seed in arrays.items()}
    evals["baseline"] = {1: no_entropy}
    return evals, arrays


def test_fig3_draws_each_method_past_train_len_mean_over_seeds():
    evals, arrays = _evals()
    plot = entropy_figures.fig3_plot(evals)
    images = [ax.images[0] for ax in plot.figure.axes if ax.images]
    assert [ax.get_title() for ax in plot.figure.axes if ax.images] == [
        f"{m}\n(mean {np.mean(list(arrays[m].values()), axis=0)[..., 2:].mean():.2f})" for m in ("nope", "scaled")]
    for image, method in zip(images, ("nope", "scaled"), strict=True):
        expected = np.mean(list(arrays[method].values()), axis=0)[..., 2:].mean(-1)
        assert image.get_array().shape == (3, 2)
        np.testing.assert_allclose(image.get_array(), expected)
        assert image.get_clim() == images[0].get_clim()  # one colour scale for every panel
    assert "positions 8-16 (past the training length 8)" in plot.caption
    assert "mean over seeds 1, 2, 3 (`scaled`: seeds 1, 2 only)" in plot.caption
    assert entropy_figures.past_buckets(EDGES, 8) == [2, 3]


def test_fig10_draws_reference_rows_layer_head_by_bucket():
    evals, arrays = _evals()
    plot = entropy_figures.fig10_plot(evals, "nope")
    drawn = plot.figure.axes[0].images[0].get_array()
    np.testing.assert_allclose(drawn, np.mean(list(arrays["nope"].values()), axis=0).reshape(6, 4))
    assert "mean over seeds 1, 2, 3" in plot.caption and "4-token position bucket" in plot.caption


def test_figures_absent_without_per_head_entropy_or_a_bucket_past_train_len():
    evals, _ = _evals()
    assert entropy_figures.fig10_plot(evals, "baseline") is None
    assert entropy_figures.fig10_plot(evals, "") is None
    short = {"nope": {1: SimpleNamespace(train_len=16, entropy=HeadEntropy(EDGES, "nats", [[[1.0] * 4]], [1.0] * 4))}}
    assert entropy_figures.fig3_plot(short) is None
