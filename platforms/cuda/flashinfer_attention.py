"""FlashInfer paged attention for the cuda platform, used when the ``flashinfer`` package is installed.

Gated on ``importlib.util.find_spec("flashinfer")`` (nothing is imported until ``register`` finds it) and on
compute capability >= 8.0. FlashInfer's NHD paged layout is ours ([num_pages, page_size, Hk, D] per cache),
so only the page table changes form: our padded ``block_tables`` [B, max_blocks] + ``seq_lens`` [B] become
FlashInfer's CSR triple (``paged_kv_indptr`` [B+1], ``paged_kv_indices`` [indptr[-1]],
``paged_kv_last_page_len`` [B]); :func:`paged_kv_metadata` is that conversion, a pure torch function tested
against FlashInfer's documented contract (tests/platforms/cuda/test_flashinfer_attention.py). FlashInfer's
``causal=True`` is bottom-right aligned (query i of a q_len-row request sees kv positions <= kv_len - q_len + i),
which is exactly ``paged_attention_prefill``'s contract.

Not CUDA-graph capturable: ``plan()`` reads the page table back to the host and schedules there. The adapter
therefore plans once per distinct (block_tables, seq_lens[, cu_seqlens_q]) — one plan per step, shared by every
layer, since the engine passes the same metadata tensors to all layers — and, while a CUDA graph is being captured,
hands the call to the portable Triton kernel instead (so captured decode graphs replay the Triton kernel).
Nothing here can run on the machines we have (FACTS.md: flashinfer is not installed on the H200 box, its wheel is
too large to carry); the conversion and the gate are what is tested.
"""

from __future__ import annotations

import importlib.util
import threading

import torch

from engine.core.ops.attention import paged_attention_decode, paged_attention_prefill

PRIORITY = 20  # above the portable Triton kernels (10)
WORKSPACE_BYTES = 128 << 20
_HEAD_DIMS = (64, 128, 256)
_DTYPES = (torch.float16, torch.bfloat16)


def flashinfer_available() -> bool:
    return importlib.util.find_spec("flashinfer") is not None


def paged_kv_metadata(block_tables: torch.Tensor, seq_lens: torch.Tensor, block_size: int):
    """Our page table -> FlashInfer's (paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len), all int32.

    Sequence b owns ``n_b = ceil(seq_lens[b] / block_size)`` pages, ``block_tables[b, :n_b]`` (entries past them are
    never read); FlashInfer wants them concatenated (``indices[indptr[b]:indptr[b+1]]``) and the number of valid
    slots in each last page, ``1 <= last_page_len <= page_size``, so that ``(n_b - 1) * page_size + last_page_len[b]
    == seq_lens[b]``. A seq_len past ``max_blocks * block_size`` is clamped to it (as the op's reference does).
    ``indices`` has a data-dependent length: building it reads back to the host (as FlashInfer's plan() does anyway).
    """
    if block_tables.dim() != 2 or seq_lens.dim() != 1 or seq_lens.shape[0] != block_tables.shape[0]:
        raise ValueError(f"need block_tables [B, max_blocks] and seq_lens [B], got {tuple(block_tables.shape)} "
                         f"and {tuple(seq_lens.shape)}")
    max_blocks = block_tables.shape[1]
    lens = seq_lens.long().clamp(0, max_blocks * block_size)
    pages = (lens + block_size - 1) // block_size
    indptr = torch.zeros(seq_lens.shape[0] + 1, dtype=torch.int32, device=seq_lens.device)
    indptr[1:] = pages.cumsum(0)
    owned = torch.arange(max_blocks, device=block_tables.device)[None, :] < pages[:, None]
    indices = block_tables[owned].to(torch.int32).contiguous()  # row-major: sequence by sequence, in order
    last_page_len = (lens - (pages - 1).clamp(min=0) * block_size).to(torch.int32)
    return indptr, indices, last_page_len


def _supports(q, key_cache, value_cache, block_tables, seq_lens, capability):
    tensors = (q, key_cache, value_cache, block_tables, seq_lens)
    if not all(isinstance(t, torch.Tensor) and t.device.type == "cuda" for t in tensors):
        return "tensors must be on the cuda device"
    if q.dtype not in _DTYPES or key_cache.dtype != q.dtype or value_cache.dtype != q.dtype:
        return "FlashInfer path: q and caches must share one dtype of fp16, bf16"
    if capability is not None and tuple(capability) < (8, 0):
        return f"FlashInfer path needs compute capability >= 8.0, this device has {tuple(capability)}"
    if q.dim() != 3 or key_cache.dim() != 4 or value_cache.shape != key_cache.shape:
        return "q must be [T, Hq, D] and both caches [num_blocks, block_size, Hk, D] of one shape"
    hq, d, hk = q.shape[1], q.shape[2], key_cache.shape[2]
    if key_cache.shape[3] != d or hk == 0 or hq % hk:
        return "need cache head_dim == q head_dim and Hq a multiple of Hk"
    if d not in _HEAD_DIMS:
        return f"FlashInfer path: head_dim {d} not in {_HEAD_DIMS}"
    if not (q.is_contiguous() and key_cache.is_contiguous() and value_cache.is_contiguous()):
        return "FlashInfer path: q and the caches must be contiguous"
    if block_tables.dtype != torch.int32 or block_tables.dim() != 2 or seq_lens.dtype != torch.int32 \
            or seq_lens.dim() != 1 or seq_lens.shape[0] != block_tables.shape[0]:
        return "block_tables must be int32 [B, max_blocks] and seq_lens int32 [B]"
    return True


class FlashInferAttention:
    """One FlashInfer decode and one prefill wrapper (lazily built on first use) sharing one workspace."""

    def __init__(self, workspace_bytes: int = WORKSPACE_BYTES):
        self.workspace_bytes = workspace_bytes
        self._lock = threading.Lock()
        self._workspace = None
        self._decode = self._prefill = None
        self._decode_src = self._prefill_src = None  # the metadata tensors (held) and the key of the last plan

    def _wrappers(self, device):
        if self._workspace is None:
            import flashinfer

            self._workspace = torch.empty(self.workspace_bytes, dtype=torch.uint8, device=device)
            self._decode = {}
            self._prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self._workspace, "NHD")
        return self._decode, self._prefill

    @staticmethod
    def _same(src, tensors, key) -> bool:
        # Holding the tensors keeps their memory from being reused by new ones at the same address; their _version
        # counters catch in-place updates (the engine refreshes its metadata buffers with copy_()).
        return src is not None and len(src[0]) == len(tensors) and src[2] == key and all(
            a is b and v == b._version for a, v, b in zip(src[0], src[1], tensors, strict=True))

    def decode(self, q, key_cache, value_cache, block_tables, seq_lens, scale):
        if torch.cuda.is_current_stream_capturing():  # plan() cannot be captured
            from engine.platforms.triton_kernels.attention import paged_decode

            return paged_decode(q, key_cache, value_cache, block_tables, seq_lens, scale)
        import flashinfer

        _, bs, hk, d = key_cache.shape
        hq = q.shape[1]
        use_tc = hq // hk >= 4
        key = (hq, hk, d, bs, q.dtype, float(scale), use_tc)
        with self._lock:
            decoders, _ = self._wrappers(q.device)
            wrapper = decoders.get(use_tc)
            if wrapper is None:
                wrapper = decoders[use_tc] = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                    self._workspace, "NHD", use_tensor_cores=use_tc)
            if not self._same(self._decode_src, (block_tables, seq_lens), key):
                indptr, indices, last = paged_kv_metadata(block_tables, seq_lens, bs)
                wrapper.plan(indptr, indices, last, hq, hk, d, bs, q_data_type=q.dtype, kv_data_type=key_cache.dtype,
                             sm_scale=float(scale))
                self._decode_src = ((block_tables, seq_lens), (block_tables._version, seq_lens._version), key)
            return wrapper.run(q, (key_cache, value_cache))

    def prefill(self, q, key_cache, value_cache, block_tables, cu_seqlens_q, seq_lens, scale):
        if torch.cuda.is_current_stream_capturing():
            from engine.platforms.triton_kernels.attention import paged_prefill

            return paged_prefill(q, key_cache, value_cache, block_tables, cu_seqlens_q, seq_lens, scale)
        _, bs, hk, d = key_cache.shape
        hq = q.shape[1]
        key = (hq, hk, d, bs, q.dtype, float(scale))
        with self._lock:
            _, wrapper = self._wrappers(q.device)
            srcs = (block_tables, cu_seqlens_q, seq_lens)
            if not self._same(self._prefill_src, srcs, key):
                indptr, indices, last = paged_kv_metadata(block_tables, seq_lens, bs)
                wrapper.plan(cu_seqlens_q, indptr, indices, last, hq, hk, d, bs, causal=True, sm_scale=float(scale),
                             q_data_type=q.dtype, kv_data_type=key_cache.dtype)
                self._prefill_src = (srcs, tuple(t._version for t in srcs), key)
            return wrapper.run(q, (key_cache, value_cache))


def make_supports(capability=None):
    def supports_decode(q, key_cache, value_cache, block_tables, seq_lens, scale=None):
        ok = _supports(q, key_cache, value_cache, block_tables, seq_lens, capability)
        if ok is True and q.shape[0] != seq_lens.shape[0]:
            return "decode takes exactly one query per sequence"
        return ok

    def supports_prefill(q, key_cache, value_cache, block_tables, cu_seqlens_q, seq_lens, scale=None):
        ok = _supports(q, key_cache, value_cache, block_tables, seq_lens, capability)
        if ok is True and not (isinstance(cu_seqlens_q, torch.Tensor) and cu_seqlens_q.device.type == "cuda"
                               and cu_seqlens_q.dtype == torch.int32
                               and cu_seqlens_q.shape == (seq_lens.shape[0] + 1,)):
            return "cu_seqlens_q must be an int32 [B+1] cuda tensor"
        return ok

    return supports_decode, supports_prefill


def gate(capability) -> str | None:
    """None when the FlashInfer path can be offered here, else why not (without importing flashinfer)."""
    if not flashinfer_available():
        return "flashinfer is not installed (pip install flashinfer-python)"
    if capability is not None and tuple(capability) < (8, 0):
        return f"FlashInfer path needs compute capability >= 8.0, this device has {tuple(capability)}"
    return None


def register(registry, device_type: str = "cuda", capability: tuple[int, int] | None = None) -> None:
    """Register the FlashInfer decode and prefill (priority 20, above Triton) or record why they are skipped.
    For the cuda platform's ``register_kernels``; ``device_type`` must be "cuda"."""
    names = (("flashinfer_paged_decode", paged_attention_decode), ("flashinfer_paged_prefill", paged_attention_prefill))
    why = gate(capability) if device_type == "cuda" else f"FlashInfer runs on cuda, not {device_type}"
    if why is None:
        try:
            import flashinfer

            missing = [n for n in ("BatchDecodeWithPagedKVCacheWrapper", "BatchPrefillWithPagedKVCacheWrapper")
                       if not hasattr(getattr(flashinfer, n, None), "plan")]
            if missing:
                why = f"flashinfer {getattr(flashinfer, '__version__', '?')} lacks plan()-style {missing}"
        except Exception as exc:
            why = f"import flashinfer failed: {type(exc).__name__}: {exc}"
    if why is not None:
        for name, op in names:
            registry.skip(op, name, why)
        return
    impl = FlashInferAttention()
    supports_decode, supports_prefill = make_supports(capability)
    registry.register(paged_attention_decode, impl.decode, name=names[0][0], supports=supports_decode,
                      priority=PRIORITY, dtypes=_DTYPES, note="FlashInfer, planned once per step; Triton under capture")
    registry.register(paged_attention_prefill, impl.prefill, name=names[1][0], supports=supports_prefill,
                      priority=PRIORITY, dtypes=_DTYPES, note="FlashInfer, causal bottom-right, planned once per step")
