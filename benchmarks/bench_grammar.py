"""Which grammar library constrains ``response_format``: xgrammar vs outlines-core on the default model's vocabulary.

Measures, for each library: the one-off vocabulary set-up, compiling a JSON schema, compiling free-form JSON
(json_object), the per-token cost of computing the allowed-token set while walking a valid output, and whether
free-form JSON accepts 4-deep nesting. Needs both libraries: ``pip install xgrammar outlines-core``.
"""

from __future__ import annotations

import json
import platform
import statistics
import time

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "tags": {"type": "array", "items": {"type": "string"}}},
          "required": ["name", "age"]}
OUTPUT = json.dumps({"name": "Alice Smith", "age": 31, "tags": ["x", "yz"]})
DEEP = '{"a": {"b": {"c": [1, {"d": 2}]}}}'


def _timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def bench_xgrammar(tb, vocab_size, eos, ids, deep_ids) -> dict:
    import xgrammar as xgr

    def setup():
        info = xgr.TokenizerInfo(tb, vocab_type=xgr.VocabType.RAW, vocab_size=vocab_size, stop_token_ids=eos)
        return xgr.GrammarCompiler(info, max_threads=1)

    comp, t_setup = _timed(setup)
    schema, t_schema = _timed(lambda: comp.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False))
    anyjson, t_any = _timed(lambda: comp.compile_builtin_json_grammar())
    m, mask, per = xgr.GrammarMatcher(schema), xgr.allocate_token_bitmask(1, vocab_size), []
    for i in ids:
        per.append(_timed(lambda: m.fill_next_token_bitmask(mask))[1])
        assert m.accept_token(i)
    deep = xgr.GrammarMatcher(anyjson)
    return {"setup_s": t_setup, "schema_compile_s": t_schema, "json_object_compile_s": t_any,
            "mask_us_median": statistics.median(per) * 1e6, "mask_us_max": max(per) * 1e6,
            "deep_nesting_ok": all(deep.accept_token(i) for i in deep_ids)}


def bench_outlines(tb, eos, ids, deep_ids) -> dict:
    import outlines_core as oc
    from outlines_core.json_schema import build_regex_from_schema

    def setup():
        vmap: dict[bytes, list[int]] = {}
        for i, b in enumerate(tb):
            if b and i not in eos:
                vmap.setdefault(b, []).append(i)
        return oc.Vocabulary(eos[0], vmap)

    voc, t_setup = _timed(setup)
    index, t_schema = _timed(lambda: oc.Index(build_regex_from_schema(json.dumps(SCHEMA)), voc))
    anyjson, t_any = _timed(lambda: oc.Index(build_regex_from_schema('{"type": "object"}'), voc))
    g, per = oc.Guide(index), []
    for i in ids:
        per.append(_timed(g.get_tokens)[1])
        g.advance(i)
    deep, ok = oc.Guide(anyjson), True
    for i in deep_ids:
        if i not in deep.get_tokens():
            ok = False
            break
        deep.advance(i)
    return {"setup_s": t_setup, "schema_compile_s": t_schema, "json_object_compile_s": t_any,
            "mask_us_median": statistics.median(per) * 1e6, "mask_us_max": max(per) * 1e6, "deep_nesting_ok": ok}


def main() -> None:
    from engine.core.loader import load_checkpoint
    from engine.core.serving.token_bytes import token_bytes

    ck = load_checkpoint(None)
    tok = ck.tokenizer
    tb, eos = token_bytes(tok), sorted(tok.eos_token_ids)
    ids = tok.encode(OUTPUT, add_special_tokens=False)
    deep_ids = tok.encode(DEEP, add_special_tokens=False)
    print(json.dumps({"cpu": platform.processor() or platform.machine(), "vocab": ck.config.vocab_size,
                      "xgrammar": bench_xgrammar(tb, ck.config.vocab_size, eos, ids, deep_ids),
                      "outlines_core": bench_outlines(tb, eos, ids, deep_ids)}, indent=1))


if __name__ == "__main__":
    main()
