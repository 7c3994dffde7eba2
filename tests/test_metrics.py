"""Metrics against independent references: F.cross_entropy, hand loops and naive full-matrix attention."""

import math

import pytest
import torch
import torch.nn.functional as F
from torchmetrics.text import Perplexity

from nope_lightning.numerics.metrics import (
    AttentionEntropy,
    WindowSums,
    attention_entropy_from_qk,
    bucket_mean,
    position_buckets,
    token_nll,
)

torch.set_num_threads(1)


def causal_probs(B: int, H: int, T: int, generator: torch.Generator, sharpness: float = 3.0) -> torch.Tensor:
    """Random causal attention probabilities (B, H, T, T), zero above the diagonal."""
    logits = sharpness * torch.randn(B, H, T, T, generator=generator, dtype=torch.float64)
    return logits.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)


def entropy_by_hand(probs: torch.Tensor) -> torch.Tensor:
    """-sum_{j<=i} p log p, looping over rows, skipping exact zeros: (B, H, T) float64."""
    B, H, T, _ = probs.shape
    out = torch.zeros(B, H, T, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            for i in range(T):
                row = probs[b, h, i, :i + 1].double()
                row = row[row > 0]
                out[b, h, i] = -(row * row.log()).sum()
    return out


# ---- token_nll and per-window sums --------------------------------------------------------------------------

def window_nll(logits, targets, mask=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-window (NLL sum, scored count) as the evaluator stores them, through ``WindowSums``."""
    nll, scored = token_nll(logits, targets, mask)
    metric = WindowSums(len(logits), 2)
    metric.update(torch.arange(len(logits)), torch.stack([nll.sum(1, dtype=torch.float64), scored.sum(1).double()], 1))
    sums = metric.compute()
    return sums[:, 0], sums[:, 1]


def test_window_nll_matches_cross_entropy_with_mask():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 9, 11, generator=g)
    targets = torch.randint(0, 11, (3, 9), generator=g)
    mask = torch.rand(3, 9, generator=g) > 0.3
    nll, count = window_nll(logits, targets, mask)
    for row in range(3):
        expected = F.cross_entropy(logits[row][mask[row]], targets[row][mask[row]], reduction="sum").double()
        torch.testing.assert_close(nll[row], expected, rtol=1e-6, atol=1e-6)
        assert count[row].item() == mask[row].sum().item()


def test_token_nll_skips_ignore_index():
    logits = torch.randn(2, 4, 7)
    targets = torch.tensor([[1, 2, -100, 3], [-100, -100, 4, 5]])
    nll, count = window_nll(logits, targets)
    assert count.sum().item() == 5
    torch.testing.assert_close((nll.sum() / count.sum()).float(), F.cross_entropy(logits.flatten(0, 1),
                                                                                   targets.flatten()))


def test_token_nll_stays_finite_where_torchmetrics_perplexity_is_inf():
    # One very confident wrong token: p(target) = exp(-200) underflows to 0 in float32 after softmax.
    logits = torch.zeros(1, 4, 5)
    logits[0, 0, 1] = 200.0
    targets = torch.tensor([[0, 2, 3, 4]])
    reference = Perplexity()
    reference.update(logits, targets)
    assert torch.isinf(reference.compute())

    nll, count = window_nll(logits, targets)
    mean = nll[0] / count[0]
    expected = F.cross_entropy(logits[0], targets[0]).double()
    assert torch.isfinite(mean.exp())
    torch.testing.assert_close(mean, expected, rtol=1e-6, atol=0)  # perplexity ~1.7e22
    assert expected.item() == pytest.approx((200 + 3 * math.log(5)) / 4, rel=1e-6)


def test_token_nll_bf16_logits():
    logits = torch.randn(2, 6, 9)
    targets = torch.randint(0, 9, (2, 6))
    nll, count = window_nll(logits.bfloat16(), targets)
    expected = F.cross_entropy(logits.bfloat16().float().flatten(0, 1), targets.flatten())
    torch.testing.assert_close((nll.sum() / count.sum()).float(), expected)


def test_window_sums_per_position_match_a_hand_loop_in_any_batch_order():
    g = torch.Generator().manual_seed(1)
    W, T, V = 5, 8, 6
    logits = torch.randn(W, T, V, generator=g)
    targets = torch.randint(0, V, (W, T), generator=g)
    metric = WindowSums(W, T)
    for rows in ([3, 0], [4], [1, 2]):  # windows arrive in any order, in batches of any size
        index = torch.tensor(rows)
        metric.update(index, token_nll(logits[index], targets[index])[0])
    log_probs = logits.double().log_softmax(-1)
    for w in range(W):
        for t in range(T):
            assert metric.compute()[w, t].item() == pytest.approx(-log_probs[w, t, targets[w, t]].item(), rel=1e-6)


def test_window_sums_reject_a_wrong_width():
    with pytest.raises(ValueError, match="width=4"):
        WindowSums(3, 4).update(torch.tensor([0]), torch.zeros(1, 5))


def test_position_buckets():
    assert position_buckets(10, 5).tolist() == [0, 2, 4, 6, 8, 10]
    log_edges = position_buckets(1000, 4, "log")
    assert log_edges.tolist() == [0, 1, 10, 100, 1000]
    assert position_buckets(8, 8, "log").tolist()[:2] == [0, 1]  # rounding merges narrow buckets
    assert len(position_buckets(8, 8, "log")) <= 9
    with pytest.raises(ValueError, match="spacing"):
        position_buckets(8, 2, "cubic")


def test_bucket_mean_is_count_weighted():
    sums = torch.tensor([2.0, 4.0, 9.0, 0.0, 1.0], dtype=torch.float64)
    counts = torch.tensor([1.0, 2.0, 3.0, 0.0, 0.0], dtype=torch.float64)
    out = bucket_mean(sums, counts, torch.tensor([0, 2, 3, 5]))
    assert out[0].item() == pytest.approx(6 / 3)
    assert out[1].item() == pytest.approx(9 / 3)
    assert math.isnan(out[2].item())


# ---- AttentionEntropy ------------------------------------------------------------------------------------

def test_attention_entropy_matches_direct_computation_averaged_over_samples():
    g = torch.Generator().manual_seed(2)
    L, H, T = 2, 3, 7
    batches = [[causal_probs(B, H, T, g) for _ in range(L)] for B in (2, 3)]
    metric = AttentionEntropy(L, H, T)
    for layers in batches:
        for layer, probs in enumerate(layers):
            metric.update(layer, probs.float())
    for layer in range(L):
        expected = torch.cat([entropy_by_hand(layers[layer]) for layers in batches]).mean(0)  # (H, T)
        torch.testing.assert_close(metric.compute()[layer], expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(metric.mean_over_heads(per_layer=True), metric.compute().mean(1))
    torch.testing.assert_close(metric.mean_over_heads(), metric.compute().mean((0, 1)))


def test_uniform_attention_reaches_the_upper_bound_log_i_plus_1():
    T = 9
    uniform = torch.ones(T, T).tril() / torch.arange(1, T + 1)[:, None]
    metric = AttentionEntropy(1, 2, T)
    metric.update(0, uniform.expand(4, 2, T, T))
    bound = AttentionEntropy.upper_bound(T)
    assert bound[0].item() == 0.0 and bound[-1].item() == pytest.approx(math.log(T))
    torch.testing.assert_close(metric.compute()[0], bound.expand(2, T), rtol=1e-6, atol=1e-6)


def test_one_hot_rows_have_zero_entropy_not_nan():
    T = 5
    probs = torch.eye(T)[None, None]  # every query attends only to itself: exact zeros everywhere else
    metric = AttentionEntropy(1, 1, T)
    metric.update(0, probs)
    assert torch.equal(metric.compute(), torch.zeros(1, 1, T, dtype=torch.float64))


@pytest.mark.parametrize("chunk", [1, 3, 7])
def test_chunked_updates_equal_unchunked(chunk):
    g = torch.Generator().manual_seed(3)
    T = 7
    probs = causal_probs(2, 2, T, g).float()
    whole, chunked = AttentionEntropy(1, 2, T), AttentionEntropy(1, 2, T)
    whole.update(0, probs)
    for start in range(0, T, chunk):
        end = min(start + chunk, T)
        chunked.update(0, probs[:, :, start:end, :end], query_offset=start)  # rows see keys 0..end-1 only
    torch.testing.assert_close(chunked.compute(), whole.compute(), rtol=1e-6, atol=1e-7)


def test_unseen_positions_and_layers_are_nan():
    metric = AttentionEntropy(2, 1, 6)
    metric.update(0, causal_probs(1, 1, 4, torch.Generator().manual_seed(4)))
    out = metric.compute()
    assert torch.isfinite(out[0, 0, :4]).all()
    assert torch.isnan(out[0, 0, 4:]).all() and torch.isnan(out[1]).all()


def test_attention_entropy_input_validation():
    metric = AttentionEntropy(2, 3, 8)
    probs = torch.full((1, 3, 4, 4), 0.25)
    with pytest.raises(ValueError, match="layer"):
        metric.update(2, probs)
    with pytest.raises(ValueError, match="n_head"):
        metric.update(0, probs[:, :2])
    with pytest.raises(ValueError, match="max_len"):
        metric.update(0, probs, query_offset=6)
    with pytest.raises(ValueError, match="exactly one"):
        metric.update(0, probs, entropy=torch.zeros(1, 3, 4))


# ---- attention_entropy_from_qk ---------------------------------------------------------------------------

def naive_entropy(q, k, scale, bias=None):
    """Full T x T attention in float64, GQA by repeat_interleave, then -sum p log p."""
    B, H, T, _ = q.shape
    k = k.double().repeat_interleave(H // k.size(1), dim=1)
    logits = (q.double() @ k.transpose(-1, -2)) * torch.as_tensor(scale, dtype=torch.float64).reshape(-1, 1, 1)
    if bias is not None:
        logits = logits + bias.double()
    logits = logits.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    probs = logits.softmax(-1)
    return -torch.special.xlogy(probs, probs).sum(-1)


def alibi_bias(slopes):
    return lambda q_pos, k_pos: -slopes[:, None, None] * (q_pos[:, None] - k_pos[None, :]).float()


@pytest.mark.parametrize("chunk", [1, 3, 13, 64])
def test_entropy_from_qk_matches_naive_full_matrix(chunk):
    g = torch.Generator().manual_seed(5)
    B, H, H_kv, T, d = 2, 4, 2, 13, 8
    q, k = torch.randn(B, H, T, d, generator=g), torch.randn(B, H_kv, T, d, generator=g)
    scale = torch.tensor([0.5, 1.0, 2.0, 4.0]) / math.sqrt(d)
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625])
    positions = torch.arange(T)
    out = attention_entropy_from_qk(q, k, scale, chunk)
    torch.testing.assert_close(out.double(), naive_entropy(q, k, scale), rtol=1e-5, atol=1e-5)
    out = attention_entropy_from_qk(q, k, scale, chunk, bias=alibi_bias(slopes))
    expected = naive_entropy(q, k, scale, alibi_bias(slopes)(positions, positions))
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)


def test_entropy_from_qk_float_scale_and_uniform_limit():
    q = torch.zeros(1, 2, 6, 4)  # all logits equal: uniform attention
    k = torch.randn(1, 2, 6, 4)
    out = attention_entropy_from_qk(q, k, 0.5, chunk=4)
    torch.testing.assert_close(out.double(), AttentionEntropy.upper_bound(6).expand(1, 2, 6), rtol=1e-6,
                               atol=1e-6)


def test_entropy_from_qk_feeds_the_metric():
    g = torch.Generator().manual_seed(6)
    q, k = torch.randn(3, 2, 10, 4, generator=g), torch.randn(3, 2, 10, 4, generator=g)
    metric = AttentionEntropy(1, 2, 10)
    metric.update(0, entropy=attention_entropy_from_qk(q, k, 0.5, chunk=4))
    torch.testing.assert_close(metric.compute()[0], naive_entropy(q, k, 0.5).mean(0), rtol=1e-5, atol=1e-5)


def test_entropy_from_qk_rejects_mismatched_heads():
    with pytest.raises(ValueError, match="H_kv"):
        attention_entropy_from_qk(torch.randn(1, 4, 5, 2), torch.randn(1, 3, 5, 2), 1.0, 2)


# ---- states: sync, merge, dtype ----------------------------------------------------------------------------

def test_merged_instances_equal_one_instance():
    g = torch.Generator().manual_seed(7)
    batches = [causal_probs(B, 2, 6, g).float() for B in (1, 2, 3)]
    single, first, second = (AttentionEntropy(1, 2, 6) for _ in range(3))
    for i, probs in enumerate(batches):
        single.update(0, probs)
        (first if i < 2 else second).update(0, probs)
    summed = {name: first.metric_state[name] + second.metric_state[name] for name in first.metric_state}
    first.merge_state(second)
    torch.testing.assert_close(first.compute(), single.compute())
    torch.testing.assert_close(summed["entropy_sum"] / summed["count"][:, None], single.compute())

    values = torch.randn(4, 5, generator=g)
    whole, a, b = WindowSums(4, 5), WindowSums(4, 5), WindowSums(4, 5)
    whole.update(torch.arange(4), values)
    a.update(torch.tensor([0, 3]), values[[0, 3]])  # two ranks, each with its share of the windows
    b.update(torch.tensor([1, 2]), values[[1, 2]])
    a.merge_state(b)
    torch.testing.assert_close(a.compute(), whole.compute())


def test_states_are_float64_sums_and_survive_module_to_dtype():
    metric = WindowSums(2, 4)
    assert metric.metric_state["sums"].dtype == torch.float64
    assert metric._reductions["sums"].__name__ == "dim_zero_sum"
    holder = torch.nn.Module()
    holder.metric = metric
    holder.to(torch.bfloat16)  # what Lightning's "bf16-true" precision does to the LightningModule
    assert metric.sums.dtype == torch.float64
    metric.update(torch.tensor([1]), torch.randn(1, 4).bfloat16())
    metric.reset()
    assert metric.sums.dtype == torch.float64
