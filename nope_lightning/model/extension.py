"""Length-extension settings resolved for one trained model, and the one reader of scale-search results.

A user writes an ``ExtensionConfig`` (``extension.*``: temperatures, RoPE scaling, attention backend) whose
temperature tables may be ``runs:/<run_id>/<artifact path>`` references and whose ``log_slope_fit`` and
``uniform_search`` name scale-search runs. ``load_extended`` resolves it for one model (``resolve_temperature``:
tables downloaded to local files, the fit read into ``log_slope``, the searched lambda into ``uniform``) and
hands the typed settings to ``checkpoint.load_model``. A scale-search result is read here only
(``read_scale_search``) and always checked against the model it is applied to (``scale_search_for``):
evaluate's ``extension.temperature.log_slope_fit`` and ``uniform_search`` (the best uniform temperature at
``uniform_search_len``), HeadScale's ``init=search`` (the same at ``target_len``) and HeadScale-log's (the fit
a) all go through it.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from nope_lightning.config.parts import AttentionTemperature, TrackingConfig
from nope_lightning.config.stages import ExtensionConfig
from nope_lightning.model.checkpoint import LoadedModel, load_model, resolve_reference, weights_fingerprint
from nope_lightning.results.search import ScaleSearchResult
from nope_lightning.runtime import tracking

#: The ``units`` of a scale-search over iRoPE's beta (``parameter=irope_beta``): its "lambda" entries are betas,
#: so ``scale_search_for`` refuses it wherever a lambda or its fit a is read.
BETA_UNITS = "beta of 1 + beta ln(floor((i + 1) / F) + 1), F = irope_floor x train_len (iRoPE)"


def load_extended(checkpoint: str, ext: ExtensionConfig, tracking_cfg: TrackingConfig) -> LoadedModel:
    """The model ``checkpoint`` (export folder, ``runs:/<id>/model`` or ``mlflow:<id>``) under ``ext``: its
    temperatures and backend replace the export's; ``rope_scaling.method=none`` keeps the export's own scaling
    (a PI/YaRN fine-tune keeps its own)."""
    folder = resolve_reference(checkpoint, tracking_cfg)
    temperature = resolve_temperature(ext.temperature, folder, tracking_cfg)
    return load_model(str(folder), tracking_cfg, temperature=temperature,
                      rope_scaling=None if ext.rope_scaling.method == "none" else ext.rope_scaling,
                      attention_backend=ext.attention_backend)


def resolve_temperature(settings: AttentionTemperature, folder: Path,
                        tracking_cfg: TrackingConfig) -> AttentionTemperature:
    """``settings`` with its ``runs:/`` tables downloaded, its ``log_slope_fit`` read into ``log_slope`` and its
    ``uniform_search`` into ``uniform`` (each refused when the scale-search ran on another model than the export
    ``folder``)."""
    log_slope, uniform = settings.log_slope, settings.uniform
    if settings.log_slope_fit:
        setting = f"extension.temperature.log_slope_fit={settings.log_slope_fit}"
        result = scale_search_for(settings.log_slope_fit, tracking_cfg, weights_fingerprint(folder), setting)
        log_slope = fitted_slope(result, setting)
    if settings.uniform_search:
        setting = f"extension.temperature.uniform_search={settings.uniform_search}"
        result = scale_search_for(settings.uniform_search, tracking_cfg, weights_fingerprint(folder), setting)
        uniform = best_temperature(result, settings.uniform_search_len, setting)
    return dataclasses.replace(settings, uniform=uniform, table=local_file(settings.table, tracking_cfg),
                               log_slope=log_slope, log_slope_table=local_file(settings.log_slope_table, tracking_cfg),
                               log_slope_fit="", uniform_search="", uniform_search_len=0)


def local_file(ref: str, tracking_cfg: TrackingConfig) -> str:
    """A local path for ``ref``: a ``runs:/<run_id>/<artifact path>`` is downloaded, anything else is kept."""
    if not ref.startswith("runs:/"):
        return ref
    run_id, _, path = ref.removeprefix("runs:/").partition("/")
    return str(tracking.download(tracking_cfg, run_id, path))


def read_scale_search(ref: str, tracking_cfg: TrackingConfig) -> ScaleSearchResult:
    """A scale-search result (its ``scale_search.json``) from a run id, ``runs:/<id>`` or a local file."""
    path = Path(ref)
    if not path.is_file():
        run_id = ref.removeprefix("runs:/").split("/")[0]
        path = tracking.download(tracking_cfg, run_id, "scale_search.json")
    return ScaleSearchResult.load(path)


def scale_search_for(ref: str, tracking_cfg: TrackingConfig, fingerprint: str, setting: str) -> ScaleSearchResult:
    """The lambda scale-search result ``ref``, refused when it was run on another model than ``fingerprint``
    (the weights' sha256) or searched iRoPE's beta; ``setting`` names it in the one-line errors."""
    result = read_scale_search(ref, tracking_cfg)
    if result.units == BETA_UNITS:
        raise ValueError(f"{setting} searched iRoPE's beta, not lambda: pass its best beta as "
                         f"extension.temperature.irope_beta, or name a lambda scale-search")
    if result.model_fingerprint != fingerprint:
        raise ValueError(f"{setting} was run on another model (fingerprint {result.model_fingerprint[:12]}, "
                         f"this checkpoint is {fingerprint[:12]}); run scale-search on this checkpoint")
    return result


def best_temperature(result: ScaleSearchResult, target_len: int, setting: str) -> float:
    """The best uniform temperature (units of 1/sqrt(d)) at ``target_len`` of a scale-search ``result``."""
    if target_len not in result.best:
        raise ValueError(f"{setting} has no result for target_len={target_len} (it has "
                         f"{sorted(result.best)}); run scale-search with target_lengths including {target_len}")
    return float(result.best[target_len])


def fitted_slope(result: ScaleSearchResult, setting: str) -> float:
    """The fit ``a`` of ``lambda = 1 + a ln s`` in a scale-search ``result``, >= 0."""
    a = float(result.fit.a)
    if math.isnan(a):
        raise ValueError(f"{setting} has no fit a (it needs per-position best lambdas in >= 2 buckets beyond "
                         f"train_len: search a longer target length)")
    if a < 0:
        raise ValueError(f"{setting} fit a={a:.4g} < 0 (its best temperature falls with position); log-length "
                         f"scaling needs a >= 0")
    return a


def extension_label(ext: ExtensionConfig) -> str:
    """Short name of a setting for run names and tables, e.g. ``plain``, ``lam1.2``, ``lamsearch256`` (a
    scale-search's best lambda at 256 tokens, named like ``logfit`` by where it comes from), ``table``,
    ``log0.3``, ``logfit``, ``logtable``, ``table-past`` (lambda past L only), ``irope0.1`` (``irope0.1f2`` at
    irope_floor 2), ``yarn4``."""
    temperature, parts = ext.temperature, []
    if temperature.uniform != 1.0:
        parts.append(f"lam{temperature.uniform:g}")
    if temperature.uniform_search:
        parts.append(f"lamsearch{temperature.uniform_search_len}")
    if temperature.table:
        parts.append("table")
    if temperature.past_only:
        parts.append("past")
    if temperature.log_slope:
        parts.append(f"log{temperature.log_slope:g}")
    if temperature.log_slope_fit:
        parts.append("logfit")
    if temperature.log_slope_table:
        parts.append("logtable")
    if temperature.irope_beta:
        floor = "" if temperature.irope_floor == 1.0 else f"f{temperature.irope_floor:g}"
        parts.append(f"irope{temperature.irope_beta:g}{floor}")
    if ext.rope_scaling.method != "none":
        parts.append(f"{ext.rope_scaling.method}{ext.rope_scaling.factor:g}")
    return "-".join(parts) or "plain"
