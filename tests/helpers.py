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
