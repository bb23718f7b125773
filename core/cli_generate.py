"""``engine generate``: complete prompts on the command line, streaming a single prompt to the terminal.

Each prompt is sent as one user message through the model's chat template (``--no-chat`` sends the raw text, as
``LLM.generate`` does; ``LLM.chat`` applies the template). Sampling options left out take the model's defaults,
``LLM.get_default_sampling_params()``: what ``LLM.generate`` uses without SamplingParams.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

from engine.core.engine.sampling_params import SamplingParams

DTYPES = ("float32", "bfloat16", "float16")
NO_PROMPT = 'no prompt given (or only an empty one); e.g. engine generate "What is the capital of France?"'


def add_model_arguments(p) -> None:
    """The options that choose the model and how it runs (shared by generate and bench); see load_llm."""
    p.add_argument("--model", help="GGUF file or HF directory (default: the built-in SmolLM2-135M-Instruct)")
    p.add_argument("--platform", help="force a platform (same as ENGINE_PLATFORM)")
    p.add_argument("--dtype", default="float32", choices=DTYPES,
                   help="activation dtype; only the ones the platform has fast kernels for are accepted")
    p.add_argument("--activation-quant", default="none", choices=("none", "q8", "auto"),
                   help="GGUF weights: round activations to Q8 blocks before each quantized matmul (q8, as llama.cpp"
                        " on CPUs; auto = q8 where the platform has a kernel for it) or not (none)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                   help="GPU platforms: fraction of the device's memory for weights, activations and KV cache")
    p.add_argument("--enforce-eager", action="store_true",
                   help="no decode graphs (CUDA graphs on GPUs, recorded kernel calls on CPUs)")
    p.add_argument("--skip-warmup", action="store_true",
                   help="GPU platforms: start without running the first requests' shapes at load (each kernel then "
                        "compiles on the first request that needs it)")
    p.add_argument("--tensor-parallel-size", type=int, default=1, metavar="N",
                   help="split the model over N ranks, one process each (dense and MoE decoders; gloo on CPUs, NCCL on "
                        "GPUs: one device a rank)")
    p.add_argument("--chat-template", type=chat_template_option, default=None, metavar="FILE_OR_TEXT",
                   help="the chat template to use instead of the model's: a Jinja file, or the template itself")
    p.add_argument("--speculative-config", type=speculative_config, default=None, metavar="JSON",
                   help='speculative decoding, as vLLM spells it: \'{"method": "ngram", "num_speculative_tokens": 4}\','
                        ' \'{"method": "draft_model", "model": PATH}\' or a table by batch size, '
                        '\'{"method": "ngram", "num_speculative_tokens_per_batch_size": {"1": 4, "8": 2, "32": 0}}\'')


def speculative_config(text: str) -> dict:
    """--speculative-config: a JSON object checked by SpeculativeConfig now, so a typo fails before the model
    loads (argparse prints the message and exits 2)."""
    import argparse

    from engine.core.engine.spec_decode.config import SpeculativeConfig

    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON ({exc.msg} at column {exc.colno}): {text!r}; quote the object "
                                         "for the shell, e.g. '{\"method\": \"ngram\"}'") from exc
    try:
        SpeculativeConfig.from_dict(config)
    except (TypeError, ValueError) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    return config


def chat_template_option(value: str) -> str:
    """--chat-template: a file's text or the template itself (as vLLM takes it), compiled now so that a bad one
    fails before the model loads."""
    import argparse

    from engine.core.loader.chat_template import compile_chat_template

    if os.path.isfile(value):
        with open(value, encoding="utf-8") as f:
            value = f.read()
    elif "{{" not in value and "{%" not in value:
        raise argparse.ArgumentTypeError(f"{value!r} is neither a file nor a Jinja template (no '{{{{' or '{{%')")
    try:
        compile_chat_template(value)
    except ValueError as exc:
        reason = str(exc).split("(", 1)[-1].split(")", 1)[0]
        raise argparse.ArgumentTypeError(f"the template does not parse ({reason})") from exc
    return value


def use_chat_template(llm, args) -> None:
    """Put --chat-template (when given) in place of the model's own."""
    if getattr(args, "chat_template", None) is not None:
        llm.tokenizer.chat_template = args.chat_template


def checked_platform(args):
    """The selected platform, once it is known to have fast kernels for --dtype."""
    import torch

    from engine.core import plugins

    platform = plugins.activate(args.platform)
    fast = platform.supported_dtypes()
    if getattr(torch, args.dtype) not in fast:
        names = ", ".join(str(d).removeprefix("torch.") for d in fast)
        raise ValueError(f"--dtype {args.dtype}: platform {platform.name!r} has fast kernels for {names} only; "
                         f"{args.dtype} would run ops on their slow plain-torch references. Use --dtype "
                         f"{names.split(',')[0]}")
    return platform


def llm_kwargs(args) -> dict:
    """LLM's keyword arguments for the model options (the platform aside)."""
    return dict(model=args.model, dtype=args.dtype, activation_quant=args.activation_quant,
                gpu_memory_utilization=args.gpu_memory_utilization, enforce_eager=args.enforce_eager,
                speculative_config=getattr(args, "speculative_config", None),
                tensor_parallel_size=getattr(args, "tensor_parallel_size", 1),
                warmup=False if getattr(args, "skip_warmup", False) else None)


def load_llm(args, **kwargs):
    """The LLM the model options describe. A --dtype the selected platform has no kernels for is refused (every
    op it lacks would run on its plain-torch reference); the Python API allows it and warns once per op instead."""

    from engine.core.engine.llm import LLM

    platform = checked_platform(args)
    llm = LLM(platform=platform, **llm_kwargs(args), **kwargs)
    use_chat_template(llm, args)
    from engine.core.cli import resume_gc

    resume_gc()  # start-up is over (see cli.main)
    return llm


def add_arguments(p) -> None:
    d = {f.name: f.default for f in dataclasses.fields(SamplingParams)}
    p.add_argument("prompts", nargs="*", help="prompts, each sent as a user message through the model's chat "
                   "template (none: read one prompt from stdin; '-' also reads stdin)")
    p.add_argument("--file", help="read prompts from this file, one per line (blank lines skipped)")
    add_model_arguments(p)
    p.add_argument("--max-tokens", type=int, default=d["max_tokens"], help="most tokens generated per prompt")
    model = "default: the model's (generation_config.json; the built-in model: repetition penalty 1.1), else"
    p.add_argument("--temperature", type=float, help=f"0 = greedy ({model} {d['temperature']})")
    p.add_argument("--top-p", type=float, help=f"nucleus sampling; 1 = off ({model} {d['top_p']})")
    p.add_argument("--top-k", type=int, help=f"0 = off ({model} {d['top_k']})")
    p.add_argument("--min-p", type=float, help=f"0 = off ({model} {d['min_p']})")
    p.add_argument("--seed", type=int, default=d["seed"], help="makes sampling reproducible")
    p.add_argument("--repetition-penalty", type=float,
                   help=f"> 1 discourages tokens already in the prompt or output; 1 = off ({model} "
                        f"{d['repetition_penalty']})")
    p.add_argument("--presence-penalty", type=float, default=d["presence_penalty"], help="in [-2, 2]; 0 = off")
    p.add_argument("--frequency-penalty", type=float, default=d["frequency_penalty"], help="in [-2, 2]; 0 = off")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--no-chat", action="store_true", help="send the prompt as raw text, without the chat template")


def read_prompts(args) -> list[str]:
    """The prompts from the arguments, --file and stdin ('-', or no prompt argument with stdin not a terminal).
    An empty or blank prompt, from wherever, is the same error as none at all."""
    prompts = [p for p in args.prompts if p != "-"]
    if args.file:
        with open(args.file, encoding="utf-8") as f:
            prompts += [line.rstrip("\n") for line in f if line.strip()]
    if "-" in args.prompts or not args.prompts and not args.file and sys.stdin is not None and not sys.stdin.isatty():
        prompts.append(sys.stdin.read().strip())
    if not prompts or not all(p.strip() for p in prompts):
        raise ValueError(NO_PROMPT)
    return prompts


# Options whose default is the model's (None when not given on the command line).
MODEL_DEFAULTED = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def sampling_options(args) -> dict:
    """The SamplingParams fields the command line sets: the model-defaulted ones only where given."""
    given = {k: getattr(args, k) for k in MODEL_DEFAULTED if getattr(args, k) is not None}
    return dict(given, seed=args.seed, max_tokens=args.max_tokens, stop=args.stop,
                presence_penalty=args.presence_penalty, frequency_penalty=args.frequency_penalty)


def run(args) -> int:
    prompts = read_prompts(args)
    options = sampling_options(args)
    SamplingParams(**options)  # bad values are refused before the model loads
    llm = load_llm(args)
    params = dataclasses.replace(llm.get_default_sampling_params(), **options)
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
        print(f"=== [{i}] {prompts[i]}\n{out.outputs[0].text}\n")
    return 0
