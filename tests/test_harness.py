"""The lm-evaluation-harness adapter on a local-file multiple-choice task (no hub): its log-likelihoods,
rolling log-likelihoods and generations equal our own scoring of the same token sequences, whatever the batch
size (dynamic NTK included); generation settings are read as lm-eval's HF model reads them; the
``nope-lightning harness`` command runs on a CPU without ``--device``."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
lm_eval = pytest.importorskip("lm_eval")

from lm_eval.api.instance import Instance  # noqa: E402

from nope_lightning import cli  # noqa: E402
from nope_lightning.config import ModelConfig, RopeScalingConfig  # noqa: E402
from nope_lightning.data import TextTokenizer  # noqa: E402
from nope_lightning.eval import harness  # noqa: E402
from nope_lightning.eval.generate import greedy_decode  # noqa: E402
from nope_lightning.eval.harness import NopeLightningLM, check_harness_tasks, resolve_device, run_harness  # noqa: E402
from nope_lightning.model import GPT  # noqa: E402
from tests.conftest import REPO  # noqa: E402

DATA = REPO / "tests/data/harness/tiny_mc.jsonl"
TASK_YAML = f"""task: nl_tiny_mc
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
"""
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


@pytest.fixture(scope="module")
def ntk_lm(lm) -> NopeLightningLM:
    """A RoPE model under dynamic NTK (factor 4, train_len 8): its RoPE table changes with every length past 8."""
    torch.manual_seed(0)
    cfg = ModelConfig(n_layer=2, n_head=4, n_embd=32, intermediate_size=64, max_positions=64, init_std=0.3,
                      pos_encoding="rope", rope_scaling=RopeScalingConfig("dynamic_ntk", 4.0))
    return NopeLightningLM(GPT(cfg, lm.tokenizer.vocab_size, train_len=8), lm.tokenizer, max_length=64)


def test_multiple_choice_task_from_a_local_file(lm, tmp_path):
    (tmp_path / "tiny_mc.yaml").write_text(TASK_YAML)
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
    # lm-eval's LongBench tasks ask for temperature 1 with do_sample False: greedy, as lm-eval's HF model reads it.
    settings = {"until": [stop, ""], "max_gen_toks": 8, "temperature": 1, "do_sample": False}
    (got,) = lm.generate_until([Instance("generate_until", {}, (context, settings), 0)])
    assert got == ours.split(stop)[0]
    with pytest.raises(ValueError, match="greedily only"):
        lm.generate_until([Instance("generate_until", {}, (context, {"do_sample": True}), 0)])


def test_generation_settings_are_read_as_lm_eval_reads_them(lm):
    """lm.max_length is 16: (stop strings, budget) per setting, and one line for what greedy decoding cannot do."""
    assert lm.generation_settings({"until": "\n\n", "max_new_tokens": 4}) == (["\n\n"], 4)
    assert lm.generation_settings({"until": ["", "Q:"], "max_gen_toks": 15, "top_p": 0.9}) == (["Q:"], 15)
    assert lm.generation_settings({"temperature": 0, "max_gen_toks": 3}) == ([], 3)
    for settings, message in (({"temperature": 0.7}, "greedily only"), ({"do_sample": True}, "greedily only"),
                              ({"max_gen_toks": 16}, "max_gen_toks=16 leaves no room for a prompt in max_length=16"),
                              ({"max_gen_toks": 4, "num_beams": 2}, "no generation setting\\(s\\) num_beams"),
                              ({}, "max_gen_toks=256 leaves no room")):
        with pytest.raises(ValueError, match=message):
            lm.generation_settings(settings)


def test_dynamic_ntk_scores_do_not_depend_on_batch_size(ntk_lm):
    """Contexts of 3 to 40 tokens scored one per forward and four per forward give the same log-likelihoods, each
    equal to its sequence's own forward; so do rolling log-likelihoods and generations. (A row run padded to a
    longer one would get that length's RoPE table: the last assertion shows it would score differently.)"""
    ids = [ntk_lm.tokenizer.bos_id, *ntk_lm.tokenizer.encode(TEXTS[0])]
    pairs = [(ids[:n], ids[n:n + 3]) for n in (3, 40, 9, 17, 30, 12, 40, 5)]
    scores = {}
    for size in (1, 4):
        ntk_lm.batch_size = size
        scores[size] = ntk_lm._loglikelihood_tokens([(None, ctx, cont) for ctx, cont in pairs])
    assert [s for s, _ in scores[4]] == pytest.approx([s for s, _ in scores[1]], abs=1e-5)
    assert [g for _, g in scores[4]] == [g for _, g in scores[1]]
    alone = [our_logprob(ntk_lm, ctx + cont, len(ctx)) for ctx, cont in pairs]
    assert [s for s, _ in scores[1]] == pytest.approx(alone, abs=1e-4)

    texts = [TEXTS[0][:40], TEXTS[0], TEXTS[0][:90]]
    rolling = {}
    contexts = ["The sky is", TEXTS[0][:120], "And the earth", TEXTS[0][:60]]
    generated = {}
    for size in (1, 4):
        ntk_lm.batch_size = size
        rolling[size] = ntk_lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (t,), 0) for t in texts])
        generated[size] = ntk_lm.generate_until([Instance("generate_until", {}, (c, {"max_gen_toks": 6}), 0)
                                                 for c in contexts])
    assert rolling[4] == pytest.approx(rolling[1], abs=1e-4)
    assert generated[4] == generated[1]

    with torch.no_grad():
        padded = torch.tensor([ids[:12] + [0] * 28])
        logits = ntk_lm.model(padded)[0, :11, : ntk_lm.tokenizer.vocab_size].log_softmax(-1)
    assert sum(logits[t - 1, ids[t]].item() for t in range(9, 12)) != pytest.approx(alone[2], abs=1e-3)


def test_unknown_task_or_task_folder_is_one_line_before_compute(lm, tmp_path):
    with pytest.raises(ValueError, match="lm-evaluation-harness has no task\\(s\\) no_such_task; `nope-lightning "
                                         "harness ls tasks` lists them"):
        run_harness(lm.model, lm.tokenizer, ["no_such_task"])
    with pytest.raises(FileNotFoundError, match="harness_include=.*/absent: no such folder"):
        check_harness_tasks(["nl_tiny_mc"], str(tmp_path / "absent"))
    (tmp_path / "tiny_mc.yaml").write_text(TASK_YAML)
    check_harness_tasks(["nl_tiny_mc", "arc_easy"], str(tmp_path))


def test_evaluate_refuses_an_unknown_harness_task_before_building_a_model(tmp_path, tracking_overrides, capsys):
    """The checkpoint is an empty folder, no model, so an error naming the task shows the check came first."""
    code = cli.main(["run", "evaluate", f"checkpoint={tmp_path}", *tracking_overrides,
                     "harness_tasks=[arc_easy,no_such_task]"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "has no task(s) no_such_task" in err and "checkpoint" not in err


def test_bad_model_args_are_one_line_before_loading():
    with pytest.raises(ValueError, match="model_args: Key 'foo' not in 'ExtensionConfig'; they take checkpoint"):
        NopeLightningLM.from_settings(checkpoint="/nonexistent", foo=1)
    with pytest.raises(ValueError, match="model_args need checkpoint="):
        NopeLightningLM.from_settings(temperature=1.2)


def test_device_defaults_to_cuda_when_available_else_cpu_and_a_missing_one_is_one_line(capsys):
    assert resolve_device(None) == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="device 'cuda:99' cannot be used here .*: leave --device out"):
        resolve_device("cuda:99")
    with pytest.raises(ValueError, match="device 'tpu9' cannot be used here"):
        resolve_device("tpu9")
    # The command refuses it before loading anything (the checkpoint does not exist).
    assert harness.main(["--model_args", "checkpoint=/nonexistent", "--tasks", "arc_easy", "--device", "cuda:99"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("nope-lightning harness: error: device 'cuda:99'") and err.count("\n") == 1


def test_harness_command_scores_on_a_cpu_without_device(tiny_pretrained, tmp_path):
    """The README's command, on a CPU-only torch, no --device, outside any git checkout: stdout is lm-eval's
    results table (an accuracy over the three questions) and nothing else; stderr has no git complaint."""
    (tmp_path / "tiny_mc.yaml").write_text(TASK_YAML)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "nope_lightning.cli", "harness", "--model_args",
                           f"checkpoint={tiny_pretrained['model']}", "--tasks", "nl_tiny_mc", "--include_path",
                           str(tmp_path), "--batch_size", "4"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    head, *table = proc.stdout.strip().splitlines()
    assert head.startswith("nope-lightning (") and "batch_size: 4" in head
    assert all(line.startswith("|") for line in table)
    row = next(line for line in table if line.startswith("|nl_tiny_mc"))
    cells = [c.strip() for c in row.split("|")]  # | task | version | filter | n-shot | metric | ↑ | value | ...
    assert cells[5] == "acc" and round(float(cells[7]) * 3, 3) in (0, 1, 2, 3)
    assert "fatal" not in proc.stderr and "Traceback" not in proc.stderr
