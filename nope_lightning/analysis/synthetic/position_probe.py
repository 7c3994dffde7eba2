"""Linear read-outs of absolute position from a model's hidden states (paper 002's Theorem 1, probed).

Kazemnejad et al. (2023, Theorem 1) show that a NoPE causal transformer's first layer *can* write a token's
absolute position into its hidden state: the causal mask alone makes a uniform attention over the prefix
average ``t + 1`` values at position t (0-based). Whether a *trained* model does so is an empirical question,
which this module answers with a probe: a ridge regression from hidden states to position, fit on positions
inside the training length L and scored there (in distribution) and past it (out of distribution).

Units and shapes, used throughout:

* positions are 0-based token indices t; a *target* is ``t`` (``"linear"``) or ``ln(t + 1)`` (``"log"``, the
  default: the prefix average carries ``1 / (t + 1)``, whose log is ``-ln(t + 1)``, and on a log scale the
  first positions, where that average changes most, are as far apart as the last ones);
* ``states`` are (B, T, D) float64 arrays: B sequences, T positions, D hidden channels;
* R^2 is the coefficient of determination ``1 - SSE / SST`` on the evaluated rows (1: perfect; 0: no better
  than predicting the evaluated targets' mean; negative: worse than that, as an extrapolating read-out can
  be).

Choices: ridge (L2) regression rather than plain least squares, so that the near-collinear channels of a
small model cannot blow the weights up; features are standardised with the fit rows' mean and standard
deviation first, so ``alpha`` is in units of standardised features whatever the hidden states' scale; the
intercept is not penalised (fit on centred targets). The fit is in float64 numpy (closed form; D is small).
The control is the same probe fit on the fit rows' targets randomly permuted, scored against the true targets
of the held-out rows: what a read-out of this size gets from the states without any position association.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from scipy.stats import spearmanr

from nope_lightning.model.gpt import GPT

#: What a probe reads out: the 0-based position t itself, or ln(t + 1).
POSITION_TARGETS = ("linear", "log")


def position_targets(positions: np.ndarray, target: str = "log") -> np.ndarray:
    """The probe's targets for 0-based ``positions`` (any shape, ints): t (``"linear"``) or ln(t + 1)
    (``"log"``), float64, same shape."""
    if target not in POSITION_TARGETS:
        raise ValueError(f"position target must be one of {', '.join(POSITION_TARGETS)}, not {target!r}")
    t = np.asarray(positions, dtype=np.float64)
    return t if target == "linear" else np.log1p(t)


def module_output(model: GPT, module: torch.nn.Module, idx: torch.Tensor) -> torch.Tensor:
    """What ``module`` (a part of ``model``: a block, its attention) outputs during one full forward pass of
    ``model`` on token ids ``idx`` (B, T), under ``no_grad``, detached (the forward hook is always removed)."""
    captured: dict[str, torch.Tensor] = {}
    handle = module.register_forward_hook(lambda _module, _inputs, output: captured.__setitem__("out", output.detach()))
    try:
        with torch.no_grad():
            model(idx)
    finally:
        handle.remove()
    return captured["out"]


def hidden_states(model: GPT, idx: torch.Tensor, layer: int = 0) -> np.ndarray:
    """The residual stream after block ``layer`` (0: the first layer's output, attention + MLP added to the
    token embeddings) for token ids ``idx`` (B, T): (B, T, n_embd) float64."""
    return module_output(model, model.transformer.h[layer], idx).double().cpu().numpy()


@dataclass(frozen=True)
class RidgeProbe:
    """A fitted linear read-out: ``predict(x) = ((x - mean) / scale) @ weights + intercept``.

    ``mean``, ``scale``, ``weights``: (D,) float64 (``scale``: the fit rows' standard deviation, 1 where a
    channel is constant); ``intercept``: the fit targets' mean, in target units."""

    mean: np.ndarray
    scale: np.ndarray
    weights: np.ndarray
    intercept: float

    def predict(self, features: np.ndarray) -> np.ndarray:
        """features (N, D) -> predicted targets (N,) float64."""
        z = (np.asarray(features, dtype=np.float64) - self.mean) / self.scale
        return z @ self.weights + self.intercept


def fit_ridge(features: np.ndarray, targets: np.ndarray, alpha: float = 1.0) -> RidgeProbe:
    """Ridge regression of ``targets`` (N,) on ``features`` (N, D), standardised features, unpenalised
    intercept: weights ``(Z^T Z + alpha I)^-1 Z^T (y - mean(y))`` with Z the standardised features.
    ``alpha >= 0`` (0: ordinary least squares, which needs Z^T Z invertible)."""
    x = np.asarray(features, dtype=np.float64)
    y = np.asarray(targets, dtype=np.float64)
    if x.ndim != 2 or y.shape != (x.shape[0],):
        raise ValueError(f"features must be (N, D) and targets (N,); got {x.shape} and {y.shape}")
    if alpha < 0:
        raise ValueError(f"alpha must be >= 0, got {alpha}")
    mean, scale = x.mean(axis=0), x.std(axis=0)
    scale = np.where(scale > 0, scale, 1.0)  # a constant channel carries nothing; keep it finite
    z = (x - mean) / scale
    intercept = float(y.mean())
    weights = np.linalg.solve(z.T @ z + alpha * np.eye(z.shape[1]), z.T @ (y - intercept))
    return RidgeProbe(mean, scale, weights, intercept)


def r2_score(targets: np.ndarray, predictions: np.ndarray) -> float:
    """Coefficient of determination ``1 - sum((y - p)^2) / sum((y - mean(y))^2)`` of (N,) arrays."""
    y = np.asarray(targets, dtype=np.float64)
    p = np.asarray(predictions, dtype=np.float64)
    total = np.sum((y - y.mean()) ** 2)
    if total == 0:
        raise ValueError("R^2 is undefined for constant targets")
    return float(1.0 - np.sum((y - p) ** 2) / total)


@dataclass(frozen=True)
class ProbeReport:
    """One position probe's scores (R^2 in target units, see the module doc).

    ``r2_in``: held-out sequences, positions 0..L-1; ``r2_out``: held-out sequences, positions L..T-1;
    ``r2_shuffled``: the permuted-target control, scored like ``r2_in``; ``rank_out``: Spearman correlation of
    the position with the probe's mean prediction at that position (over held-out sequences), positions
    L..T-1: whether the read-out still *orders* positions past L even where its scale is off (R^2 < 0)."""

    r2_in: float
    r2_out: float
    r2_shuffled: float
    rank_out: float


def position_probe(states: np.ndarray, train_len: int, fit_sequences: int, target: str = "log",
                   alpha: float = 1.0, seed: int = 0) -> ProbeReport:
    """Fit a ridge read-out of position from ``states`` (B, T, D) and score it in and out of distribution.

    The first ``fit_sequences`` sequences, positions 0..``train_len``-1, are the fit rows; the other
    sequences are held out (other token contents, so the probe cannot memorise a sequence) and scored at
    positions 0..train_len-1 (in distribution) and train_len..T-1 (out of distribution; needs T > train_len).
    The control permutes the fit rows' targets with ``numpy.random.default_rng(seed)``."""
    B, T, D = states.shape
    if not 0 < train_len < T:
        raise ValueError(f"train_len={train_len} must lie in 1..T-1 (T={T}) to leave positions past it")
    if not 0 < fit_sequences < B:
        raise ValueError(f"fit_sequences={fit_sequences} must leave held-out sequences (B={B})")
    y = position_targets(np.arange(T), target)
    fit, held = states[:fit_sequences, :train_len], states[fit_sequences:]
    fit_x, fit_y = fit.reshape(-1, D), np.tile(y[:train_len], fit_sequences)
    probe = fit_ridge(fit_x, fit_y, alpha)
    n_held = B - fit_sequences
    inside = held[:, :train_len].reshape(-1, D)
    outside = probe.predict(held[:, train_len:].reshape(-1, D))  # rows: sequence-major, position-minor
    control = fit_ridge(fit_x, np.random.default_rng(seed).permutation(fit_y), alpha)
    mean_out = outside.reshape(n_held, T - train_len).mean(axis=0)  # (T - train_len,)
    return ProbeReport(
        r2_in=r2_score(np.tile(y[:train_len], n_held), probe.predict(inside)),
        r2_out=r2_score(np.tile(y[train_len:], n_held), outside),
        r2_shuffled=r2_score(np.tile(y[:train_len], n_held), control.predict(inside)),
        rank_out=float(spearmanr(np.arange(train_len, T), mean_out).statistic),
    )
