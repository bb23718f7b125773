"""Building the tokenizer a GGUF file describes from its ``tokenizer.*`` metadata.

Two vocabulary kinds (``tokenizer.ggml.model``):

* ``gpt2``: byte-level BPE from tokens + merges. Text is split before BPE the way llama.cpp does for
  ``tokenizer.ggml.pre`` (the same splits the model's original tokenizer.json uses). For ``smollm`` and
  its kin that means digits are cut apart first and the GPT-2 regex runs on the rest; transformers' GGUF
  converter drops that digit step, which changes the result only where a whitespace run precedes a digit.
* ``llama``: sentencepiece-style BPE with byte fallback; merges come from the file or, as in transformers,
  from the vocabulary ordered by score.

Control tokens (type 3) become special added tokens, user-defined ones (type 4) plain added tokens.
"""

from __future__ import annotations

from functools import lru_cache

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as RawTokenizer

from .errors import ModelLoadError
from .gguf_file import field, require
from .tokenizer import Tokenizer

CONTROL, USER_DEFINED = 3, 4

_GPT2 = None  # ByteLevel's built-in regex: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
_DIGITS = r"\p{N}"
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# tokenizer.ggml.pre -> (isolating regexes applied in turn, then byte-level with or without the GPT-2 regex),
# grouped as in llama.cpp's llama-vocab.cpp.
_PRE = {
    **{name: ((), True) for name in ("default", "gpt-2", "mpt", "olmo", "jais", "trillion")},
    **{name: ((_DIGITS,), True) for name in ("smollm", "starcoder", "refact", "command-r", "codeshell",
                                               "exaone", "minerva")},
    **{name: ((_LLAMA3,), False) for name in ("llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral",
                                                "smaug-bpe", "dbrx")},
    **{name: ((_QWEN2,), False) for name in ("qwen2", "deepseek-r1-qwen", "megrez")},
}
# Pre-tokenizers for which llama.cpp takes a word whole when it is in the vocabulary (BPE ignore_merges).
_IGNORE_MERGES = {"llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral", "smaug-bpe", "dbrx"}
# Texts of tokens llama.cpp treats as end-of-generation; we add those the chat template uses.
_END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<EOT>",
                "<|end_of_text|>", "<｜end▁of▁sentence｜>")


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (the alphabet byte-level vocabularies are written in)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs), strict=True))


def _byte_level(tokens: list[str], merges: list[str], pre: str) -> tuple[RawTokenizer, list[str]]:
    if pre not in _PRE:
        raise ModelLoadError(f"GGUF pre-tokenizer {pre!r} is not supported; supported: {', '.join(sorted(_PRE))}. "
                             "Use the model's HF directory (with tokenizer.json) instead.")
    spelling = bytes_to_unicode()
    alphabet = set(spelling.values())
    # A token written outside the byte alphabet (some converters store plain text) is re-spelled into it; one
    # pass over all the text first, since in the usual file every token is already in the alphabet.
    in_alphabet = [True] * len(tokens) if set("".join(tokens)) <= alphabet else [set(t) <= alphabet for t in tokens]
    spelled = [t if ok else "".join(spelling[b] for b in t.encode("utf-8"))
               for t, ok in zip(tokens, in_alphabet, strict=True)]
    vocab = dict(zip(spelled, range(len(spelled)), strict=True))
    pairs = [(a, b) for a, sep, b in map(str.partition, merges, [" "] * len(merges)) if sep]
    if len(pairs) != len(merges):
        bad = next(m for m in merges if " " not in m)
        raise ModelLoadError(f"GGUF merge {bad!r} is not of the form 'left right'; the file is corrupted")
    raw = RawTokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, ignore_merges=pre in _IGNORE_MERGES))
    regexes, gpt2_regex = _PRE[pre]
    steps = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes]
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=gpt2_regex))
    raw.pre_tokenizer = pre_tokenizers.Sequence(steps)
    raw.decoder = decoders.ByteLevel()
    # A control token outside the byte alphabet is a mislabel; making it special would add an id.
    return raw, [s if ok else "" for s, ok in zip(spelled, in_alphabet, strict=True)]


def _sentencepiece(tokens: list[str], merges: list[str] | None, scores: list[float] | None,
                   add_space_prefix: bool, unk: str | None) -> tuple[RawTokenizer, list[str]]:
    vocab = {t: i for i, t in enumerate(tokens)}
    if merges is not None:
        pairs = [tuple(m.split(" ", 1)) for m in merges]
    elif scores is not None:
        pairs = _merges_from_scores(vocab, dict(zip(tokens, scores, strict=True)))
    else:
        raise ModelLoadError("the GGUF 'llama' tokenizer has neither merges nor scores; the file is incomplete")
    raw = RawTokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=True, byte_fallback=True, unk_token=unk))
    raw.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first" if add_space_prefix
                                                 else "never", split=False)
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_space_prefix:
        steps.append(decoders.Strip(content=" ", left=1, right=0))
    raw.decoder = decoders.Sequence(steps)
    return raw, list(tokens)


def _merges_from_scores(vocab: dict[str, int], scores: dict[str, float]) -> list[tuple[str, str]]:
    """Every split of a token into two tokens, best merged-token score first (transformers' generate_merges)."""
    merges = []
    for token, score in scores.items():
        local = [(token[:k], token[k:], score) for k in range(1, len(token))
                 if token[:k] in vocab and token[k:] in vocab]
        local.sort(key=lambda x: (vocab[x[0]], vocab[x[1]]))
        merges.extend(local)
    merges.sort(key=lambda x: (x[2], len(x[0]), len(x[1])), reverse=True)
    return [(a, b) for a, b, _ in merges]


def _post_processor(bos: tuple[str, int] | None, eos: tuple[str, int] | None):
    single, pair, specials = "$A", "$A $B:1", []
    if bos:
        single, pair = f"{bos[0]} {single}", f"{bos[0]} $A {bos[0]} $B:1"
        specials.append(bos)
    if eos:
        single, pair = f"{single} {eos[0]}", pair.replace("$A", f"$A {eos[0]}").replace("$B:1", f"$B:1 {eos[0]}")
        specials.append(eos)
    return processors.TemplateProcessing(single=single, pair=pair, special_tokens=specials)


def gguf_tokenizer(reader, path: str) -> Tokenizer:
    """The Tokenizer of a GGUF file; ModelLoadError for a vocabulary kind or pre-tokenizer it cannot build."""
    kind = require(reader, "tokenizer.ggml.model", path)
    tokens = require(reader, "tokenizer.ggml.tokens", path)
    types = field(reader, "tokenizer.ggml.token_type") or [1] * len(tokens)
    scores = field(reader, "tokenizer.ggml.scores")
    if len(types) != len(tokens) or (scores is not None and len(scores) != len(tokens)):
        raise ModelLoadError(f"{path}: tokenizer metadata lists {len(tokens)} tokens but {len(types)} token types "
                             f"and {len(scores or tokens)} scores; the file is corrupted")
    bos_id = field(reader, "tokenizer.ggml.bos_token_id")
    eos_id = field(reader, "tokenizer.ggml.eos_token_id")
    unk_id = field(reader, "tokenizer.ggml.unknown_token_id")
    pad_id = field(reader, "tokenizer.ggml.padding_token_id")
    for name, i in (("bos", bos_id), ("eos", eos_id), ("unknown", unk_id), ("padding", pad_id)):
        if i is not None and not 0 <= i < len(tokens):
            raise ModelLoadError(f"{path}: the {name} token id {i} is outside the vocabulary of {len(tokens)}")
    if kind == "gpt2":
        raw, spelled = _byte_level(tokens, require(reader, "tokenizer.ggml.merges", path),
                                   field(reader, "tokenizer.ggml.pre", "default"))
        add_bos_default = False
    elif kind == "llama":
        raw, spelled = _sentencepiece(tokens, field(reader, "tokenizer.ggml.merges"), scores,
                                      field(reader, "tokenizer.ggml.add_space_prefix", True),
                                      tokens[unk_id] if unk_id is not None else None)
        add_bos_default = True  # llama.cpp adds BOS to a sentencepiece vocabulary that does not say otherwise
    else:
        raise ModelLoadError(f"GGUF tokenizer kind {kind!r} is not supported; supported: 'gpt2' (byte-level BPE) "
                             "and 'llama' (sentencepiece BPE). Use the model's HF directory instead.")
    control_ids = [i for i, t in enumerate(types) if t == CONTROL]
    raw.add_special_tokens([AddedToken(spelled[i], special=True, normalized=False) for i in control_ids if spelled[i]])
    if USER_DEFINED in types:
        vocab = raw.get_vocab(with_added_tokens=False)
        raw.add_tokens([AddedToken(s, special=False, normalized=False)
                        for s, t in zip(spelled, types, strict=True) if t == USER_DEFINED and s in vocab])

    add_bos = field(reader, "tokenizer.ggml.add_bos_token", add_bos_default) and bos_id is not None
    add_eos = field(reader, "tokenizer.ggml.add_eos_token", False) and eos_id is not None
    raw.post_processor = _post_processor((raw.id_to_token(bos_id), bos_id) if add_bos else None,
                                         (raw.id_to_token(eos_id), eos_id) if add_eos else None)

    template = field(reader, "tokenizer.chat_template")
    eos_ids = {i for i in (eos_id, field(reader, "tokenizer.ggml.eot_token_id"),
                           field(reader, "tokenizer.ggml.eom_token_id")) if i is not None and 0 <= i < len(tokens)}
    if template:
        eos_ids |= {i for i in control_ids if tokens[i] in _END_OF_TURN and tokens[i] in template}
    names = {"bos_token": bos_id, "eos_token": eos_id, "unk_token": unk_id, "pad_token": pad_id}
    specials = {k: tokens[i] if i is not None else None for k, i in names.items()}
    return Tokenizer(raw, bos_token_id=bos_id, eos_token_ids=eos_ids, chat_template=template or None,
                     special_tokens=specials)
