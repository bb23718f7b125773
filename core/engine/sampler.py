"""Token sampling from a batch of logits, each row with its own SamplingParams.

First each row's penalties (presence, frequency, repetition) and logits processors adjust its logits (rows
without them are not touched or copied). Greedy rows (temperature 0) take the argmax. The others divide by their
temperature, apply top-k, then
top-p (on the top-k survivors, renormalised), then min-p, and draw with the exponential race: the token is
argmax(p_i / e_i) with e_i ~ Exp(1), which picks token i with probability p_i. A seeded request draws its
e_i from its own generator (made from ``params.seed`` on first use and kept on the sequence), so its tokens
do not depend on what it is batched with; unseeded rows share the sampler's generator.

Log-probabilities (``sample_with_logprobs``, rows whose params ask for them) are those of the raw logits, before
penalties, processors and temperature (vLLM's default); only each row's top-k ids and values leave the device,
so their memory does not grow with the vocabulary.
"""

from __future__ import annotations

import numpy as np
import torch

from .sequence import Sequence

TokenLogprobs = tuple[float, int, list[tuple[int, float]]]  # (sampled token's logprob, its rank, top-k pairs)


class Sampler:
    """``sample(logits [N, V], seqs) -> token ids [N] (int64)``, on the logits' device."""

    def __init__(self, generator: torch.Generator | None = None):
        self.generator = generator  # for unseeded rows; None uses torch's default generator
        self._host_view: tuple[torch.Tensor, np.ndarray] | None = None  # the last host fp32 logits and their array

    def sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        if logits.dim() != 2 or logits.shape[0] != len(seqs):
            raise ValueError(f"Sampler.sample: logits must be [len(seqs), vocab], got {tuple(logits.shape)} "
                             f"for {len(seqs)} sequences")
        device = logits.device
        logits = _process(logits, seqs)
        params = [s.params for s in seqs]
        greedy = [i for i, p in enumerate(params) if p.greedy]
        rand = [i for i, p in enumerate(params) if not p.greedy]
        if not rand:
            return argmax_rows(logits)
        out = torch.empty(len(seqs), dtype=torch.int64, device=device)
        if greedy:
            g = _on_device(greedy, device)
            out[g] = argmax_rows(logits[g])
        r = _on_device(rand, device) if greedy else None
        x = (logits if r is None else logits[r]).float()
        probs = sampling_probs(x, [params[i] for i in rand])
        out_r = (probs / self._exponentials(probs, [seqs[i] for i in rand])).argmax(dim=-1)
        if r is None:
            return out_r
        out[r] = out_r
        return out

    def sample_with_logprobs(self, logits: torch.Tensor, seqs: list[Sequence]
                             ) -> tuple[list[int], list[TokenLogprobs | None]]:
        """The sampled token ids as a host list and, per row, its TokenLogprobs (None for rows not asking)."""
        rows = self._host_rows(logits)
        if rows is not None and rows.shape[0] == len(seqs) and all(map(plain_greedy, seqs)):
            # The common CPU decode step, by the shortest path: it runs right after the model's weights streamed
            # through the caches, so every Python and torch call here is a cold one (one 49k-token row after a
            # 100 MB read: 140 us by the general path, 50 us by this one; 2-core Zen 5, 2026-12-01).
            return rows.argmax(axis=-1).tolist(), [None] * len(seqs)
        return self.sample_on_device(logits, seqs).to_host().result()

    def _host_rows(self, logits: torch.Tensor) -> np.ndarray | None:
        """Host fp32 ``logits`` as a numpy array sharing their memory (what ``argmax_rows`` reads), else None. Made
        once per tensor: the decode graphs return the same logits view every step, and the torch calls around
        the argmax cost ~50 us a step there, all cold (sampler 97 -> 44 us a single-stream decode step, 2-core
        Zen 5, 2026-12-02)."""
        last = self._host_view
        if last is not None and last[0] is logits:
            return last[1]
        if not _host_fp32(logits):
            return None
        self._host_view = (logits, logits.numpy())
        return self._host_view[1]

    def sample_on_device(self, logits: torch.Tensor, seqs: list[Sequence]) -> DeviceSample:
        """``sample`` plus the logprob tensors rows ask for, all left on the logits' device (no host read)."""
        tokens = self.sample(logits, seqs)
        want = [i for i, s in enumerate(seqs) if s.params.logprobs is not None]
        if not want:
            return DeviceSample(tokens, len(seqs))
        rows = _on_device(want, logits.device)
        lp = logits[rows].float().log_softmax(dim=-1)
        chosen = lp.gather(1, tokens[rows].unsqueeze(1))
        rank = (lp > chosen).sum(dim=-1) + 1
        k = max(seqs[i].params.logprobs for i in want)
        top_v, top_i = lp.topk(k, dim=-1) if k else (lp[:, :0], rows.new_empty((len(want), 0)))
        ks = [seqs[i].params.logprobs for i in want]
        return DeviceSample(tokens, len(seqs), want, ks, (chosen.squeeze(1), rank, top_v, top_i))

    def _exponentials(self, probs: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        q = torch.empty_like(probs)
        unseeded = [i for i, s in enumerate(seqs) if s.params.seed is None]
        if len(unseeded) == len(seqs):
            q.exponential_(generator=self.generator)
        else:
            if unseeded:
                idx = _on_device(unseeded, probs.device)
                q[idx] = torch.empty(len(unseeded), probs.shape[1], device=probs.device).exponential_(
                    generator=self.generator)
            for i, s in enumerate(seqs):
                if s.params.seed is not None:
                    q[i].exponential_(generator=_seq_generator(s, probs.device))
        # Exp(1) can return exactly 0; p/0 would be inf (or nan for p == 0, which argmax would pick).
        return q.clamp_min_(torch.finfo(q.dtype).tiny)


class DeviceSample:
    """A step's sampled tokens (``tokens``, int64 on the device) and requested logprobs, not yet on the host.

    ``to_host()`` starts a non-blocking copy of everything to host memory and records an event on the device's
    stream; ``result()`` waits for that event only (not for work queued after it) and returns the host lists
    ``sample_with_logprobs`` returns. An engine that launches the next step in between overlaps the two."""

    def __init__(self, tokens: torch.Tensor, num_rows: int, want: list[int] | None = None,
                 ks: list[int] | None = None, logprob_parts: tuple | None = None):
        self.tokens, self.num_rows = tokens, num_rows
        self.want, self.ks, self.parts = want or [], ks or [], logprob_parts
        self._host: list[torch.Tensor] | None = None
        self._event = None

    def to_host(self) -> DeviceSample:
        tensors = [self.tokens, *(self.parts or ())]
        if _runs_asynchronously(self.tokens.device):
            self._host = [t.to("cpu", non_blocking=True) for t in tensors]
            self._event = torch.Event(device=self.tokens.device)
            self._event.record()
        else:  # host tensors: already computed, nothing to wait for
            self._host = tensors
        return self

    def result(self) -> tuple[list[int], list[TokenLogprobs | None]]:
        if self._host is None:
            self.to_host()
        if self._event is not None:
            self._event.synchronize()
        host = self._host[0].tolist()
        out: list[TokenLogprobs | None] = [None] * self.num_rows
        if not self.want:
            return host, out
        chosen, rank, top_v, top_i = (t.tolist() for t in self._host[1:])
        for j, (i, kk) in enumerate(zip(self.want, self.ks, strict=True)):
            out[i] = (chosen[j], rank[j], list(zip(top_i[j][:kk], top_v[j][:kk], strict=True)))
        return host, out


def plain_greedy(seq: Sequence) -> bool:
    """Greedy, with nothing to apply to its logits and no logprobs to return: its token is the argmax."""
    p = seq.params
    return p.greedy and not p.has_penalties and not p.logits_processors and p.logprobs is None


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """The argmax of each row of [N, V] logits, int64. Host fp32 rows go through numpy: the same answer (the first
    maximum; a NaN counts as the maximum) in ~8 us a 49k-token row instead of torch's ~100 us (measured on a 2-core
    Xeon, issue 11), a step's largest host cost after the model's."""
    if _host_fp32(x):
        return torch.from_numpy(x.numpy().argmax(axis=-1))
    return x.argmax(dim=-1)


def take_rows(x: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """``x[rows]`` for [N, V] logits. Host fp32 rows are copied by numpy: torch's indexed copy of rows this long
    runs on its OpenMP pool, whose threads then spin for milliseconds against the native kernels' own threads (on
    2 cores the next step's linear layers ran 1.5-1.9x slower)."""
    if _host_fp32(x):
        return torch.from_numpy(x.numpy()[rows])
    return x.index_select(0, torch.tensor(rows, device=x.device))


def _host_fp32(x: torch.Tensor) -> bool:
    """[N, V] fp32 logits in host memory: numpy reads them in place."""
    return x.is_cpu and x.dtype == torch.float32 and x.dim() == 2


def _on_device(values: list, device: torch.device) -> torch.Tensor:
    """A small host list as a tensor on ``device`` (dtype inferred). On an accelerator it goes through pinned
    memory without blocking: a plain copy would wait for the device to finish all queued work (the step just
    launched, under async scheduling)."""
    t = torch.tensor(values)
    if not _runs_asynchronously(device):
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def _runs_asynchronously(device: torch.device) -> bool:
    """True for the current accelerator's device: its kernels run after the host has queued them."""
    if not torch.accelerator.is_available():
        return False
    acc = torch.accelerator.current_accelerator()
    return acc is not None and device.type == acc.type


def sampling_probs(x: torch.Tensor, params: list) -> torch.Tensor:
    """The distribution each row of fp32 logits ``x`` is sampled from under its SamplingParams (non-greedy):
    temperature, then top-k, then top-p, then min-p (filtered tokens get probability 0; rows not renormalised
    after min-p). Speculative decoding's rejection sampler uses it as the target distribution."""
    device = x.device
    # The floor keeps logits / T finite for absurdly small temperatures (it is greedy in effect there).
    temperature = _on_device([p.temperature for p in params], device).clamp_min_(1e-5)
    x = x / temperature.unsqueeze(1)
    if any(p.top_k > 0 or p.top_p < 1 for p in params):
        x = _top_k_top_p(x, [p.top_k for p in params], [p.top_p for p in params])
    probs = x.softmax(dim=-1)
    if any(p.min_p > 0 for p in params):
        min_p = _on_device([p.min_p for p in params], device).unsqueeze(1)
        probs = probs.masked_fill(probs < min_p * probs.amax(dim=-1, keepdim=True), 0.0)
    return probs


def _seq_generator(seq: Sequence, device: torch.device) -> torch.Generator:
    if seq.generator is None:
        seq.generator = torch.Generator(device=device).manual_seed(seq.params.seed)
    return seq.generator


def _process(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    """Apply penalties and logits processors to the rows that have them (a copy; the input is not changed)."""
    rows = [i for i, s in enumerate(seqs) if s.params.has_penalties or s.params.logits_processors]
    if not rows:
        return logits
    x = logits.float().clone()
    vocab, device = x.shape[1], x.device
    for i in rows:
        p, seq = seqs[i].params, seqs[i]
        if p.has_penalties:
            row = x[i]
            if p.repetition_penalty != 1:
                seen = torch.tensor(sorted(set(seq.token_ids)), dtype=torch.int64, device=device)
                vals = row[seen]
                row[seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
            if seq.output_token_ids and (p.presence_penalty or p.frequency_penalty):
                out = torch.tensor(seq.output_token_ids, dtype=torch.int64, device=device)
                counts = torch.bincount(out, minlength=vocab).to(row.dtype)
                row -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(row.dtype)
        for proc in p.logits_processors:
            x[i] = proc(seq.output_token_ids, x[i])
    return x


def _top_k_top_p(x: torch.Tensor, top_k: list[int], top_p: list[float]) -> torch.Tensor:
    """Set logits outside each row's top-k, then outside its top-p nucleus, to -inf (top_k 0 / top_p 1 = off)."""
    vocab = x.shape[1]
    device = x.device
    sorted_x, order = x.sort(dim=-1, descending=True)
    k = _on_device([k if 0 < k < vocab else vocab for k in top_k], device).unsqueeze(1)
    sorted_x = sorted_x.masked_fill(torch.arange(vocab, device=device).unsqueeze(0) >= k, float("-inf"))
    if any(p < 1 for p in top_p):
        # 2.0 for rows with the filter off: rounding can push the cumulative sum past 1.0.
        p = _on_device([p if p < 1 else 2.0 for p in top_p], device).unsqueeze(1)
        probs = sorted_x.softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs
        drop = mass_before >= p
        drop[:, 0] = False  # the most likely token always survives
        sorted_x = sorted_x.masked_fill(drop, float("-inf"))
    return torch.full_like(x, float("-inf")).scatter(1, order, sorted_x)
