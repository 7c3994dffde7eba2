"""``headscale``'s result (``headscale.json``): the learned (n_layer, n_head) table of one parameterization
(``symbol`` ``lambda``: temperatures in units of 1/sqrt(d); ``a``: HeadScale-log's slopes), how it started
and was bounded, and the converged attention entropy per head (nats) it is plotted against (Fig 5). The file
names the symbol in its keys (``init.<symbol>``, ``<symbol>_floor``) and the table by its tensor name
(``table_key``: ``head_scale`` or ``log_scale``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nope_lightning.results.core import ResultFile

CONVERGED_TAIL = 8  # "converged" entropy: mean over the last 1/8 of a window's positions


@dataclass(frozen=True)
class ConvergedEntropy:
    """Attention entropy (``unit``: nats) per (layer, head) over the ``positions`` a query converged at, and at the
    window's ``last_position`` alone (None in results written before it was logged)."""

    unit: str
    per_head: list
    positions: str
    last_position: list | None = None


@dataclass(frozen=True)
class HeadScaleResult(ResultFile):
    """One HeadScale run: the model (``model_fingerprint``) at ``train_len``, tuned at ``target_len`` tokens for
    ``steps`` steps from ``init_value`` (``init_mode``: ``search``, ``default`` or a number; ``scale_search``:
    the search it read), projected onto ``>= floor`` (``constraint``), on data ``data_mix`` with
    ``retrieval_fraction`` of retrieval sequences; its final validation loss (nats/token) and table."""

    KIND = "headscale"

    checkpoint: str
    model_fingerprint: str
    train_len: int
    target_len: int
    units: str
    symbol: str
    init_mode: str
    init_value: float
    scale_search: str
    constraint: bool
    floor: float
    steps: int
    data_mix: str
    retrieval_fraction: float
    val_loss: float
    table_key: str
    table: list
    converged_entropy: ConvergedEntropy | None = None

    def body(self) -> dict[str, Any]:
        out = {"checkpoint": self.checkpoint, "model_fingerprint": self.model_fingerprint,
               "train_len": self.train_len, "target_len": self.target_len, "units": self.units,
               "init": {"mode": self.init_mode, self.symbol: self.init_value, "scale_search": self.scale_search},
               "constraint": self.constraint, f"{self.symbol}_floor": self.floor, "steps": self.steps,
               "data_mix": {"mode": self.data_mix, "retrieval_fraction": self.retrieval_fraction},
               "val_loss": self.val_loss, self.table_key: self.table}
        if self.converged_entropy is not None:
            entropy = self.converged_entropy
            out["converged_entropy"] = {"unit": entropy.unit, "per_head": entropy.per_head,
                                        "positions": entropy.positions,
                                        **({} if entropy.last_position is None
                                           else {"last_position": entropy.last_position})}
        return out

    @classmethod
    def parse(cls, data: dict[str, Any]) -> HeadScaleResult:
        init = data["init"]
        symbol = next(k for k in init if k not in ("mode", "scale_search"))
        table_key = next(k for k in ("head_scale", "log_scale") if k in data)
        entropy = data.get("converged_entropy")
        return cls(data["checkpoint"], data["model_fingerprint"], data["train_len"], data["target_len"],
                   data["units"], symbol, init["mode"], init[symbol], init["scale_search"], data["constraint"],
                   data[f"{symbol}_floor"], data["steps"], data["data_mix"]["mode"],
                   data["data_mix"]["retrieval_fraction"], data["val_loss"], table_key, data[table_key],
                   None if entropy is None else ConvergedEntropy(entropy["unit"], entropy["per_head"],
                                                                 entropy["positions"], entropy.get("last_position")))
