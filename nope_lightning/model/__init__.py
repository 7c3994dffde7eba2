"""Architecture only: the backbone, attention variants and temperatures, RoPE scaling and analysis probes."""

from nope_lightning.model.gpt import GPT, count_parameters
from nope_lightning.model.temperature import set_temperatures, temperatures

__all__ = ["GPT", "count_parameters", "set_temperatures", "temperatures"]
