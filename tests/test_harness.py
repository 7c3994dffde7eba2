"""The lm-evaluation-harness adapter on a local-file multiple-choice task (no hub): its log-likelihoods,
rolling log-likelihoods and generations equal our own scoring of the same token sequences."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
lm_eval = pytest.importorskip("lm_eval")

from lm_eval.api.instance import Instance  # noqa: E402

from nope_lightning.config import ModelConfig  # noqa: E402
from nope_lightning.data import TextTokenizer  # noqa: E402
from nope_lightning.eval.generate import greedy_decode  # noqa: E402
from nope_lightning.eval.harness import NopeLightningLM, run_harness  # noqa: E402
from nope_lightning.model import GPT  # noqa: E402
from tests.conftest import REPO  # noqa: E402

DATA = REPO / "tests/data/harness/tiny_mc.jsonl"
TEXTS = ["The sky is blue and the grass is green. In the beginning God created the heaven and the earth. "
         "And the earth was without form, and void; and darkness was upon the face of the deep."] * 20


@pytest.fixture(scope="module")
def lm() -> NopeLightningLM:
    tokenizer = TextTokenizer.train(TEXTS, 300)
    torch.manual_seed(0)
    cfg = ModelConfig(n_layer=2, n_head=4, n_embd=32, intermediate_size=64, max_positions=64, init_std=0.3)
    model = GPT(cfg, tokenizer.vocab_size, train_len=32)
    return NopeLightningLM(model, tokenizer, batch_size=2, max_length=16)


def our_logprob(lm: NopeLightningLM, ids: list[int], start: int) -> float:
    """Sum of log p(ids[t] | ids[:t]) for t >= start, by one forward of the whole sequence."""
    with torch.no_grad():
        logits = lm.model(torch.tensor([ids[:-1]]))[0, :, : lm.tokenizer.vocab_size].log_softmax(-1)
    return sum(logits[t - 1, ids[t]].item() for t in range(start, len(ids)))


def test_multiple_choice_task_from_a_local_file(lm, tmp_path):
    (tmp_path / "tiny_mc.yaml").write_text(f"""task: nl_tiny_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {DATA}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
""")
    lm.max_length = 64  # whole questions: the scores below come from one forward each
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    out = simple_evaluate(model=lm, tasks=["nl_tiny_mc"], task_manager=TaskManager(include_path=str(tmp_path)),
                          log_samples=True)
    samples = out["samples"]["nl_tiny_mc"]
    assert len(samples) == 3
    correct = 0
    for sample in samples:
        doc = sample["doc"]
        ours = []
        for choice in doc["choices"]:
            context = [lm.tokenizer.bos_id, *lm.tokenizer.encode(doc["question"])]
            whole = [lm.tokenizer.bos_id, *lm.tokenizer.encode(doc["question"] + " " + choice)]
            ours.append(our_logprob(lm, whole, len(context)))
        theirs = [resp[0][0] for resp in sample["resps"]]
        assert theirs == pytest.approx(ours, abs=1e-4)
        correct += max(range(len(ours)), key=ours.__getitem__) == doc["answer"]
    assert out["results"]["nl_tiny_mc"]["acc,none"] == pytest.approx(correct / 3)
    metrics = run_harness(lm.model, lm.tokenizer, ["nl_tiny_mc"], include_path=str(tmp_path))
    assert metrics["harness/nl_tiny_mc/acc"] == pytest.approx(correct / 3)
    lm.max_length = 16


def test_rolling_loglikelihood_in_disjoint_windows(lm):
    """A 16-token window: each token is predicted from the tokens before it, as far back as its window's
    last target minus 16 (BOS before the first window)."""
    text = TEXTS[0]
    ids = [lm.tokenizer.bos_id, *lm.tokenizer.encode(text)]  # target j = ids[j], j >= 1
    n, L = len(ids) - 1, lm.max_length
    assert n > 2 * L
    total = 0.0
    for start in range(1, n + 1, L):
        end = min(start + L, n + 1)  # targets ids[start:end]
        first = max(0, end - 1 - L)  # input ids[first:end-1]: at most L tokens
        total += our_logprob(lm, ids[first:end], start - first)
    (got,) = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)])
    assert got == pytest.approx(total, abs=1e-3)


def test_generate_until_is_greedy_and_cut_at_the_stop_string(lm):
    context = "The sky is"
    prompt = [lm.tokenizer.bos_id, *lm.tokenizer.encode(context)]
    ours = lm.tokenizer.decode(greedy_decode(lm.model, [prompt], 8, vocab_size=lm.tokenizer.vocab_size,
                                             eos_id=lm.tokenizer.eos_id, use_cache=False)[0])
    stop = ours.strip()[:2] if ours.strip() else "\n"
    (got,) = lm.generate_until([Instance("generate_until", {}, (context, {"until": [stop], "max_gen_toks": 8}), 0)])
    assert got == ours.split(stop)[0]
    with pytest.raises(ValueError, match="greedily only"):
        lm.generate_until([Instance("generate_until", {}, (context, {"do_sample": True}), 0)])


def test_unknown_task_is_one_line(lm):
    with pytest.raises(ValueError, match="lm-evaluation-harness has no task\\(s\\) no_such_task"):
        run_harness(lm.model, lm.tokenizer, ["no_such_task"])
