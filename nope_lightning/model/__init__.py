"""Architecture only: the backbone, attention variants, RoPE scaling and analysis probes."""

from nope_lightning.model.gpt import GPT, count_parameters, head_scales, resolve_temperatures, set_head_scales

__all__ = ["GPT", "count_parameters", "head_scales", "resolve_temperatures", "set_head_scales"]
