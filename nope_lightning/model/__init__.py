"""The model: the backbone, attention variants and temperatures, RoPE scaling and analysis probes, and a trained
model as files (``checkpoint``: exported and loaded back) and as extended for length (``extension``: the
temperatures and RoPE scaling resolved for one model, from the store where they name a run)."""

from nope_lightning.model.gpt import GPT, count_parameters
from nope_lightning.model.temperature import set_temperatures, temperatures

__all__ = ["GPT", "count_parameters", "set_temperatures", "temperatures"]
