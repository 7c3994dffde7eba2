"""Greedy decoding and beam search, with the model's KV cache when it has one (``GPT.kv_cache``).

With the cache, the prompt is run once (prefill) and each new token costs one single-position step over the
cached keys/values; without it (``use_cache=False``, dynamic NTK, or a model that is only ids -> logits)
every token re-runs the whole sequence. Both give the same tokens: the logits agree to float rounding.

No output depends on batch mates. Rows are right-padded, which causal attention hides from every earlier
position; but a model whose logits change with the length of the forward itself (``length_dependent``:
dynamic NTK builds its RoPE table from it) only ever shares a forward with rows of the same length.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from contextlib import nullcontext

import torch


def can_cache(model: torch.nn.Module) -> bool:
    """Whether ``model`` has a KV cache it can use (our GPT, except under dynamic NTK)."""
    return bool(getattr(model, "supports_kv_cache", False))


def length_dependent(model: torch.nn.Module) -> bool:
    """Whether a row's logits may change with the length of the forward that computes them, so that padding
    it to a longer batch mate would change its result: dynamic NTK (its RoPE table follows the forward's
    length; our GPT then has no KV cache) and any model without our KV cache (nothing is known of it)."""
    return not can_cache(model)


def last_logits(model: torch.nn.Module, ids: torch.Tensor, end: torch.Tensor,
                needed: torch.Tensor | None = None) -> torch.Tensor:
    """Logits (B, V) of the positions ``end - 1`` (B,) of ``ids`` (B, T), by full forwards.

    One forward of the longest row, unless the model is ``length_dependent``: then each group of rows with
    the same ``end`` gets its own forward of exactly that length (as each row would alone). ``needed``: a
    bool (B,) mask of the rows wanted; the others may get zeros (finished rows, whose next token nothing
    reads).
    """
    batch = torch.arange(ids.size(0), device=ids.device)
    if not length_dependent(model):
        return model(ids[:, : int(end.max())])[batch, end - 1]
    needed = torch.ones_like(end, dtype=torch.bool) if needed is None else needed
    logits = None
    for length in end[needed].unique().tolist():
        group = batch[needed & (end == length)]
        part = model(ids[group, :length])[:, -1]
        if logits is None:
            logits = part.new_zeros(ids.size(0), part.size(-1))
        logits[group] = part
    return logits


def _stops(eos_id: int | Collection[int] | None) -> torch.Tensor:
    """The stop ids as a long tensor (possibly empty)."""
    if eos_id is None:
        return torch.empty(0, dtype=torch.long)
    return torch.tensor([eos_id] if isinstance(eos_id, int) else sorted(eos_id), dtype=torch.long)


def _suppress(logits: torch.Tensor, stops: torch.Tensor) -> torch.Tensor:
    """``logits`` (B, V) with the stop ids set to -inf (a minimum length, as HF's ``min_length``)."""
    return logits.index_fill(-1, stops.to(logits.device), float("-inf")) if stops.numel() else logits


@torch.no_grad()
def greedy_decode(model: torch.nn.Module, prompts: Sequence[list[int]], max_new_tokens: int, *,
                  vocab_size: int | None = None, eos_id: int | Collection[int] | None = None, pad_id: int = 0,
                  device: torch.device | str = "cpu", min_new_tokens: int = 0, use_cache: bool = True,
                  stop_strings: Sequence[str] = (), decode: Callable[[list[int]], str] | None = None,
                  ) -> list[list[int]]:
    """Greedy continuation of each prompt: ids generated, the stop id included if reached.

    ``model`` maps ids (B, T) to logits (B, T, V >= vocab_size); only the first ``vocab_size`` logits
    compete (the rest is litgpt's padding of the embedding table). Prompts are right-padded and each row
    reads its own last position — causal attention never lets the padding reach it, so prompts of any
    lengths share a batch (module doc for a ``length_dependent`` model); a row stops at a stop id
    (``eos_id``: one id or several), once ``decode`` of its generated ids contains one of ``stop_strings``
    (the tokens up to there are kept; cutting the text is the caller's), or after ``max_new_tokens``
    tokens, and cannot stop before ``min_new_tokens``. ``use_cache``: decode with the model's KV cache if it
    can (``can_cache``); otherwise every step is a full forward.
    """
    stop_strings = [s for s in stop_strings if s]
    if stop_strings and decode is None:
        raise ValueError("stop_strings need decode (ids -> text)")
    batch = len(prompts)
    stops = _stops(eos_id).to(device)
    start = torch.tensor([len(p) for p in prompts], device=device)
    prompt_len = int(start.max())
    ids = torch.full((batch, prompt_len + max_new_tokens), pad_id, dtype=torch.long, device=device)
    for row, prompt in enumerate(prompts):
        ids[row, : len(prompt)] = torch.tensor(prompt, device=device)
    end = start.clone()  # next position to write, per row
    done = torch.zeros(batch, dtype=torch.bool, device=device)
    rows = torch.arange(batch, device=device)
    cached = use_cache and can_cache(model)
    # The last generated token is never fed back, so the cache needs one position less than ``ids``.
    context = model.kv_cache(max(1, ids.size(1) - 1)) if cached and max_new_tokens else nullcontext()
    with context:
        for step in range(max_new_tokens):
            if not cached:
                logits = last_logits(model, ids, end, ~done)
            elif step == 0:  # prefill: every prompt from position 0
                logits = model(ids[:, :prompt_len], input_pos=torch.zeros_like(end))[rows, end - 1]
            else:  # one step: the token each row wrote last, at its position
                logits = model(ids[rows, end - 1][:, None], input_pos=end - 1)[:, 0]
            logits = logits[:, :vocab_size]
            if step < min_new_tokens:
                logits = _suppress(logits, stops)
            token = torch.where(done, pad_id, logits.argmax(-1))
            ids[rows, end] = token  # a finished row writes padding after its stop id, which nothing reads
            end += (~done).long()
            done |= torch.isin(token, stops)
            for row in (~done).nonzero().flatten().tolist() if stop_strings else ():
                text = decode(ids[row, int(start[row]):int(end[row])].tolist())
                done[row] = any(s in text for s in stop_strings)
            if bool(done.all()):
                break
    return [ids[row, s:e].tolist() for row, (s, e) in enumerate(zip(start.tolist(), end.tolist(), strict=True))]


def greedy_generate(model: torch.nn.Module, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                    batch_size: int, vocab_size: int | None = None, **kwargs) -> list[list[int]]:
    """``max_new_tokens`` greedy ids for each prompt, in input order, ``batch_size`` prompts per forward;
    ``kwargs`` go to ``greedy_decode`` (``eos_id``, ``min_new_tokens``, ``use_cache``, ``stop_strings``)."""
    device = next(model.parameters()).device
    out: list[list[int]] = []
    for start in range(0, len(prompts), batch_size):
        out += greedy_decode(model, [list(p) for p in prompts[start:start + batch_size]], max_new_tokens,
                             vocab_size=vocab_size, device=device, **kwargs)
    return out


@torch.no_grad()
def beam_search(model: torch.nn.Module, prompt: Sequence[int], max_new_tokens: int, num_beams: int, *,
                vocab_size: int | None = None, eos_id: int | Collection[int] | None = None,
                min_new_tokens: int = 0, length_penalty: float = 1.0) -> list[int]:
    """The best continuation of one prompt by beam search, as Hugging Face's ``generate(num_beams=k)``.

    Each step expands the k live beams by their top 2k next tokens (log-probabilities, summed); candidates
    ending in a stop id become finished hypotheses scored ``sum_logprob / n_generated ** length_penalty``,
    the best k others stay live. Search ends after ``max_new_tokens`` or once no live beam can beat the
    worst of k finished hypotheses (HF's ``early_stopping=False`` rule). Returns the ids of the best
    hypothesis (its stop id included); ``num_beams=1`` is greedy decoding.
    """
    if num_beams < 1:
        raise ValueError(f"num_beams={num_beams} must be >= 1")
    if num_beams == 1 or max_new_tokens == 0:
        return greedy_generate(model, [prompt], max_new_tokens, 1, vocab_size, eos_id=eos_id,
                               min_new_tokens=min_new_tokens)[0]
    device = next(model.parameters()).device
    stops = _stops(eos_id).to(device)
    stop_list = stops.tolist()
    k, n = num_beams, len(prompt)
    finished: list[tuple[float, list[int]]] = []
    beams: list[list[int]] = [[]]  # generated ids per live beam
    scores = torch.zeros(1, device=device)
    cached = can_cache(model)
    with model.kv_cache(n + max_new_tokens - 1) if cached else nullcontext():
        first = {"input_pos": torch.zeros(1, dtype=torch.long, device=device)} if cached else {}
        logits = model(torch.tensor([list(prompt)], device=device), **first)[:, -1]
        for step in range(max_new_tokens):
            logprobs = logits[:, :vocab_size].float().log_softmax(-1)
            if step < min_new_tokens:
                logprobs = _suppress(logprobs, stops)
            total = (scores[:, None] + logprobs).flatten()
            top, flat = total.topk(min(2 * k, total.numel()))
            width = logprobs.size(-1)
            parents, tokens, live = [], [], []
            for rank, (score, index) in enumerate(zip(top.tolist(), flat.tolist(), strict=True)):
                beam, token = divmod(index, width)
                if token in stop_list:
                    if rank < k:  # as HF: a stop candidate ranked below the k best is dropped
                        finished.append((score / (step + 1) ** length_penalty, beams[beam] + [token]))
                else:
                    parents.append(beam)
                    tokens.append(token)
                    live.append(score)
                if len(live) == k:
                    break
            finished = sorted(finished, key=lambda h: -h[0])[:k]
            beams = [beams[p] + [t] for p, t in zip(parents, tokens, strict=True)]
            scores = torch.tensor(live, device=device)
            if not live:
                break
            best_live = max(live) / (step + 1) ** length_penalty
            if step + 1 == max_new_tokens or (len(finished) == k and finished[-1][0] >= best_live):
                break
            if cached:  # each live beam continues from its parent's cache row
                model.reorder_cache(torch.tensor(parents, device=device))
                positions = torch.full((len(tokens),), n + step, dtype=torch.long, device=device)
                logits = model(torch.tensor(tokens, device=device)[:, None], input_pos=positions)[:, 0]
            else:
                logits = model(torch.tensor([[*prompt, *b] for b in beams], device=device))[:, -1]
    finished += [(s / len(b) ** length_penalty, b) for s, b in zip(scores.tolist(), beams, strict=True)]
    return max(finished, key=lambda h: h[0])[1]
