"""HeadScale-log: HeadScale's training of n_layer x n_head scalars on a frozen model, where each scalar is the
slope a_h of the log-length temperature ``max(1, 1 + a_h ln((i+1)/L))`` (``model/temperature.py``) instead of a
uniform-over-positions lambda_h; and the scale-search's fitted slope a, which starts it (``init=search``) and
which ``evaluate extension.log_scale=<scale-search run>`` applies zero-shot.

The stage is ``headscale parameterization=log``: the same optimizer, schedule, budget, data, checkpoints and
resume, with a >= 0 enforced by the same projection (floor 0: a negative slope is the same model as 0, the
max picking 1 everywhere, so the bound is part of the definition, not an ablation). The learned table is saved
as ``headscale/log_scale.safetensors`` (+ .json), for ``evaluate extension.log_scale_table=runs:/<id>/…``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from nope_lightning.config import HeadScaleConfig, OptimConfig
from nope_lightning.model import GPT, count_parameters
from nope_lightning.model.temperature import make_log_scales_trainable, set_log_scales
from nope_lightning.stages.headscale import HeadScaleLM

if TYPE_CHECKING:
    from nope_lightning.checkpoint import LoadedModel

SLOPE_FLOOR = 0.0
TABLE_FILE = "headscale/log_scale.safetensors"
#: Name of layer l's slopes in the trained model's state dict.
STATE_KEY = "transformer.h.{}.attn.position_temperature.log_scale"


def fitted_slope(result: dict, fingerprint: str, ref: str) -> float:
    """The fit ``a`` of ``lambda = 1 + a ln s`` in a scale-search ``result`` (its ``scale_search.json``), for the
    model ``fingerprint``; ``ref`` names the setting in the one-line errors (another model, no fit, a < 0)."""
    if result.get("model_fingerprint") != fingerprint:
        raise ValueError(f"{ref} was run on another model (fingerprint {str(result.get('model_fingerprint'))[:12]}, "
                         f"this checkpoint is {fingerprint[:12]}); run scale-search on this checkpoint")
    a = float(result.get("fit", {}).get("a", math.nan))
    if math.isnan(a):
        raise ValueError(f"{ref} has no fit a (it needs per-position best lambdas in >= 2 buckets beyond "
                         f"train_len: search a longer target length)")
    if a < 0:
        raise ValueError(f"{ref} fit a={a:.4g} < 0 (its best temperature falls with position); log-length "
                         f"scaling needs a >= 0")
    return a


def initial_slope(cfg: HeadScaleConfig, loaded: LoadedModel) -> float:
    """The uniform starting slope a that ``cfg.init`` asks for: the fit a (``search``), 0 (``default``, the
    plain model) or the number given."""
    if cfg.init == "default":
        return 0.0
    if cfg.init != "search":
        return float(cfg.init)
    from nope_lightning.stages.scale_search import load_result

    return fitted_slope(load_result(cfg.scale_search, cfg.tracking), loaded.fingerprint,
                        f"scale_search={cfg.scale_search}")


def freeze_for_headscale_log(model: GPT) -> None:
    """Freeze every tensor of ``model`` but the slopes a (which must be set), which become trainable parameters
    (asserted: n_layer * n_head trainable scalars)."""
    model.requires_grad_(False)
    make_log_scales_trainable(model)
    expected = model.cfg.n_layer * model.cfg.n_head
    trainable = count_parameters(model, trainable_only=True)
    assert trainable == expected, f"HeadScale-log trains {trainable} scalars, expected n_layer*n_head={expected}"


class HeadScaleLogLM(HeadScaleLM):
    """``HeadScaleLM`` training the slopes a instead of the temperatures, projected onto a >= 0."""

    def __init__(self, model: GPT, optim: OptimConfig, max_steps: int, compile: bool = False) -> None:
        super().__init__(model, optim, max_steps, SLOPE_FLOOR, compile)
        freeze_for_headscale_log(model)  # after HeadScaleLM's freeze, which made the temperatures trainable

    @torch.no_grad()
    def lambda_stats(self) -> dict[str, torch.Tensor]:
        """Mean, min and max slope a over all heads (HeadScaleLM's reduction, named for a)."""
        return {k.replace("/lambda_", "/a_"): v for k, v in super().lambda_stats().items()}


def start(model: GPT, init: float, cfg: HeadScaleConfig) -> HeadScaleLogLM:
    """Every head's slope set to ``init``, then the module that trains them (``headscale`` stage, log)."""
    set_log_scales(model, torch.full((model.cfg.n_layer, model.cfg.n_head), init))
    return HeadScaleLogLM(model, cfg.optim, cfg.steps, cfg.trainer.compile)
