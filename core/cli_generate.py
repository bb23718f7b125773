"""``engine generate``: complete prompts on the command line, streaming a single prompt to the terminal."""

from __future__ import annotations

import sys


def add_model_arguments(p) -> None:
    """The options that choose the model and how it runs (shared by generate and bench); see load_llm."""
    p.add_argument("--model", help="GGUF file or HF directory (default: the built-in SmolLM2-135M-Instruct)")
    p.add_argument("--platform", help="force a platform (same as ENGINE_PLATFORM)")
    p.add_argument("--dtype", default="float32", help="activation dtype: float32 (default) or bfloat16")
    p.add_argument("--activation-quant", default="none", choices=("none", "q8", "auto"),
                   help="GGUF weights: round activations to Q8 blocks before each quantized matmul (q8, as llama.cpp"
                        " on CPUs; auto = q8 where the platform has a kernel for it) or not (none, the default)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                   help="GPU platforms: fraction of the device's memory for weights, activations and KV cache")
    p.add_argument("--enforce-eager", action="store_true", help="GPU platforms: no CUDA graphs for decode steps")


def load_llm(args, **kwargs):
    from engine.core.engine.llm import LLM

    return LLM(args.model, platform=args.platform, dtype=args.dtype, activation_quant=args.activation_quant,
               gpu_memory_utilization=args.gpu_memory_utilization, enforce_eager=args.enforce_eager, **kwargs)


def add_arguments(p) -> None:
    p.add_argument("prompts", nargs="*", help="prompts (default: read one prompt from stdin; '-' also reads stdin)")
    p.add_argument("--file", help="read prompts from this file, one per line")
    add_model_arguments(p)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--no-chat", action="store_true", help="send the prompt as raw text, without the chat template")


def read_prompts(args) -> list[str]:
    prompts = [p for p in args.prompts if p != "-"]
    if args.file:
        with open(args.file, encoding="utf-8") as f:
            prompts += [line.rstrip("\n") for line in f if line.strip()]
    if not prompts or "-" in args.prompts:
        if sys.stdin is None or sys.stdin.isatty() and not prompts:
            raise SystemExit("engine generate: give a prompt, e.g. engine generate \"What is the capital of France?\"")
        if not sys.stdin.isatty() or "-" in args.prompts:
            text = sys.stdin.read().strip()
            if text:
                prompts.append(text)
    if not prompts:
        raise SystemExit("engine generate: no prompt given (arguments, --file, or stdin were all empty)")
    return prompts


def run(args) -> int:
    from engine.core.engine.sampling_params import SamplingParams

    prompts = read_prompts(args)
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, min_p=args.min_p,
                            seed=args.seed, max_tokens=args.max_tokens, stop=args.stop)
    llm = load_llm(args)
    chat = not args.no_chat and llm.tokenizer.chat_template is not None
    inputs = [llm.tokenizer.encode(llm.chat_prompt([{"role": "user", "content": p}]), add_special_tokens=False)
              if chat else p for p in prompts]
    if len(inputs) == 1:
        for update in llm.stream(inputs, params):
            sys.stdout.write(update.delta_text)
            sys.stdout.flush()
        sys.stdout.write("\n")
        return 0
    for i, out in enumerate(llm.generate(inputs, params)):
        print(f"=== [{i}] {prompts[i]}\n{out.text}\n")
    return 0
