"""Tensor-parallel engine: ``LLM(tensor_parallel_size=N)`` runs the model over N ranks, one process each.

Rank 0 is the engine process itself: it schedules, samples and detokenizes as always, with its share of the model
(core/models/tensor_parallel.py). Ranks 1..N-1 are worker processes it starts (multiprocessing "spawn"), each
holding its share of the weights and of the KV cache (the same blocks, its own heads). Every forward pass on rank 0
first broadcasts the step (ops.broadcast of a fixed header of HEADER int64s, then of one int64 tensor holding ids,
positions, slots, block tables, sequence lengths, query offsets and the rows whose logits are wanted); every rank
then runs the same forward, and the layers' all-reduces (ops.all_reduce) make the ranks' partial sums whole. Every
rank computes its vocabulary slice of the wanted rows' logits (``batch.logits_indices``: the caller must ask for
exactly those rows), which ops.all_gather joins on every rank. The collectives are the platform's where it has them
(the cpu platform's go through shared memory) and torch.distributed's over its ``dist_backend`` otherwise.

Failures end in an error, not a hang: a worker that cannot load its share reports why before the group forms; a
worker found dead before a step is named with its exit code; collectives time out after ``TIMEOUT``.
Decode graphs are off under tensor parallelism (a captured step would not broadcast itself). Only gloo on CPUs has
run: the NCCL path (each worker one device through the platform's device variable, step tensors on the device) is
written for GPUs but no machine with two was lent.
"""

from __future__ import annotations

import datetime
import multiprocessing
import os
import socket
import time

import torch
import torch.distributed as dist

from engine.core.models.batch import ForwardBatch
from engine.core.ops.comm import broadcast

TIMEOUT = datetime.timedelta(seconds=300)  # a collective waiting longer than this fails (a rank died mid-step)
STARTUP_SECONDS = 600  # loading a share of the model
HEADER = 8  # int64s: what comes next (STOP, KV or STEP) and its sizes
STOP, KV, STEP = 0, 1, 2


class TensorParallelError(RuntimeError):
    """A rank of the tensor-parallel group failed; the message names it and why."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _load_share(build: dict, rank: int, world: int):
    """(DecoderModel of this rank's share, the platform): the same loading LLM does, then the split."""
    from engine.core import plugins
    from engine.core.loader.checkpoint import load_checkpoint
    from engine.core.models.decoder import DecoderModel
    from engine.core.models.tensor_parallel import shard_model

    platform = plugins.activate(build["platform"])
    ckpt = load_checkpoint(build["model"], dtype=build["dtype"], dequantize=build["dequantize"])
    cfg, weights = shard_model(ckpt.config, ckpt.weights, rank, world)
    model = DecoderModel(cfg, weights, build["dtype"], platform.device(), build["quantize_activations"],
                         tensor_parallel=(rank, world))
    return model, platform


def worker_main(rank: int, world: int, port: int, build: dict, env: dict, cores: list[int], conn) -> None:
    """A worker rank: load its share, join the group, then run every step rank 0 broadcasts until told to stop."""
    os.environ.update(env)
    if cores and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cores)
    torch.set_num_threads(max(1, len(cores)))
    try:
        model, platform = _load_share(build, rank, world)
        platform.set_current_device(model.device)  # the device NCCL's object broadcasts use: this rank's only one
    except Exception as exc:
        conn.send(("error", f"tensor-parallel rank {rank} failed to load its share of the model: "
                            f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", None))
    dist.init_process_group(platform.dist_backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=TIMEOUT)
    try:
        kind, num_blocks, block_size = _recv_header(model.device)[:3]
        if kind != KV:
            raise TensorParallelError(f"rank {rank} expected the KV cache's geometry first, got message {kind}")
        tensors, heads, channels = model.cfg.kv_cache_layout
        kv = platform.empty_kv_caches(model.cfg.num_layers, (num_blocks, block_size, heads, channels), model.dtype,
                                      model.device)
        with torch.inference_mode():
            while (header := _recv_header(model.device))[0] == STEP:
                ids, batch = _recv_step(header[1:], model.device)
                hidden = model.forward(ids, batch, kv)
                if batch.logits_indices.numel():  # rank 0 asks for these rows' logits: the vocab slices gather
                    model.logits(hidden[batch.logits_indices])
    finally:
        dist.destroy_process_group()


def _recv_header(device) -> list[int]:
    return broadcast(torch.zeros(HEADER, dtype=torch.int64, device=_wire_device(device)), 0).tolist()


def _send_header(device, kind: int, *sizes: int) -> None:
    header = torch.zeros(HEADER, dtype=torch.int64)
    header[:1 + len(sizes)] = torch.tensor((kind, *sizes), dtype=torch.int64)
    broadcast(header.to(_wire_device(device)), 0)


def _pack(ids: torch.Tensor, batch: ForwardBatch) -> tuple[tuple, torch.Tensor]:
    parts = (ids, batch.positions, batch.slot_mapping, batch.block_tables.reshape(-1), batch.seq_lens,
             batch.cu_seqlens_q, batch.logits_indices)
    rows, cols = batch.block_tables.shape
    header = (ids.shape[0], rows, cols, batch.seq_lens.shape[0], int(batch.is_decode), batch.logits_indices.shape[0])
    return header, torch.cat([p.to(torch.int64) for p in parts])


def _wire_device(device: torch.device) -> torch.device:
    """Where the step tensor travels: gloo sends host tensors, NCCL device ones."""
    return torch.device("cpu") if dist.get_backend() == "gloo" else device


def _recv_step(header, device) -> tuple[torch.Tensor, ForwardBatch]:
    t, table_rows, table_cols, b, is_decode, n_logits = header[:6]
    table_shape, is_decode, w = (table_rows, table_cols), bool(is_decode), table_rows * table_cols
    flat = torch.empty(3 * t + w + 2 * b + 1 + n_logits, dtype=torch.int64, device=_wire_device(device))
    flat = broadcast(flat, 0).to(device)
    ids, pos, slots, tables, lens, cu, rows = flat.split([t, t, t, w, b, b + 1, n_logits])
    batch = ForwardBatch(positions=pos, slot_mapping=slots, block_tables=tables.to(torch.int32).view(table_shape),
                         seq_lens=lens.to(torch.int32), cu_seqlens_q=cu.to(torch.int32), is_decode=is_decode,
                         logits_indices=rows)
    return ids, batch


class TensorParallelModel:
    """Rank 0's model: its DecoderModel share, broadcasting each step to the workers before computing it. Has the
    DecoderModel interface the ModelRunner uses (``cfg``, ``dtype``, ``device``, ``forward``, ``logits``)."""

    def __init__(self, model, workers: list, world: int, restore_threads=None):
        self.model, self.workers, self.world = model, workers, world
        self.restore_threads = restore_threads  # gives this process its thread count back at close()
        self.cfg, self.dtype, self.device = model.cfg, model.dtype, model.device
        self.closed = False

    def start_kv(self, num_blocks: int, block_size: int) -> None:
        """Tell the workers the KV cache's geometry (they allocate the same blocks for their heads)."""
        _send_header(self.device, KV, num_blocks, block_size)

    def _check_workers(self) -> None:
        for rank, proc in enumerate(self.workers, start=1):
            if not proc.is_alive():
                raise TensorParallelError(f"tensor-parallel rank {rank} has exited (code {proc.exitcode}); "
                                          "the engine cannot go on without it: restart it")

    def forward(self, input_ids: torch.Tensor, batch: ForwardBatch, kv_caches) -> torch.Tensor:
        if self.closed:
            raise TensorParallelError("the tensor-parallel group has been shut down")
        self._check_workers()
        header, flat = _pack(input_ids, batch)
        _send_header(self.device, STEP, *header)
        broadcast(flat.to(_wire_device(self.device)), 0)
        return self.model.forward(input_ids, batch, kv_caches)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.logits(hidden)

    def close(self) -> None:
        """Stop the workers (they leave their loop and the group) and wait for them."""
        if self.closed:
            return
        self.closed = True
        try:
            if all(p.is_alive() for p in self.workers):
                _send_header(self.device, STOP)
        finally:
            for p in self.workers:
                p.join(timeout=30)
                if p.is_alive():
                    p.kill()
            if dist.is_initialized():
                dist.destroy_process_group()
            if self.restore_threads is not None:
                self.restore_threads()


def _rank_slice(platform, rank: int, world: int) -> tuple[dict, list[int]]:
    """(environment, cores) of worker ``rank``: the platform's data-parallel slice (a share of the cores, one device
    each where the platform has devices). A host with fewer cores than ranks shares them, one thread a worker:
    slower, still right; a missing device is an error."""
    try:
        return platform.data_parallel_slice(rank, world)
    except ValueError as exc:
        if platform.device_control_env_var:
            raise TensorParallelError(f"tensor_parallel_size {world}: {exc}") from exc
        return {"ENGINE_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}, []


def start(build: dict, world: int, platform, rank0_model_fn) -> TensorParallelModel:
    """Spawn ranks 1..world-1, build rank 0's share with ``rank0_model_fn(rank, world)``, form the group. Raises
    TensorParallelError (naming the rank and its reason) when a worker cannot load or exits while starting."""
    if dist.is_initialized():
        raise TensorParallelError("a torch.distributed process group already exists in this process; one "
                                  "tensor-parallel LLM per process")
    ctx = multiprocessing.get_context("spawn")
    port = _free_port()
    workers, conns = [], []
    for rank in range(1, world):
        env, cores = _rank_slice(platform, rank, world)
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=worker_main, args=(rank, world, port, build, env, cores, child), daemon=True,
                           name=f"engine-tp-rank{rank}")
        proc.start()
        workers.append(proc)
        conns.append(parent)
    threads_before = None
    try:
        env0, _ = _rank_slice(platform, 0, world)
        # rank 0 keeps to its share of the cores as the workers do: with the machine's default thread count its
        # threads contend with the workers' at every collective (TP=2 decoded 48 tok/s so on 2 cores, 85 without)
        threads_before = platform.use_host_threads(int(env0["ENGINE_NUM_THREADS"]))
        model = rank0_model_fn(0, world)
        platform.set_current_device(model.device)
        deadline = time.monotonic() + STARTUP_SECONDS
        for rank, (proc, conn) in enumerate(zip(workers, conns, strict=True), start=1):
            while not conn.poll(0.2):
                if not proc.is_alive():
                    raise TensorParallelError(f"tensor-parallel rank {rank} exited while loading "
                                              f"(code {proc.exitcode})")
                if time.monotonic() > deadline:
                    raise TensorParallelError(f"tensor-parallel rank {rank} did not load within {STARTUP_SECONDS} s")
            status, why = conn.recv()
            if status != "ready":
                raise TensorParallelError(why)
        dist.init_process_group(platform.dist_backend, init_method=f"tcp://127.0.0.1:{port}", rank=0,
                                world_size=world, timeout=TIMEOUT)
    except BaseException:
        for p in workers:
            p.kill()
        if threads_before is not None:
            platform.use_host_threads(threads_before)
        raise
    return TensorParallelModel(model, workers, world, lambda: platform.use_host_threads(threads_before))
