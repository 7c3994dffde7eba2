"""lm-evaluation-harness adapter: our models as the harness model ``nope-lightning``.

Importing this module registers the model. lm-eval discovers no third-party models by itself, so its CLI
runs through this module::

    python -m nope_lightning.eval.harness --model nope-lightning \\
        --model_args checkpoint=runs:/<id>/model,temperature=1.2 --tasks arc_easy,hellaswag,piqa

``model_args`` are ``checkpoint`` plus any evaluation-time setting of ``ExtensionConfig`` (``temperature``,
``temperature_table``, ``rope_scaling.method``, ``rope_scaling.factor``, ...), ``tracking.uri`` for a
``runs:/`` checkpoint, and ``max_length`` (default: the model's ``max_positions``). In Python,
``run_harness`` evaluates a loaded model and returns flat metrics.

Scoring conventions: every sequence starts with BOS, as every training document does (an empty context is
BOS alone); a context longer than the window keeps its last tokens; ``loglikelihood_rolling`` scores a
document in disjoint windows of ``max_length`` predicted tokens, each conditioned on the tokens before it up
to the window (the harness's ``get_rolling_token_windows``); ``generate_until`` is greedy (KV-cached),
stops at EOS, and is cut at the first ``until`` string.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from nope_lightning.eval.generate import greedy_generate


@register_model("nope-lightning")
class NopeLightningLM(TemplateLM):
    """A loaded GPT and its tokenizer (``encode``/``decode``, ``bos_id``, ``eos_id``, ``vocab_size``).

    ``batch_size`` sequences per forward; ``max_length`` tokens per forward (0: ``max_positions``).
    """

    def __init__(self, model: torch.nn.Module, tokenizer, batch_size: int = 1, max_length: int = 0) -> None:
        super().__init__()
        self.model, self.tokenizer = model.eval(), tokenizer
        self.batch_size = int(batch_size)
        self.max_length = int(max_length) or model.cfg.max_positions
        self._device = next(model.parameters()).device

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None) -> NopeLightningLM:
        from lm_eval.utils import simple_parse_args_string

        return cls.from_settings(**simple_parse_args_string(arg_string), **(additional_config or {}))

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None) -> NopeLightningLM:
        return cls.from_settings(**arg_dict, **(additional_config or {}))

    @classmethod
    def from_settings(cls, checkpoint: str = "", batch_size: Any = 1, max_length: int = 0, device: Any = None,
                      **settings: Any) -> NopeLightningLM:
        """Load ``checkpoint`` with extension ``settings`` (``temperature=1.2``, ``rope_scaling.factor=4``,
        ``tracking.uri=...``); ``device`` (e.g. ``cuda``) defaults to the CPU."""
        from omegaconf import OmegaConf

        from nope_lightning.checkpoint import load_model
        from nope_lightning.config import ExtensionConfig, TrackingConfig
        from nope_lightning.data import TextTokenizer
        from nope_lightning.stages.evaluate import extension_overrides

        if not checkpoint:
            raise ValueError("nope-lightning model_args need checkpoint=<export folder | runs:/<id>/model>")
        settings = {k: v for k, v in settings.items() if v is not None and k != "max_batch_size"}
        tracking = {k.removeprefix("tracking."): v for k, v in settings.items() if k.startswith("tracking.")}
        extension = [f"{k}={v}" for k, v in settings.items() if not k.startswith("tracking.")]
        ext = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ExtensionConfig),
                                                  OmegaConf.from_dotlist(extension)))
        tracking_cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TrackingConfig), tracking))
        loaded = load_model(checkpoint, tracking_cfg, **extension_overrides(ext, tracking_cfg, checkpoint))
        model = loaded.model.to(device or "cpu")
        size = 1 if str(batch_size).startswith("auto") else int(batch_size)
        return cls(model, TextTokenizer.load(loaded.tokenizer_file), size, int(max_length))

    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_id

    @property
    def prefix_token_id(self) -> int:
        return self.tokenizer.bos_id

    @property
    def device(self) -> torch.device:
        return self._device

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        """Ids of ``string``, BOS first unless ``add_special_tokens=False``."""
        ids = self.tokenizer.encode(string)
        return ids if add_special_tokens is False else [self.tokenizer.bos_id, *ids]

    def tok_decode(self, tokens: Sequence[int], **kwargs) -> str:
        return self.tokenizer.decode(list(tokens))

    @torch.no_grad()
    def _score(self, pairs: Sequence[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        """(sum of log p(continuation | context), whether it is the greedy continuation) per pair, with
        the input cut to its last ``max_length`` tokens; ``batch_size`` right-padded rows per forward."""
        out = []
        vocab = self.tokenizer.vocab_size
        for start in range(0, len(pairs), self.batch_size):
            chunk = pairs[start:start + self.batch_size]
            inputs = [(ctx + cont)[-(self.max_length + 1):][:-1] for ctx, cont in chunk]
            ids = torch.zeros(len(chunk), max(map(len, inputs)), dtype=torch.long)
            for row, seq in enumerate(inputs):
                ids[row, : len(seq)] = torch.tensor(seq)
            logprobs = self.model(ids.to(self.device))[..., :vocab].float().log_softmax(-1)
            for row, ((_, cont), seq) in enumerate(zip(chunk, inputs, strict=True)):
                # The continuation's tokens are predicted at the last len(cont) positions of the input.
                rows = logprobs[row, len(seq) - len(cont): len(seq)]
                target = torch.tensor(cont, device=self.device)
                out.append((rows.gather(-1, target[:, None]).sum().item(), bool((rows.argmax(-1) == target).all())))
        return out

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        return self._score([(ctx, cont) for _, ctx, cont in requests])

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        totals = []
        for request in requests:
            (text,) = request.args
            windows = [make_disjoint_window(w) for w in get_rolling_token_windows(
                self.tok_encode(text, add_special_tokens=False), self.prefix_token_id, self.max_length, 1)]
            totals.append(sum(score for score, _ in self._score(windows)))
        return totals

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        out = []
        for request in requests:
            context, gen_kwargs = request.args
            if gen_kwargs.get("do_sample") or gen_kwargs.get("temperature", 0.0) > 0:
                raise ValueError("nope-lightning generates greedily only (do_sample=False, temperature=0)")
            until = gen_kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            budget = int(gen_kwargs.get("max_gen_toks", 256))
            prompt = self.tok_encode(context)[-(self.max_length - budget):]
            generated = greedy_generate(self.model, [prompt], budget, 1, self.tokenizer.vocab_size,
                                        eos_id=self.tokenizer.eos_id)[0]
            text = self.tok_decode(generated)
            for stop in until:
                text = text.split(stop)[0]
            out.append(text)
        return out


def run_harness(model: torch.nn.Module, tokenizer, tasks: Sequence[str], *, include_path: str | None = None,
                batch_size: int = 1, limit: int | None = None, num_fewshot: int | None = None) -> dict[str, float]:
    """Run harness ``tasks`` on a loaded model; flat metrics ``harness/{task}/{metric}`` (stderr dropped).

    ``include_path``: a folder of extra task YAMLs (local-file tasks). An unknown task name is a one-line
    ValueError before anything runs.
    """
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=include_path)
    unknown = [t for t in tasks if t not in manager.all_tasks]
    if unknown:
        raise ValueError(f"lm-evaluation-harness has no task(s) {', '.join(unknown)}"
                         + (f" (searched the built-in tasks and {include_path})" if include_path else ""))
    results = simple_evaluate(model=NopeLightningLM(model, tokenizer, batch_size), tasks=list(tasks),
                              task_manager=manager, limit=limit, num_fewshot=num_fewshot)["results"]
    return {f"harness/{task}/{name.split(',')[0]}": float(value) for task, metrics in results.items()
            for name, value in metrics.items() if "stderr" not in name and isinstance(value, int | float)}


def main() -> None:
    """lm-eval's command line with ``nope-lightning`` registered."""
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()


if __name__ == "__main__":
    main()
