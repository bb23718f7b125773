"""Quantized checkpoints end to end (issue 27's goals): an 8B-shaped random Llama written as bf16 and as the formats
users download (compressed-tensors FP8 per-channel weights with dynamic per-token activations, ModelOpt NVFP4, GPTQ
INT4 with groups of 128), each loaded by ``LLM`` as a user would and decoded at 1 and 64 requests; the ratio is the
bf16 model's decode step time over the format's, measured in the same run.

Goals (on the H200): FP8 >= 1.6x bf16 at 1 request and >= 1.3x at 64; NVFP4 >= 2.5x and INT4 >= 2.5x at 1 request.

    python benchmarks/gpu/quant_models.py [--formats bf16,fp8,nvfp4,gptq,gptq8] [--out DIR]

Checkpoints are written under /dev/shm where it has room (the machine's memory), else the temp directory, one at a
time, and removed after their rows. Rows are appended to DIR/quant_models.jsonl as they come (a run stopped by a
time limit keeps what it measured). ``run(tiny=True)`` does the same with a 2-layer model on whatever device there
is (what CI runs: the numbers mean nothing).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.bench_gpu import _empty_cache as empty_cache  # noqa: E402
from benchmarks.bench_gpu import emit_row, engine_generate, script_main

FORMATS = ("bf16", "fp8", "nvfp4", "gptq", "gptq8")
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
STACKED = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))  # calibrated together, as ModelOpt exports
GOALS = {("fp8", 1): 1.6, ("fp8", 64): 1.3, ("nvfp4", 1): 2.5, ("gptq", 1): 2.5}
E2M1_MIDPOINTS = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])  # between 0, .5, 1, 1.5, 2, 3, 4, 6


def fp8_channel(w: torch.Tensor) -> dict:
    s = w.float().abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 448.0
    return {"weight": (w.float() / s).to(torch.float8_e4m3fn), "weight_scale": s}


def nvfp4(w: torch.Tensor, amax: torch.Tensor) -> dict:
    """ModelOpt's export: uint8 codes [N, K/2] (low nibble first), e4m3 scales per 16, fp32 weight_scale_2."""
    scale_2 = (amax.float() / (6 * 448)).clamp(min=1e-12)
    blocks = w.float().reshape(w.shape[0], -1, 16)
    scale = (blocks.abs().amax(-1) / 6 / scale_2).clamp(max=448).to(torch.float8_e4m3fn)
    denom = (scale.float() * scale_2)[..., None]
    v = (blocks / torch.where(denom > 0, denom, 1)).reshape(w.shape)
    codes = torch.bucketize(v.abs(), E2M1_MIDPOINTS.to(w.device)).to(torch.uint8) | ((v < 0).to(torch.uint8) << 3)
    return {"weight": codes[:, 0::2] | (codes[:, 1::2] << 4), "weight_scale": scale,
            "weight_scale_2": scale_2.reshape(()), "input_scale": torch.tensor(1.0, device=w.device)}


def _pack8(v: torch.Tensor, bits: int = 4) -> torch.Tensor:
    """[..., C * 32 / bits] values -> int32 [..., C], field j (low bits first) holding element j of each word."""
    per = 32 // bits
    groups = v.to(torch.int64).reshape(*v.shape[:-1], -1, per)
    word = sum(groups[..., j] << (bits * j) for j in range(per))
    return (word - (word >= 2**31) * 2**32).to(torch.int32)


def gptq_sym(w: torch.Tensor, group: int = 128, bits: int = 4) -> dict:
    """GPTQ v1, symmetric, 4- or 8-bit: qweight [K / (32 / bits), N] packed along k, qzeros [G, N / (32 / bits)]
    holding zero - 1, fp16 scales."""
    n, k = w.shape
    per, mid = 32 // bits, 1 << (bits - 1)
    parts = w.float().reshape(n, k // group, group)
    s = (parts.abs().amax(-1) / (mid - 0.5)).clamp(min=1e-6).half()  # [N, G]
    q = torch.round(parts / s.float()[..., None] + mid).clamp(0, 2 * mid - 1).reshape(n, k)
    return {"qweight": _pack8(q.t().reshape(k // per, per, n).transpose(1, 2).reshape(k // per, n * per), bits),
            "qzeros": _pack8(torch.full((k // group, n), mid - 1, device=w.device), bits),
            "scales": s.t().contiguous(), "g_idx": (torch.arange(k, device=w.device) // group).to(torch.int32)}


def quantization_config(fmt: str) -> dict:
    if fmt == "fp8":
        return {"quant_method": "compressed-tensors", "format": "float-quantized", "ignore": ["lm_head"],
                "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                    "num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True, "dynamic": False},
                    "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "symmetric": True,
                                          "dynamic": True}}}}
    if fmt == "nvfp4":
        return {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "kv_cache_quant_algo": None,
                "exclude_modules": ["lm_head"]}
    return {"quant_method": "gptq", "bits": 8 if fmt == "gptq8" else 4, "group_size": 128, "sym": True,
            "desc_act": False, "checkpoint_format": "gptq"}


def write_format(base: Path, out: Path, fmt: str, device: str) -> None:
    """``base`` (a bf16 Llama directory) rewritten in ``fmt`` at ``out``: every linear of the layers quantized."""
    shutil.copytree(base, out, ignore=shutil.ignore_patterns("model.safetensors"))
    tensors = {}
    with safe_open(base / "model.safetensors", "pt", device=device) as f:
        names = list(f.keys())
        for name in names:
            w, parts = f.get_tensor(name), name.split(".")
            if not (name.endswith(".weight") and parts[-2] in LINEARS):
                tensors[name] = w.cpu()
                continue
            prefix = name.removesuffix("weight")
            if fmt == "fp8":
                q = fp8_channel(w)
            elif fmt in ("gptq", "gptq8"):
                q = gptq_sym(w, bits=8 if fmt == "gptq8" else 4)
            else:
                group = next((g for g in STACKED if parts[-2] in g), (parts[-2],))
                amax = max(f.get_tensor(name.replace(parts[-2], g)).float().abs().max() for g in group)
                q = nvfp4(w, amax)
            tensors.update({prefix + k: v.cpu() for k, v in q.items()})
            del w, q
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "quantization_config": quantization_config(fmt)}))


def _scratch(need_bytes: int) -> str:
    shm = "/dev/shm"
    if os.path.isdir(shm) and shutil.disk_usage(shm).free > 2.5 * need_bytes:
        return shm
    return tempfile.gettempdir()


def _chosen(llm) -> list[str]:
    """The functions layer 0's down projection has run so far (its CallSite's choices): which kernel decoded."""
    site = llm.model.layers[0].mlp.down.site
    return sorted({getattr(fn, "__name__", type(fn).__name__) for fn in site.chosen().values()})


def run(tiny: bool = False, formats=FORMATS, out: Path | None = None) -> list[dict]:
    from engine import LLM
    from engine.core.testing.random_model import LLAMA_8B, write_random_llama

    device = "cuda" if torch.cuda.is_available() else "cpu"
    shape = (dict(vocab_size=512, hidden_size=256, intermediate_size=512, num_layers=2, num_heads=4,
                  num_kv_heads=2) if tiny else LLAMA_8B)
    batches, in_len, out_len = ((1, 2), 8, 8) if tiny else ((1, 64), 128, 128)
    bf16_bytes = 2 * shape["num_layers"] * shape["hidden_size"] * (2 * shape["hidden_size"] + 3 * shape[
        "intermediate_size"])
    root = Path(tempfile.mkdtemp(prefix="quant_models_", dir=_scratch(bf16_bytes)))
    rows, step_ms = [], {}
    try:
        base = write_random_llama(root / "bf16", **shape, max_position=4096, dtype=torch.bfloat16, device=device)
        for fmt in formats:
            t0 = time.perf_counter()
            path = base if fmt == "bf16" else root / fmt
            if fmt != "bf16":
                write_format(base, path, fmt, device)
            written = time.perf_counter() - t0
            t0 = time.perf_counter()
            llm = LLM(str(path), dtype="bfloat16", max_num_seqs=max(batches), max_model_len=1024,
                      max_num_batched_tokens=8192, enable_prefix_caching=False)
            loaded = time.perf_counter() - t0
            kept = type(llm.model.layers[0].mlp.down.w).__name__  # what the weights stayed as in memory
            for b in batches:
                tps, _, split = engine_generate(llm, b, in_len, out_len + (b == 1), shape["vocab_size"])
                step_ms[fmt, b] = split["decode_step_ms"]
                ratio = step_ms["bf16", b] / split["decode_step_ms"] if ("bf16", b) in step_ms else None
                goal = GOALS.get((fmt, b))
                emit_row(rows, {"bench": f"decode {fmt}", "shape": f"{b} req x {in_len} in / {out_len} out",
                             "tok_s": tps, "decode_step_ms": split["decode_step_ms"], "vs_bf16": ratio,
                             "peer": "bf16 model, same run", "goal": f">= {goal}x bf16" if goal else "",
                             "met": None if goal is None or ratio is None else ratio >= goal,
                             "weights": kept, "checkpoint_bytes": (path / "model.safetensors").stat().st_size,
                             "write_s": written, "load_s": loaded, "down_proj_kernels": _chosen(llm)},
                         out, "quant_models")
            del llm
            empty_cache()
            if fmt != "bf16":
                shutil.rmtree(path)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return rows


if __name__ == "__main__":
    script_main(__doc__, run, lambda ap: ap.add_argument("--formats", type=lambda v: tuple(v.split(",")),
                                                         default=FORMATS))
