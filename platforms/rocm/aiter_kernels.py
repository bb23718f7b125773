"""AITER (AMD's kernel library, ``pip install amd-aiter``) behind engine ops, on gfx942 (MI300) and gfx950 (MI350):
adapters that turn an op's arguments into the AITER call's layouts, registered above the portable Triton kernels
where ``aiter`` imports on those archs, and recorded as skipped with the reason elsewhere.

* ``mla_decode`` -> ``aiter.mla.mla_decode_fwd`` (assembly MLA decode). The engine's latent cache [pages, page_size,
  576] is handed over as pages of one token (``kv_buffer`` [slots, 1, 1, 576], as vLLM runs AITER MLA), the block
  tables become ``kv_indices`` (the token slots of each sequence, in order) with ``kv_indptr`` (their offsets),
  ``qo_indptr`` = arange (one query per sequence), ``kv_last_page_lens`` ones; AITER writes the [B, H, 512] output
  into ``o``. Its kernels take 16 or 128 heads (vLLM's check), bf16, Dqk 576 / v 512. The indices are built on the
  device in fixed-size buffers (B x the block table's tokens; what follows the last sequence's slots is never read),
  with no host sync: CUDA-graph capturable.
* ``fp8_linear`` -> ``aiter.gemm_a8w8_CK`` (per-token x per-channel scales: x_scale [M, 1], w_scale [1, N]; a
  per-tensor side is expanded to rows) and ``aiter.gemm_a8w8_blockscale`` (1x128 activation groups with 128x128
  weight blocks: the op's own scale layouts, [M, K/128] and [N/128, K/128]). bf16 / fp16 outputs; no bias (the
  Triton GEMM takes those).
* ``fused_moe``: not wired. AITER's fused MoE wants its expert weights pre-shuffled at load
  (``aiter.ops.shuffle.shuffle_weight``) and marked as such; the Triton fused MoE serves MoE on ROCm.

The layouts are from AITER's sources (aiter/mla.py, aiter/ops/gemm_op_a8w8.py) and vLLM's callers
(vllm/v1/attention/backends/mla/rocm_aiter_mla.py, vllm/_aiter_ops.py); tests/platforms/rocm checks each adapter on
the CPU against the op's reference through a torch model of the AITER call's documented semantics. None of it has run
on AMD hardware here.
"""

from __future__ import annotations

import torch

from engine.core.ops.fp8 import BLOCK_K, fp8_linear
from engine.core.ops.mla import mla_decode

AITER_ARCHS = ("gfx942", "gfx950")
PRIORITY = 30  # above the Triton kernels (10) and torch._scaled_mm (20)
MLA_HEADS = (16, 128)
NOT_RUN = "not run on AMD hardware here"


def aiter_gate(gcn_arch: str, import_error: str | None) -> tuple[bool, str]:
    """Whether AITER's kernels serve this device: ``gcn_arch`` (torch's gcnArchName, e.g. "gfx942:sramecc+:xnack-")
    and the error importing ``aiter`` (None: it imported)."""
    arch = gcn_arch.split(":")[0]
    if arch not in AITER_ARCHS:
        return False, f"AITER's kernels are built for {', '.join(AITER_ARCHS)}; this GPU is {arch}"
    if import_error is not None:
        return False, f"aiter does not import ({import_error}): pip install -e \".[rocm]\" (amd-aiter)"
    return True, f"AITER on {arch} ({NOT_RUN})"


# ---- mla_decode ---------------------------------------------------------------------------------------------------


def mla_decode_fwd_args(q, kv_cache, block_tables, seq_lens, scale, v_dim=512) -> dict:
    """``aiter.mla.mla_decode_fwd`` keyword arguments for one ``mla_decode`` call (``o`` allocated here, filled by
    the call)."""
    b, h, d = q.shape
    page = kv_cache.shape[1]
    dev = q.device
    width = block_tables.shape[1] * page
    tokens = torch.arange(width, device=dev)
    slots = block_tables.long().repeat_interleave(page, dim=1) * page + tokens % page  # [B, width]
    kv_indptr = torch.zeros(b + 1, dtype=torch.int32, device=dev)
    kv_indptr[1:] = torch.cumsum(seq_lens, 0)
    # each sequence's slots, in order, from kv_indptr[b]; tokens past a sequence's length go to a dump entry
    at = torch.where(tokens[None, :] < seq_lens.long()[:, None], kv_indptr[:-1].long()[:, None] + tokens, b * width)
    flat = torch.zeros(b * width + 1, dtype=torch.int32, device=dev)
    kv_indices = flat.scatter_(0, at.reshape(-1), slots.reshape(-1).to(torch.int32))[:-1]
    return dict(q=q, kv_buffer=kv_cache.view(-1, 1, 1, d), o=torch.empty(b, h, v_dim, dtype=q.dtype, device=dev),
                qo_indptr=torch.arange(b + 1, dtype=torch.int32, device=dev), kv_indptr=kv_indptr,
                kv_indices=kv_indices, kv_last_page_lens=torch.ones(b, dtype=torch.int32, device=dev),
                max_seqlen_q=1, sm_scale=scale)


def mla_supports(q, kv_cache, block_tables, seq_lens, scale=None, v_dim=512):
    if not all(isinstance(t, torch.Tensor) and t.device.type == "cuda" for t in (q, kv_cache, block_tables, seq_lens)):
        return "tensors must be on the GPU"
    if q.dtype != torch.bfloat16 or kv_cache.dtype != torch.bfloat16:
        return f"AITER MLA decode takes bf16 here, not {q.dtype}/{kv_cache.dtype}"
    if q.dim() != 3 or q.shape[2] != 576 or v_dim != 512 or kv_cache.dim() != 3 or kv_cache.shape[2] != 576:
        return "AITER MLA decode takes DeepSeek's latent (Dqk 576, v_dim 512)"
    if q.shape[1] not in MLA_HEADS:
        return f"AITER MLA decode takes {MLA_HEADS} heads, not {q.shape[1]}"
    if not (q.is_contiguous() and kv_cache.is_contiguous()):
        return "q and kv_cache must be contiguous"
    return True


def make_mla_decode(aiter_mla):
    """The mla_decode implementation over ``aiter_mla.mla_decode_fwd``."""

    def aiter_mla_decode(q, kv_cache, block_tables, seq_lens, scale, v_dim=512):
        args = mla_decode_fwd_args(q, kv_cache, block_tables, seq_lens, scale, v_dim)
        aiter_mla.mla_decode_fwd(**args)
        return args["o"]

    return aiter_mla_decode


# ---- fp8_linear ---------------------------------------------------------------------------------------------------


def _rows(scale: torch.Tensor, rows: int) -> torch.Tensor:
    """A per-tensor or per-row scale as one fp32 value per row, [rows, 1]."""
    return scale.float().reshape(-1, 1).expand(rows, 1).contiguous() if scale.numel() == 1 else \
        scale.float().reshape(rows, 1).contiguous()


def gemm_a8w8_args(x_q, x_scale, w_q, w_scale, bias, out_dtype) -> tuple[str, tuple, dict]:
    """(AITER function name, positional args, keyword args) for an fp8_linear call ``gemm_supports`` accepts."""
    (m, k), n = x_q.shape, w_q.shape[0]
    if _scale_kind(w_scale, n, k, BLOCK_K) == "block":
        return "gemm_a8w8_blockscale", (x_q, w_q, x_scale.float().contiguous(), w_scale.float().contiguous()), \
            {"dtype": out_dtype}
    return "gemm_a8w8_CK", (x_q, w_q, _rows(x_scale, m), _rows(w_scale, n).t()), {"bias": None, "dtype": out_dtype}


def _scale_kind(scale: torch.Tensor, rows: int, k: int, block_rows: int) -> str | None:
    if scale.numel() == 1:
        return "tensor"
    if tuple(scale.shape) == (rows, 1):
        return "row"
    if tuple(scale.shape) == (-(-rows // block_rows), -(-k // BLOCK_K)):
        return "block"
    return None


def gemm_verdict(x_q, x_scale, w_q, w_scale, bias, out_dtype, fp8_dtype: torch.dtype) -> bool | str:
    """Whether AITER's FP8 GEMMs compute this fp8_linear call (everything but the device): True or why not."""
    if x_q.dtype != fp8_dtype or w_q.dtype != fp8_dtype:
        return f"AITER's FP8 GEMMs take this GPU's flavour {fp8_dtype}, not {x_q.dtype}"
    if out_dtype not in (torch.bfloat16, torch.float16):
        return f"AITER's FP8 GEMMs write bf16 or fp16, not {out_dtype}"
    if bias is not None:
        return "a bias: the Triton FP8 GEMM adds it in the reference's order"
    if x_q.dim() != 2 or w_q.dim() != 2 or not (x_q.is_contiguous() and w_q.is_contiguous()):
        return "x_q [M, K] and w_q [N, K] must be contiguous"
    (m, k), n = x_q.shape, w_q.shape[0]
    xs, ws = _scale_kind(x_scale, m, k, 1), _scale_kind(w_scale, n, k, BLOCK_K)
    if (xs == "block") != (ws == "block") or None in (xs, ws):
        return f"scales {xs} x / {ws} w: AITER takes per-tensor/per-row pairs or 1x128 with 128x128 blocks"
    if xs == "block" and (k % BLOCK_K or n % BLOCK_K):
        return "block-scaled AITER GEMM: K and N multiples of 128"
    if k % 16 or n % 16:
        return "AITER's FP8 GEMM: K and N multiples of 16"
    return True


def gemm_supports_for(fp8_dtype: torch.dtype):
    def supports(x_q, x_scale, w_q, w_scale, bias, out_dtype):
        if not all(isinstance(t, torch.Tensor) and t.device.type == "cuda" for t in (x_q, x_scale, w_q, w_scale)):
            return "tensors must be on the GPU"
        return gemm_verdict(x_q, x_scale, w_q, w_scale, bias, out_dtype, fp8_dtype)

    return supports


def make_fp8_linear(aiter):
    """The fp8_linear implementation over ``aiter.gemm_a8w8_CK`` / ``aiter.gemm_a8w8_blockscale``."""

    def aiter_fp8_linear(x_q, x_scale, w_q, w_scale, bias, out_dtype):
        name, args, kwargs = gemm_a8w8_args(x_q, x_scale, w_q, w_scale, bias, out_dtype)
        return getattr(aiter, name)(*args, **kwargs)

    return aiter_fp8_linear


# ---- registration -------------------------------------------------------------------------------------------------


def register(registry, gcn_arch: str, fp8_dtype: torch.dtype) -> None:
    """AITER's adapters where ``aiter_gate`` allows, else the reason for each, for ``engine doctor``."""
    import_error = None
    try:
        import aiter
        import aiter.mla as aiter_mla
    except Exception as exc:  # any failure to import is the reason these stay unregistered
        import_error = f"{type(exc).__name__}: {exc}"
    ok, why = aiter_gate(gcn_arch, import_error)
    moe_why = ("AITER's fused MoE needs expert weights pre-shuffled at load (aiter.ops.shuffle.shuffle_weight); not "
               "wired: the Triton fused MoE serves MoE on ROCm")
    registry.skip("fused_moe", "aiter_fused_moe", moe_why)
    if not ok:
        registry.skip(mla_decode, "aiter_mla_decode", why)
        registry.skip(fp8_linear, "aiter_gemm_a8w8", why)
        return
    registry.register(mla_decode, make_mla_decode(aiter_mla), name="aiter_mla_decode", supports=mla_supports,
                      priority=PRIORITY, dtypes=(torch.bfloat16,),
                      note=f"AITER mla_decode_fwd, pages of one token; {why}")
    registry.register(fp8_linear, make_fp8_linear(aiter), name="aiter_gemm_a8w8",
                      supports=gemm_supports_for(fp8_dtype), priority=PRIORITY, dtypes=(torch.bfloat16,),
                      note=f"AITER gemm_a8w8_CK (per-tensor / per-row) and gemm_a8w8_blockscale; {why}")
