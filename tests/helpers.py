"""Tokenizers and words for the prompt-building tests (any object with encode/decode will do)."""

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

WORDS = ("the of and to in a is that it was for on are with as his they be at one have this from or had by "
         "word but what some we can out other were all there when up use your how said an each she which do "
         "their time if will way about many then them write would like so these her long make thing see him "
         "two has look more day could go come did number sound no most people my over know water than call "
         "first who may down side been now find any new work part take get place made live where after back "
         "little only round man year came show every good me give our under name very through just form").split()


class HFTokenizer:
    """A byte-level BPE (``tokenizers``) behind the encode/decode protocol."""

    def __init__(self, texts: list[str], vocab_size: int = 500) -> None:
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator(texts, trainer)
        self.tok = tok

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text).ids

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids)


class WhitespaceTokenizer:
    """One id per whitespace-separated word; decoding joins words with single spaces."""

    def __init__(self) -> None:
        self.vocab: dict[str, int] = {}

    def encode(self, text: str) -> list[int]:
        return [self.vocab.setdefault(word, len(self.vocab)) for word in text.split()]

    def decode(self, ids: list[int]) -> str:
        words = {i: w for w, i in self.vocab.items()}
        return " ".join(words[i] for i in ids)


def tiny_llama_folder(folder, *, tie: bool = False, kv_heads: int = 2, rope: dict | None = None,
                      scale_param: list[list[float]] | None = None, max_positions: int = 64, seed: int = 0):
    """A complete Hugging Face Llama folder built by ``transformers`` (no download): a random 2-layer
    ``LlamaForCausalLM`` (hidden 64, 4 heads, ``kv_heads`` key-value heads, ``max_position_embeddings``
    ``max_positions``, ``rope`` its ``rope_parameters`` less the theta), its weights as ``model.safetensors`` and
    the suite's byte-level BPE as ``tokenizer.json`` (its vocabulary is the model's: 301 ids, no multiple of 64).
    ``scale_param``: per layer, the authors' HeadScale ``self_attn.scale_param`` (n_head,) added to the weights.
    Returns the float32 model (eval mode)."""
    from pathlib import Path

    import torch
    from safetensors.torch import load_file, save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    from nope_lightning.data.tokenizer import TextTokenizer

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    texts = [" ".join(WORDS[i:] + WORDS[:i]) for i in range(0, len(WORDS), 7)]
    tokenizer = TextTokenizer.train(texts, 301)
    tokenizer.save(folder / "tokenizer.json")
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=tokenizer.vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=max_positions,
                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0, **(rope or {})},
                      tie_word_embeddings=tie, bos_token_id=tokenizer.bos_id, eos_token_id=tokenizer.eos_id,
                      rms_norm_eps=1e-5)
    model = LlamaForCausalLM(cfg).float().eval()
    with torch.no_grad():  # RMSNorm weights start at 1: perturb them so a swapped norm would show
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.add_(0.1 * torch.randn_like(param))
    model.save_pretrained(folder)
    if scale_param is not None:
        weights = load_file(str(folder / "model.safetensors"))
        for layer, row in enumerate(scale_param):
            weights[f"model.layers.{layer}.self_attn.scale_param"] = torch.tensor(row, dtype=torch.bfloat16)
        save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return model
