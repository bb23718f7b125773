"""How often the built-in model's chat answers degenerate into loops under candidate sampling defaults.

The evidence behind the built-in model's ``repetition_penalty`` default (core/loader/generation_config.py): each
configuration answers PROMPTS through the chat template once per seed, and an answer counts as a loop when fewer than
60% of its word 4-grams are distinct (a repeated phrase; a long but varied answer is not one). It also prints how many
answers reached max_tokens. Not a speed benchmark: the counts depend on the model's numerics, so name the CPU and ISA.
Run: ``python benchmarks/sampling_loops.py [--seeds 6] [--max-tokens 256]``.
"""

from __future__ import annotations

import argparse
import re

from engine.core.engine.llm import LLM
from engine.core.engine.sampling_params import SamplingParams

PROMPTS = ["What is the capital of France?", "Write a haiku about the sea.", "Explain gravity in one sentence.",
           "Give me three tips for sleeping better.", "What is 2+2?", "Who wrote Romeo and Juliet?",
           "Translate 'good morning' into Spanish.", "Summarize the plot of Cinderella in two sentences."]
CONFIGS = {"temperature 0.2, top_p 0.9 (SamplingParams())": {},
           "same, repetition_penalty 1.05": {"repetition_penalty": 1.05},
           "same, repetition_penalty 1.1": {"repetition_penalty": 1.1},
           "greedy": {"temperature": 0.0},
           "greedy, repetition_penalty 1.1": {"temperature": 0.0, "repetition_penalty": 1.1}}


def is_loop(text: str) -> bool:
    words = re.findall(r"\w+", text)
    grams = [tuple(words[i:i + 4]) for i in range(len(words) - 3)]
    return len(grams) > 20 and len(set(grams)) / len(grams) < 0.6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=256)
    a = ap.parse_args()
    llm = LLM(None)
    chats = [llm.tokenizer.encode(llm.chat_prompt([{"role": "user", "content": p}]), add_special_tokens=False)
             for p in PROMPTS]
    print(f"| sampling | loops (of {len(PROMPTS) * a.seeds}) | reached max_tokens | a loop |")
    print("| --- | ---: | ---: | --- |")
    for name, overrides in CONFIGS.items():
        params = [SamplingParams(seed=s, max_tokens=a.max_tokens, **overrides)
                  for _ in chats for s in range(1, a.seeds + 1)]
        outs = llm.generate([c for c in chats for _ in range(a.seeds)], params)
        texts = [o.outputs[0].text for o in outs]
        loops = [t for t in texts if is_loop(t)]
        capped = sum(o.outputs[0].finish_reason == "length" for o in outs)
        example = repr(loops[0][:80]) if loops else ""
        print(f"| {name} | {len(loops)} | {capped} | {example} |", flush=True)


if __name__ == "__main__":
    main()
