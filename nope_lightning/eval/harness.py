"""lm-evaluation-harness adapter: our models as the harness model ``nope-lightning``, and its command line.

Importing this module registers the model. lm-eval discovers no third-party models by itself, so its command
line runs through ours, which takes lm-eval's own arguments (``nope-lightning harness --help``)::

    nope-lightning harness --model_args checkpoint=runs:/<id>/model,temperature.uniform=1.2 --tasks arc_easy,piqa

``--model nope-lightning`` is the default, and so is the device: CUDA when available, else the CPU (lm-eval's
command line would otherwise pass ``cuda:0``, which a CPU-only machine lacks). stdout is lm-eval's results table and nothing else;
its logs go to stderr. ``model_args`` are ``checkpoint`` plus any evaluation-time setting of
``ExtensionConfig`` (``temperature.uniform``, ``temperature.table``, ``temperature.log_slope``,
``rope_scaling.method``, ``rope_scaling.factor``, ...), ``tracking.uri`` for a ``runs:/`` checkpoint, and ``max_length`` (default:
the model's ``max_positions``). In Python, ``run_harness`` evaluates a loaded model and returns flat
metrics; ``check_harness_tasks`` checks task names before any compute.

Scoring conventions: every sequence starts with BOS, as every training document does (an empty context is
BOS alone); a context longer than the window keeps its last tokens; ``loglikelihood_rolling`` scores a
document in disjoint windows of ``max_length`` predicted tokens, each conditioned on the tokens before it up
to the window (the harness's ``get_rolling_token_windows``); ``generate_until`` is greedy (KV-cached) and
reads its generation settings as lm-eval's Hugging Face model (``HFLM``) does. No score depends on the
other requests in its batch (``generate.length_dependent``): dynamic NTK rows never share a forward with a
row of another length.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from lm_eval._cli import HarnessCLI
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.config.evaluate_config import EvaluatorConfig
from lm_eval.models.utils import normalize_gen_kwargs
from lm_eval.utils import (
    get_rolling_token_windows,
    make_disjoint_window,
    setup_logging,
    simple_parse_args_string,
)
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from nope_lightning.config.parts import TrackingConfig
from nope_lightning.config.stages import ExtensionConfig
from nope_lightning.data.tokenizer import TextTokenizer
from nope_lightning.eval.generate import greedy_generate, length_dependent
from nope_lightning.model.extension import load_extended
from nope_lightning.runtime import quiet

#: Generation settings that only matter when sampling: under greedy decoding they change nothing, and
#: Hugging Face's ``generate`` (which HFLM calls) ignores them there too.
SAMPLING_ONLY = frozenset({"temperature", "top_p", "top_k", "min_p"})


def resolve_device(device: str | None) -> torch.device:
    """The device to evaluate on: ``device``, or CUDA when available and the CPU otherwise (HFLM's default).

    Unlike HFLM, which quietly falls back when the named device is missing, a device this machine does not
    have is a one-line ``ValueError`` naming the fix, raised before any model is loaded.
    """
    if not device:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        chosen = torch.device(device)
        torch.empty(0, device=chosen)  # raises where the device does not exist (a CPU-only torch asserts)
    except (RuntimeError, AssertionError) as err:
        cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
        raise ValueError(f"device {device!r} cannot be used here ({' '.join(str(err).split())}; this machine "
                         f"has {cuda} CUDA device(s)): leave --device out (CUDA when available, else the CPU) "
                         f"or pass --device cpu") from None
    return chosen


@register_model("nope-lightning")
class NopeLightningLM(TemplateLM):
    """A loaded GPT and its tokenizer (``encode``/``decode``, ``bos_id``, ``eos_id``, ``vocab_size``).

    ``batch_size`` sequences per forward; ``max_length`` tokens per forward (0: ``max_positions``).
    """

    max_gen_toks = 256  # HFLM's default generation budget

    def __init__(self, model: torch.nn.Module, tokenizer, batch_size: int = 1, max_length: int = 0) -> None:
        super().__init__()
        self.model, self.tokenizer = model.eval(), tokenizer
        self.batch_size = int(batch_size)
        self.max_length = int(max_length) or model.cfg.max_positions
        self._device = next(model.parameters()).device

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None) -> NopeLightningLM:
        return cls.from_settings(**simple_parse_args_string(arg_string), **(additional_config or {}))

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None) -> NopeLightningLM:
        return cls.from_settings(**arg_dict, **(additional_config or {}))

    @classmethod
    def from_settings(cls, checkpoint: str = "", batch_size: Any = 1, max_length: int = 0, device: Any = None,
                      **settings: Any) -> NopeLightningLM:
        """Load ``checkpoint`` with extension ``settings`` (``temperature.uniform=1.2``, ``rope_scaling.factor=4``,
        ``tracking.uri=...``) onto ``device`` (``resolve_device``: by default CUDA when available, else the CPU)."""
        if not checkpoint:
            raise ValueError("nope-lightning model_args need checkpoint=<export folder | runs:/<id>/model>")
        target = resolve_device(device)
        settings = {k: v for k, v in settings.items() if v is not None and k != "max_batch_size"}
        tracking = {k.removeprefix("tracking."): v for k, v in settings.items() if k.startswith("tracking.")}
        extension = [f"{k}={v}" for k, v in settings.items() if not k.startswith("tracking.")]
        try:
            ext = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ExtensionConfig),
                                                      OmegaConf.from_dotlist(extension)))
            tracking_cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TrackingConfig), tracking))
        except OmegaConfBaseException as err:
            raise ValueError(f"nope-lightning model_args: {str(err).splitlines()[0]}; they take checkpoint, "
                             f"max_length, tracking.* and the extension settings (temperature.uniform, "
                             f"temperature.table, rope_scaling.method, ...)") from None
        loaded = load_extended(checkpoint, ext, tracking_cfg)
        size = 1 if str(batch_size).startswith("auto") else int(batch_size)
        return cls(loaded.model.to(target), TextTokenizer.load(loaded.tokenizer_file), size, int(max_length))

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

    def _batches(self, lengths: Sequence[int]) -> list[list[int]]:
        """Indices of ``batch_size`` inputs per forward, longest first (HFLM's order: the least padding).
        For a ``length_dependent`` model (dynamic NTK) a batch holds inputs of one length only."""
        exact = length_dependent(self.model)
        batches: list[list[int]] = []
        for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
            last = batches[-1] if batches else []
            if last and len(last) < self.batch_size and not (exact and lengths[last[0]] != lengths[i]):
                last.append(i)
            else:
                batches.append([i])
        return batches

    @torch.no_grad()
    def _score(self, pairs: Sequence[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        """(sum of log p(continuation | context), whether it is the greedy continuation) per pair, with
        the input cut to its last ``max_length`` tokens; ``batch_size`` right-padded rows per forward."""
        long = [len(cont) for _, cont in pairs if len(cont) > self.max_length]
        if long:  # HFLM asserts this
            raise ValueError(f"a continuation of {max(long)} tokens exceeds max_length={self.max_length}")
        inputs = [(ctx + cont)[-(self.max_length + 1):][:-1] for ctx, cont in pairs]
        out: list[tuple[float, bool]] = [(0.0, False)] * len(pairs)
        vocab = self.tokenizer.vocab_size
        for batch in self._batches([len(seq) for seq in inputs]):
            ids = torch.zeros(len(batch), len(inputs[batch[0]]), dtype=torch.long)
            for row, i in enumerate(batch):
                ids[row, : len(inputs[i])] = torch.tensor(inputs[i])
            logprobs = self.model(ids.to(self.device))[..., :vocab].float().log_softmax(-1)
            for row, i in enumerate(batch):
                # The continuation's tokens are predicted at the last len(cont) positions of the input.
                cont, n = pairs[i][1], len(inputs[i])
                rows = logprobs[row, n - len(cont): n]
                target = torch.tensor(cont, device=self.device)
                out[i] = (rows.gather(-1, target[:, None]).sum().item(), bool((rows.argmax(-1) == target).all()))
        return out

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        return self._score([(ctx, cont) for _, ctx, cont in requests])

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Every document's windows scored together (as HFLM batches them), summed per document."""
        windows, owner = [], []
        for n, request in enumerate(requests):
            (text,) = request.args
            for window in get_rolling_token_windows(self.tok_encode(text, add_special_tokens=False),
                                                    self.prefix_token_id, self.max_length, 1):
                windows.append(make_disjoint_window(window))
                owner.append(n)
        totals = [0.0] * len(requests)
        for n, (score, _) in zip(owner, self._score(windows), strict=True):
            totals[n] += score
        return totals

    def generation_settings(self, gen_kwargs: dict) -> tuple[list[str], int]:
        """(stop strings, new-token budget) of a request, read as HFLM reads them.

        lm-eval's ``normalize_gen_kwargs``: ``until`` a string or a list, ``max_gen_toks`` (or an alias)
        defaulting to 256, greedy when ``do_sample`` is False, or unset with ``temperature`` 0. So lm-eval's
        LongBench tasks (``temperature: 1, do_sample: False``) are greedy, as in HFLM. Sampling
        (``do_sample`` True, or a temperature > 0 without it) and other generation settings (``num_beams``
        ...) are refused in one line; empty stop strings are ignored, as lm-eval's post-processing ignores
        them. The budget must leave room for a prompt in ``max_length`` (HFLM asserts this).
        """
        kwargs = normalize_gen_kwargs(gen_kwargs, self.max_gen_toks)
        if kwargs["do_sample"]:
            raise ValueError("nope-lightning generates greedily only: set do_sample=False in the task's "
                             "generation_kwargs or --gen_kwargs (its temperature is then ignored)")
        other = sorted(set(kwargs) - SAMPLING_ONLY - {"do_sample", "until", "max_gen_toks"})
        if other:
            raise ValueError(f"nope-lightning supports no generation setting(s) {', '.join(other)} "
                             f"(greedy decoding: until, max_gen_toks, do_sample=False)")
        budget = kwargs["max_gen_toks"]
        if budget >= self.max_length:
            raise ValueError(f"max_gen_toks={budget} leaves no room for a prompt in max_length={self.max_length}: "
                             f"lower max_gen_toks (--gen_kwargs max_gen_toks=N)")
        return [stop for stop in kwargs["until"] if stop], budget

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy continuations, ``batch_size`` per forward among requests with the same settings; each prompt
        is BOS + the context, its first tokens cut to leave room for the budget (HFLM's left truncation);
        generation stops at EOS or once a stop string appears, and the text is cut at the first stop string."""
        out = [""] * len(requests)
        groups: dict[str, list[int]] = {}
        for n, request in enumerate(requests):
            groups.setdefault(json.dumps(request.args[1], sort_keys=True, default=str), []).append(n)
        for members in groups.values():
            until, budget = self.generation_settings(requests[members[0]].args[1])
            prompts = {n: self.tok_encode(requests[n].args[0])[-(self.max_length - budget):] for n in members}
            order = sorted(members, key=lambda n: -len(prompts[n]))
            generated = greedy_generate(self.model, [prompts[n] for n in order], budget, self.batch_size,
                                        self.tokenizer.vocab_size, eos_id=self.tokenizer.eos_id,
                                        stop_strings=until, decode=self.tok_decode)
            for n, ids in zip(order, generated, strict=True):
                text = self.tok_decode(ids)
                for stop in until:
                    text = text.split(stop)[0]
                out[n] = text
        return out


@functools.lru_cache(maxsize=4)
def task_manager(include_path: str | None = None):
    """lm-eval's ``TaskManager`` (built-in tasks plus ``include_path``), built once per process: indexing
    the ~15,000 built-in tasks takes about 10 s, and the check before compute and the run share it."""
    # Imported here: lm_eval.tasks costs about a second to import, paid only by runs that name tasks.
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=include_path)


def check_harness_tasks(tasks: Sequence[str], include_path: str | None = None) -> None:
    """Raise one line, before any compute, if ``include_path`` is not a folder or a task name is unknown to
    lm-eval (its built-in tasks, groups and tags, plus the task YAMLs under ``include_path``)."""
    if include_path and not Path(include_path).is_dir():
        raise FileNotFoundError(f"harness_include={include_path}: no such folder; point it at a folder of "
                                f"lm-eval task YAMLs")
    known = task_manager(include_path or None).all_tasks
    unknown = [t for t in tasks if t not in known]
    if unknown:
        raise ValueError(f"lm-evaluation-harness has no task(s) {', '.join(unknown)}"
                         + (f" (searched the built-in tasks and {include_path})" if include_path else "")
                         + "; `nope-lightning harness ls tasks` lists them, and a folder of task YAMLs is "
                           "added with harness_include=<folder>")


def run_harness(model: torch.nn.Module, tokenizer, tasks: Sequence[str], *, include_path: str | None = None,
                batch_size: int = 1, limit: int | None = None, num_fewshot: int | None = None) -> dict[str, float]:
    """Run harness ``tasks`` on a loaded model; flat metrics ``harness/{task}/{metric}`` (stderr dropped).

    ``include_path``: a folder of extra task YAMLs (local-file tasks). Bad names are refused first
    (``check_harness_tasks``).
    """
    # Imported here: lm_eval.evaluator costs about a second to import, paid only by runs that name tasks.
    from lm_eval import simple_evaluate

    check_harness_tasks(tasks, include_path)
    quiet.lm_eval_git()
    results = simple_evaluate(model=NopeLightningLM(model, tokenizer, batch_size), tasks=list(tasks),
                              task_manager=task_manager(include_path or None), limit=limit,
                              num_fewshot=num_fewshot)["results"]
    return {f"harness/{task}/{name.split(',')[0]}": float(value) for task, metrics in results.items()
            for name, value in metrics.items() if "stderr" not in name and isinstance(value, int | float)}


def main(argv: Sequence[str] | None = None) -> int:
    """``nope-lightning harness [lm_eval arguments]``: lm-eval's command line with our model registered.

    As ``lm_eval`` (``run`` is implied, ``ls`` and ``validate`` pass through; ``--help`` is ``run``'s), with
    ``--model nope-lightning`` and ``--device`` (CUDA when available, else the CPU) filled in where neither
    the command line nor ``--config`` names them. A bad device, task or model argument is one line on stderr
    (exit 2).
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if args in (["-h"], ["--help"]):
        args = ["run", "--help"]
    quiet.install()
    quiet.lm_eval_git()
    setup_logging()  # lm-eval's logger, on stderr (as its own command line sets it up)
    cli = HarnessCLI()
    saved, sys.argv = sys.argv, ["nope-lightning harness", *args]  # lm-eval parses sys.argv
    try:
        ns = cli.parse_args()
        if getattr(ns, "command", None) == "run":
            from_yaml = EvaluatorConfig.load_yaml_config(ns.config) if ns.config else {}
            ns.model = ns.model or from_yaml.get("model") or "nope-lightning"
            ns.device = str(resolve_device(ns.device or from_yaml.get("device")))
        cli.execute(ns)
    except (ValueError, FileNotFoundError) as err:
        message = " ".join(str(err).split())
        if message.startswith("Tasks not found"):  # lm-eval's own check, which names no way out
            message += "; `nope-lightning harness ls tasks` lists them, --include_path <folder> adds task YAMLs"
        print(f"nope-lightning harness: error: {message}", file=sys.stderr)
        return 2
    finally:
        sys.argv = saved
    return 0


if __name__ == "__main__":
    sys.exit(main())
