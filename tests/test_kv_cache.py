"""KV-cached decoding against full forwards, for every position encoding and temperature setting."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from nope_lightning.config import AttentionTemperature, ModelConfig, RopeScalingConfig
from nope_lightning.eval.generate import beam_search, greedy_decode, greedy_generate
from nope_lightning.model import GPT, set_temperatures

VOCAB = 61

SETTINGS = {
    "nope": dict(pos_encoding="nope"),
    "nope+table": dict(pos_encoding="nope", temperature=AttentionTemperature(1.3)),  # a per-head table is set below
    "rope": dict(pos_encoding="rope"),
    "rope+pi": dict(pos_encoding="rope", rope_scaling=RopeScalingConfig("pi", 4.0)),
    "rope+ntk": dict(pos_encoding="rope", rope_scaling=RopeScalingConfig("ntk", 4.0)),
    "rope+dynamic_ntk": dict(pos_encoding="rope", rope_scaling=RopeScalingConfig("dynamic_ntk", 4.0)),
    "rope+yarn": dict(pos_encoding="rope", rope_scaling=RopeScalingConfig("yarn", 4.0)),
    "rope+yarn_paper": dict(pos_encoding="rope", rope_scaling=RopeScalingConfig("yarn_paper", 4.0)),
    "alibi": dict(pos_encoding="alibi"),
    "t5": dict(pos_encoding="t5"),
    "learned": dict(pos_encoding="learned"),
    "sinusoidal": dict(pos_encoding="sinusoidal"),
    "rope+gqa": dict(pos_encoding="rope", n_query_groups=2),
}


def model_for(setting: str) -> GPT:
    torch.manual_seed(0)
    # train_len 8 with prompts up to 30 tokens: the length-dependent dynamic NTK table changes at every step.
    cfg = ModelConfig(n_layer=2, n_head=4, n_embd=32, intermediate_size=64, max_positions=128, init_std=0.3,
                      **SETTINGS[setting])
    model = GPT(cfg, VOCAB, train_len=8).eval()
    if setting == "nope+table":
        set_temperatures(model, torch.tensor([[0.6, 1.0, 1.8, 2.5], [1.2, 0.8, 3.0, 1.0]]))
    return model


def prompts(seed: int = 1) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (n,), generator=gen).tolist() for n in (30, 9, 17, 1)]


@pytest.mark.parametrize("setting", SETTINGS)
def test_cached_and_uncached_greedy_outputs_are_identical(setting):
    model = model_for(setting)
    cached = greedy_decode(model, prompts(), 24, vocab_size=VOCAB, eos_id=7)
    full = greedy_decode(model, prompts(), 24, vocab_size=VOCAB, eos_id=7, use_cache=False)
    assert cached == full
    assert sum(map(len, cached)) > 40  # real continuations, not empty outputs


@pytest.mark.parametrize("setting", [s for s in SETTINGS if s != "rope+dynamic_ntk"])  # see the next test
def test_cached_logits_equal_full_forward_logits(setting):
    """Prefill a prefix per row, then feed the rest one token at a time at per-row positions: every logit
    equals the full forward's at the same position (rows of different lengths share the batch)."""
    model = model_for(setting)
    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(0, VOCAB, (3, 40), generator=gen)
    prefix = torch.tensor([12, 5, 20])  # each row's prefilled length; then 20 single-token steps per row
    with torch.no_grad():
        with model.kv_cache(40):
            first = model(ids[:, :20], input_pos=torch.zeros(3, dtype=torch.long))
            steps = [model(ids[torch.arange(3), prefix + t][:, None], input_pos=prefix + t)[:, 0]
                     for t in range(40 - 20)]
        got = torch.stack(steps, 1)  # (3, 20, V): row b at positions prefix[b] .. prefix[b] + 19
        rows = [model(ids[b:b + 1, : int(prefix[b]) + 20])[0] for b in range(3)]
    # float32 reductions in another order (one query vs all): differences of ~1e-5 on logits of size ~1-5
    for b in range(3):
        n = int(prefix[b])
        assert torch.allclose(first[b, :n], rows[b][:n], atol=1e-4, rtol=1e-5)
        assert torch.allclose(got[b], rows[b][n:n + 20], atol=1e-4, rtol=1e-5)


def test_dynamic_ntk_decodes_by_full_forwards():
    """Its table follows the current length, so every earlier hidden state changes with each new token (from
    the second layer on, even keys computed before RoPE): no cache can be exact, and none is used."""
    model = model_for("rope+dynamic_ntk")
    assert not model.supports_kv_cache
    with pytest.raises(ValueError, match="dynamic NTK cannot use a KV cache"):
        with model.kv_cache(40):
            pass


def test_dynamic_ntk_generation_does_not_depend_on_batch_mates():
    """Prompts of lengths 30, 9, 17 and 1 decoded four to a batch give the tokens each gives alone: a short row
    is never run padded to a long one, whose length would set its RoPE table."""
    model = model_for("rope+dynamic_ntk")
    alone = greedy_generate(model, prompts(), 12, 1, VOCAB)
    assert greedy_generate(model, prompts(), 12, 4, VOCAB) == alone
    assert all(len(ids) == 12 for ids in alone)


@pytest.mark.parametrize("use_cache", [True, False])
def test_a_stop_string_ends_a_row_where_it_first_appears(use_cache):
    """Text ``,a,b,c,``: a row ends with the token whose text completes the stop string ``,t,`` (its first t);
    rows without t run to the budget. The empty stop string is ignored."""
    model = model_for("rope")
    full = greedy_decode(model, prompts(), 12, vocab_size=VOCAB, use_cache=use_cache)
    token = full[0][4]
    got = greedy_decode(model, prompts(), 12, vocab_size=VOCAB, use_cache=use_cache, stop_strings=["", f",{token},"],
                        decode=lambda ids: "," + ",".join(map(str, ids)) + ",")
    assert got == [ids[: ids.index(token) + 1] if token in ids else ids for ids in full]
    assert len(got[0]) <= 5 < len(full[0])
    with pytest.raises(ValueError, match="stop_strings need decode"):
        greedy_decode(model, prompts(), 2, vocab_size=VOCAB, stop_strings=["x"])


def test_temperature_stays_folded_into_q_on_the_sdpa_path(monkeypatch):
    """A decoding step calls SDPA with the scalar 1/sqrt(d) and q already multiplied by lambda_h."""
    model = model_for("nope+table")
    calls = []
    original = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, scale=None, is_causal=False, **kw):
        calls.append((q.shape, scale))
        return original(q, k, v, attn_mask=attn_mask, scale=scale, is_causal=is_causal, **kw)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    greedy_decode(model, prompts()[:2], 3, vocab_size=VOCAB)
    assert len(calls) == 2 * 3 and {scale for _, scale in calls} == {1 / math.sqrt(8)}
    assert [shape[2] for shape, _ in calls[2:]] == [1] * 4  # the steps after the prefill: one query


def sequence_logprob(model: GPT, prompt: list[int], seq: tuple[int, ...], vocab: int) -> float:
    """Summed log-probability of ``seq`` after ``prompt`` over the first ``vocab`` ids, each token by a full
    forward of the tokens before it (as generation sees it; dynamic NTK's table depends on that length)."""
    with torch.no_grad():
        return sum(model(torch.tensor([prompt + list(seq[:t])]))[0, -1, :vocab].log_softmax(-1)[token].item()
                   for t, token in enumerate(seq))


@pytest.mark.parametrize("setting", ["rope", "rope+dynamic_ntk"])  # cached, and full forwards
def test_beam_search_with_enough_beams_is_exhaustive(setting):
    """With k >= V^(n-1) beams and no stop id, beam search keeps every sequence of n tokens, so it returns
    the argmax of the summed log-probabilities over all V^n continuations (scored here by full forwards)."""
    model, V, n = model_for(setting), 4, 3
    prompt = prompts()[1]
    best = max(itertools.product(range(V), repeat=n), key=lambda seq: sequence_logprob(model, prompt, seq, V))
    assert beam_search(model, prompt, n, V ** (n - 1), vocab_size=V) == list(best)


def test_beam_search_scores_finished_hypotheses_per_generated_token():
    """Ids {0, 1, 2}, 2 the stop id, 3 new tokens at most, 12 beams (more than all candidates of any step, so
    nothing is pruned): the result is the argmax of sum_logprob / length over every hypothesis — those
    ending in the stop id after 1-3 tokens and the unfinished ones of 3 tokens."""
    model, V, stop = model_for("alibi"), 3, 2
    prompt = prompts()[3]
    hypotheses = [seq for n in (1, 2, 3) for seq in itertools.product(range(V), repeat=n)
                  if stop not in seq[:-1] and (seq[-1] == stop or n == 3)]
    best = max(hypotheses, key=lambda seq: sequence_logprob(model, prompt, seq, V) / len(seq))
    assert beam_search(model, prompt, 3, 12, vocab_size=V, eos_id=stop) == list(best)


def test_beam_search_with_one_beam_is_greedy_and_rejects_zero_beams():
    model = model_for("alibi")
    prompt = prompts()[0]
    assert beam_search(model, prompt, 12, 1, vocab_size=VOCAB) == greedy_decode(model, [prompt], 12,
                                                                               vocab_size=VOCAB)[0]
    with pytest.raises(ValueError, match="num_beams=0 must be >= 1"):
        beam_search(model, prompt, 12, 0, vocab_size=VOCAB)


def test_min_new_tokens_and_several_stop_ids():
    model = model_for("t5")
    prompt = prompts()[0]
    first = greedy_decode(model, [prompt], 1, vocab_size=VOCAB)[0][0]
    # Stopping at the first token unless it is suppressed for one step.
    assert greedy_decode(model, [prompt], 5, vocab_size=VOCAB, eos_id={first, 60}) == [[first]]
    held = greedy_decode(model, [prompt], 5, vocab_size=VOCAB, eos_id={first, 60}, min_new_tokens=1)[0]
    assert held[0] != first and len(held) >= 2
    assert greedy_decode(model, [prompt], 5, vocab_size=VOCAB, eos_id={first, 60}, min_new_tokens=1,
                         use_cache=False)[0] == held


def test_cache_longer_than_the_model_is_refused():
    model = model_for("nope")
    with pytest.raises(ValueError, match="exceeds model.max_positions=128"):
        with model.kv_cache(129):
            pass
