"""Passkey retrieval scored (the paper §4.3): greedy answers to the prompts of ``data/passkey.py``, a model
passes when its answer is exactly the key's tokens; accuracy per length and per (length, depth) cell, and
``evaluate``'s passkey part with its intervals."""

from __future__ import annotations

import re
import sys
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from nope_lightning.config.stages import EvaluateConfig
from nope_lightning.data.passkey import (
    PasskeyPromptBuilder,
    PasskeySample,
    continuation_encoder,
    make_passkey_samples,
)
from nope_lightning.eval.generate import greedy_generate
from nope_lightning.numerics.stats import wilson
from nope_lightning.results.passkey import PasskeyCell, PasskeyOutcome, PasskeyResults


def score_passkey(generated_text: str, key: str) -> bool:
    """True when the first integer in the generated continuation equals the key (the reference's check)."""
    match = re.search(r"\d+", generated_text)
    return match is not None and int(match.group()) == int(key)


def score_passkey_tokens(generated_ids: Sequence[int], key_ids: Sequence[int]) -> bool:
    """True when the continuation starts with exactly the key's tokens, ``key_ids = encode(" " + key)`` (the
    ids the prompt holds at ``key_token_start``): an exact match, where the first-integer check would also
    pass a longer number or a key given with extra digits split off."""
    return list(generated_ids[: len(key_ids)]) == list(key_ids)


def answer_ids(tokenizer, key: str) -> list[int]:
    """The tokens a correct answer starts with: the key as it follows "is" (`` " " + key`` encoded as running
    text, ``continuation_encoder``: the ids the prompt holds at ``key_token_start``, also for a SentencePiece
    tokenizer, whose plain encode would mark a start of text)."""
    return continuation_encoder(tokenizer)(f" {key}")


def answer_passkeys(model, tokenizer, samples: Sequence[PasskeySample], max_new_tokens: int,
                    batch_size: int) -> list[bool]:
    """Greedy answers (KV-cached), one batch per length, to ``samples``; ``correct[i]`` for ``samples[i]`` is an
    exact match of the key's tokens (``score_passkey_tokens``: a longer number or a stray digit fails, unlike
    a first-integer check)."""
    correct = [False] * len(samples)
    for length in sorted({s.length for s in samples}):
        rows = [i for i, s in enumerate(samples) if s.length == length]
        generated = greedy_generate(model, [samples[i].input_ids for i in rows], max_new_tokens, batch_size,
                                    tokenizer.vocab_size)
        for i, ids in zip(rows, generated, strict=True):
            correct[i] = score_passkey_tokens(ids, answer_ids(tokenizer, samples[i].key))
    return correct


@torch.no_grad()
def key_nll(model, tokenizer, samples: Sequence[PasskeySample], batch_size: int) -> list[float]:
    """Teacher-forced NLL of each sample's answer, nats per answer token: the mean of ``-log p(key token j |
    prompt, key tokens < j)`` over ``answer_ids``. What greedy accuracy hides: how far a wrong answer was from
    the key, and how much a temperature that keeps the answer costs its confidence. Prompts + answers are
    right-padded in batches (causal attention hides the padding from every scored position); only the first
    ``vocab_size`` logits compete, as in decoding."""
    device = next(model.parameters()).device
    out: list[float] = []
    for start in range(0, len(samples), batch_size):
        batch = samples[start:start + batch_size]
        rows = [(list(s.input_ids), answer_ids(tokenizer, s.key)) for s in batch]
        width = max(len(p) + len(a) for p, a in rows)
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        for i, (prompt, answer) in enumerate(rows):
            ids[i, : len(prompt) + len(answer)] = torch.tensor(prompt + answer)
        logp = torch.log_softmax(model(ids.to(device))[..., : tokenizer.vocab_size].float(), dim=-1)
        for i, (prompt, answer) in enumerate(rows):
            at = torch.arange(len(prompt) - 1, len(prompt) + len(answer) - 1, device=device)
            out.append(-float(logp[i, at, torch.tensor(answer, device=device)].mean()))
    return out


@dataclass(frozen=True)
class PasskeyAccuracy:
    """Fraction of correct answers per (length, depth) cell, per length, and overall."""

    by_cell: dict[tuple[int, float], float]
    by_length: dict[int, float]
    overall: float

    def metrics(self, prefix: str = "passkey") -> dict[str, float]:
        """Flat metric names: ``{prefix}/len{L}/acc`` and ``{prefix}/len{L}/depth{percent}/acc``."""
        out = {f"{prefix}/len{length}/acc": acc for length, acc in self.by_length.items()}
        out.update({f"{prefix}/len{length}/depth{round(depth * 100)}/acc": acc
                    for (length, depth), acc in self.by_cell.items()})
        return out


def passkey_accuracy(samples: Sequence[PasskeySample], correct: Sequence[bool]) -> PasskeyAccuracy:
    """Aggregate per-sample results (``correct[i]`` for ``samples[i]``); lengths and cells keep sample order."""
    if len(samples) != len(correct) or not samples:
        raise ValueError(f"need one result per sample and at least one sample: got {len(samples)} samples "
                         f"and {len(correct)} results")
    cells: dict[tuple[int, float], list[bool]] = defaultdict(list)
    lengths: dict[int, list[bool]] = defaultdict(list)
    for sample, ok in zip(samples, correct, strict=True):
        cells[sample.length, sample.depth].append(bool(ok))
        lengths[sample.length].append(bool(ok))
    return PasskeyAccuracy({cell: _mean(v) for cell, v in cells.items()},
                           {length: _mean(v) for length, v in lengths.items()}, _mean(list(map(bool, correct))))


def _mean(values: Sequence[bool]) -> float:
    return sum(values) / len(values)


def passkey_samples(tokenizer, lengths: list[int], cfg: EvaluateConfig) -> list[PasskeySample]:
    """``evaluate``'s passkey grid: lengths x ``passkey_depths`` depths (0, 1/n, ...) x ``passkey_keys`` keys, BOS
    first, the keys drawn from the split (``<split>-<seed>``); lengths that cannot hold the prompt's fixed parts
    are skipped with one warning line."""
    shortest = PasskeyPromptBuilder(tokenizer, [tokenizer.bos_id], cfg.passkey_prompt).min_length()
    fitting = [n for n in lengths if n >= shortest]
    if len(fitting) < len(lengths):
        print(f"evaluate: passkey skipped at lengths {[n for n in lengths if n < shortest]}: the "
              f"{cfg.passkey_prompt} prompt needs {shortest} tokens", file=sys.stderr)
    depths = [i / cfg.passkey_depths for i in range(cfg.passkey_depths)]
    return make_passkey_samples(tokenizer, fitting, depths, cfg.passkey_keys, f"{cfg.split}-{cfg.seed}",
                                [tokenizer.bos_id], cfg.passkey_prompt)


def run_passkey(model, tokenizer, samples: list[PasskeySample],
                cfg: EvaluateConfig) -> tuple[PasskeyResults, dict[str, float]]:
    """``evaluate``'s passkey part: ``(results, metrics)`` with the accuracy per length (and its Wilson
    interval), per (length, depth), and every prompt's outcome with its answer's token count and teacher-forced key
    NLL (``key_nll``; mean per length as ``passkey/len{L}/key_nll``); the report pairs methods on the same prompts,
    and says where each length's answer falls relative to L."""
    correct = answer_passkeys(model, tokenizer, samples, cfg.max_new_tokens, cfg.batch_size)
    nll = key_nll(model, tokenizer, samples, cfg.batch_size)
    accuracy = passkey_accuracy(samples, correct)
    counts = Counter(s.length for s in samples)
    intervals = {n: wilson(round(acc * counts[n]), counts[n]) for n, acc in accuracy.by_length.items()}
    section = PasskeyResults(
        cfg.passkey_prompt, accuracy.by_length, accuracy.overall, {n: (i.low, i.high) for n, i in intervals.items()},
        [PasskeyCell(length, depth, acc) for (length, depth), acc in accuracy.by_cell.items()],
        [PasskeyOutcome(s.length, s.depth, s.key, bool(ok), len(answer_ids(tokenizer, s.key)), loss)
         for s, ok, loss in zip(samples, correct, nll, strict=True)])
    metrics = accuracy.metrics("passkey")
    metrics.update({f"passkey/len{n}/key_nll": v for n, v in section.key_nll_by_length().items()})
    return section, metrics
