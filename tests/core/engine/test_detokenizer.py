"""IncrementalDetokenizer against real tokenizers trained here: byte-level BPE (characters split over tokens)
and a Metaspace (SentencePiece-style) one whose decoding of a token depends on what precedes it."""

from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from engine.core.engine.detokenizer import IncrementalDetokenizer

CORPUS = [
    "hello world, the café is naïve and the crème brûlée is sweet",
    "你好世界 今天天气很好 我们去公园散步吧",
    "emoji time 😀 🎉 🚀 👍🏽 and more text",
    "Ελληνικά και русский текст, and some ascii too",
]
END = "<|end|>"


@pytest.fixture(scope="module")
def byte_bpe() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[END])
    tok.train_from_iterator(CORPUS * 20, trainer)
    return tok


def _random_text(n: int) -> str:
    """Words from the corpus mixed with characters the tokenizer never saw (so they stay split into bytes)."""
    words = " ".join(CORPUS).split()
    parts = []
    for _ in range(n):
        r = random.random()
        if r < 0.5:
            parts.append(random.choice(words))
        elif r < 0.7:
            parts.append(chr(random.randint(0x4E00, 0x9FFF)))  # CJK: 3 bytes
        elif r < 0.85:
            parts.append(chr(random.randint(0x1F601, 0x1F64F)))  # emoji: 4 bytes
        else:
            parts.append(chr(random.randint(0xC0, 0x24F)))  # Latin with diacritics: 2 bytes
        parts.append(random.choice([" ", "", "\n"]))
    return "".join(parts)


@pytest.fixture(params=[False, True], ids=["window", "decode_stream"])
def stream(request):
    """Every case runs on both paths: the two-decode window in Python and tokenizers' DecodeStream (which the
    contexts here, whole characters, always allow)."""
    return request.param


def _stream(tok, prompt_ids, output_ids, skip_special_tokens=True, *, stream):
    detok = IncrementalDetokenizer(tok, prompt_ids, skip_special_tokens, stream=stream)
    assert (detok._stream is not None) is stream
    deltas = [detok.add(t) for t in output_ids]
    return detok, deltas


def test_split_characters_are_emitted_whole(byte_bpe, stream):
    split_seen = False
    for _ in range(30):
        prompt = byte_bpe.encode(_random_text(random.randint(1, 8))).ids
        out = byte_bpe.encode(_random_text(random.randint(1, 20))).ids
        split_seen |= any("\ufffd" in byte_bpe.decode([t]) for t in out)
        detok, deltas = _stream(byte_bpe, prompt, out, stream=stream)
        assert all("\ufffd" not in d for d in deltas)
        assert "".join(deltas) == detok.text == byte_bpe.decode(out)
        assert "\ufffd" not in detok.text
    assert split_seen, "no character spanned several tokens: the test would prove nothing"


def test_empty_prompt_and_one_byte_at_a_time(byte_bpe, stream):
    text = "".join(chr(random.randint(0x1F601, 0x1F64F)) for _ in range(5))  # none of them in the corpus
    out = byte_bpe.encode(text).ids
    assert len(out) > len(text)
    detok, deltas = _stream(byte_bpe, [], out, stream=stream)
    # Each emoji appears once, whole, as soon as its last byte arrives; a merge learnt across two code points
    # ("👍🏽" in the corpus) can complete two in one token, so a delta may hold more than one.
    assert "".join(deltas) == text
    assert all("\ufffd" not in d for d in deltas)
    assert sum(1 for d in deltas if d) > 1  # streamed piecewise, not all at the end


@pytest.mark.parametrize("skip", [True, False])
def test_special_tokens(byte_bpe, skip, stream):
    end_id = byte_bpe.token_to_id(END)
    out = byte_bpe.encode(_random_text(5)).ids + [end_id] + byte_bpe.encode(_random_text(3)).ids
    detok, deltas = _stream(byte_bpe, byte_bpe.encode("hello").ids, out, skip_special_tokens=skip, stream=stream)
    assert "".join(deltas) == byte_bpe.decode(out, skip_special_tokens=skip)
    assert (END in detok.text) is not skip


def test_flush_releases_an_incomplete_tail(byte_bpe, stream):
    ids = byte_bpe.encode("ok " + chr(random.randint(0x1F601, 0x1F64F))).ids
    out = ids[:-1]  # generation stopped inside the emoji's bytes
    detok, deltas = _stream(byte_bpe, [], out, stream=stream)
    assert "\ufffd" not in detok.text
    tail = detok.flush()
    assert tail.endswith("\ufffd")
    assert detok.text == byte_bpe.decode(out)


def test_context_dependent_decoding(stream):
    """A Metaspace tokenizer drops the space before the first token it decodes; the prompt context keeps it."""
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(CORPUS[:1] * 20, trainers.BpeTrainer(vocab_size=200, special_tokens=["[UNK]"]))
    words = CORPUS[0].replace(",", "").split()
    for _ in range(10):
        prompt = tok.encode(" ".join(random.choices(words, k=random.randint(1, 9)))).ids
        out = tok.encode(" ".join(random.choices(words, k=random.randint(1, 9)))).ids
        detok, deltas = _stream(tok, prompt, out, stream=stream)
        full, head = tok.decode(prompt + out), tok.decode(prompt)
        assert "".join(deltas) == full[len(head):]
        assert deltas[0].startswith(" ")  # token-by-token decoding would lose this space


def test_both_paths_give_the_same_deltas_on_the_built_in_tokenizer():
    """The built-in model's tokenizer (the wrapper the engine passes, byte-level BPE from GGUF): random token ids
    (bytes of split characters and special tokens included), both paths delta for delta; an id outside the
    vocabulary is refused by both."""
    from tests import needs

    needs.default_model()
    from engine.core.loader.checkpoint import load_checkpoint

    tok = load_checkpoint().tokenizer
    n = tok.vocab_size
    used_stream = 0
    for _ in range(40):
        prompt = [random.randrange(n) for _ in range(random.randint(0, 12))]
        out = [random.randrange(n) for _ in range(random.randint(1, 40))]
        skip = random.random() < 0.5
        window = IncrementalDetokenizer(tok, prompt, skip, stream=False)
        auto = IncrementalDetokenizer(tok, prompt, skip)  # DecodeStream unless the context ends mid-character
        assert [window.add(t) for t in out] == [auto.add(t) for t in out]
        assert window.flush() == auto.flush() and window.text == auto.text
        used_stream += auto._stream is not None
    assert used_stream, "no case ran on DecodeStream: the test would prove nothing"
    for stream in (False, True):
        with pytest.raises(ValueError, match="outside the vocabulary"):
            IncrementalDetokenizer(tok, [], stream=stream).add(n)


def test_a_decoder_that_is_not_a_tokenizers_tokenizer_takes_the_window():
    class Plain:
        def decode(self, ids, skip_special_tokens=True):
            return "".join(chr(97 + i % 26) for i in ids)

    detok = IncrementalDetokenizer(Plain(), [1, 2])
    assert detok._stream is None and detok.add(3) == "d"
