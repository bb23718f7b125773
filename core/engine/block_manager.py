"""Paged KV-cache bookkeeping: which cache blocks each sequence owns, plus prefix caching.

A block holds the K/V of ``block_size`` consecutive positions of one sequence. A block that is full and
computed is registered in the prefix cache under a chained hash of its tokens (the hash of the parent
block's hash and this block's token ids), so a later sequence with the same leading tokens reuses it
(reference-counted) instead of recomputing it. The hash is SHA-256 over the whole chain, so a cache hit
means the entire prefix up to that block is identical (a collision would need a SHA-256 collision).

Blocks nobody references but that are still registered stay cached and count as free: allocation takes
never-registered free blocks first and otherwise evicts the least recently used cached block.

Past the last whole-block hit, a sequence may also take over one such unreferenced cached block whose leading
tokens match its own next ones (a partial hit, token-granular like llama.cpp's prompt cache and SGLang's radix
cache, where vLLM stops at whole blocks): the matching positions count as computed, the block leaves the cache
(this sequence overwrites its later positions), and nothing is copied. So a prompt repeated after its request
finished recomputes one token, not its whole last block. A block another sequence still references is never
taken (its tail would need a copy), and a sequence that ends before refilling the block it took leaves that prefix
uncached.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict, deque

from .sequence import Sequence

_PARTIAL_CANDIDATES = 32  # cached blocks (most recent first) examined for a partial hit: bounds allocate's cost


class BlockManager:
    """Owns ``num_blocks`` KV-cache blocks of ``block_size`` positions each.

    The scheduler calls ``allocate`` when it admits a waiting sequence, ``append_slots`` before each step
    that grows a running one, ``mark_computed`` after the step, and ``free`` when the sequence finishes or is
    preempted. The model runner reads ``seq.block_table`` and ``slot``/``slots`` to address the cache.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        for name, value in (("num_blocks", num_blocks), ("block_size", block_size)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"BlockManager: {name} must be an int >= 1, got {value!r}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._ref = [0] * num_blocks
        self._hash: list[bytes | None] = [None] * num_blocks
        self._cached: dict[bytes, int] = {}  # chained block hash -> block id
        # Unreferenced and unregistered, taken from the right: never-used blocks lowest first, and a block freed
        # is the next one taken (its memory is backed and likely cached; taking the oldest free one instead sent a
        # speculative step's reserve-and-trim through fresh pages of the whole cache, every step)
        self._free: deque[int] = deque(range(num_blocks - 1, -1, -1))
        self._evictable: OrderedDict[int, None] = OrderedDict()  # unreferenced but registered, oldest first
        # Registered blocks by their parent's chained hash (b"" for a first block), with their tokens: where a
        # partial hit is looked up.
        self._children: dict[bytes, dict[int, tuple[int, ...]]] = {}
        self._parent: dict[int, bytes] = {}

    # ---- accounting -------------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks available to allocation: unused ones plus cached blocks nobody references (evictable)."""
        return len(self._free) + len(self._evictable)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks registered in the prefix cache (referenced or not)."""
        return len(self._cached)

    @property
    def usage(self) -> float:
        """Fraction of blocks referenced by some sequence (0.0 .. 1.0)."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    def ref_count(self, block_id: int) -> int:
        return self._ref[block_id]

    def blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        """How many more blocks ``seq`` needs so that positions [0, num_tokens) have a slot."""
        return max(0, -(-num_tokens // self.block_size) - len(seq.block_table))

    def can_append(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Whether ``append_slots(seq, num_new_tokens)`` would succeed."""
        return self.blocks_needed(seq, seq.num_computed_tokens + num_new_tokens) <= self.num_free_blocks

    def slot(self, seq: Sequence, position: int) -> int:
        """The flat KV-cache slot of ``position`` in ``seq``: block_table[pos // bs] * bs + pos % bs."""
        return seq.block_table[position // self.block_size] * self.block_size + position % self.block_size

    def slots(self, seq: Sequence, start: int, end: int) -> list[int]:
        """Slots of positions [start, end) of ``seq``."""
        bs, table = self.block_size, seq.block_table
        return [table[p // bs] * bs + p % bs for p in range(start, end)]

    # ---- allocation -------------------------------------------------------------------------------------
    def allocate(self, seq: Sequence, max_new_tokens: int | None = None) -> bool:
        """Give a sequence that holds no blocks its prefix-cache hits plus blocks for the tokens to compute now.

        Hits are whole blocks, then possibly one partial block (see the module docstring), capped so that at
        least one token is left to compute (the runner needs the last token's logits). Sets
        ``num_computed_tokens`` and ``num_cached_tokens`` to the hit tokens. The tokens to compute now are the
        rest of the sequence, or at most ``max_new_tokens`` of it. Returns False, changing nothing, when the
        free blocks do not suffice.
        """
        if seq.block_table:
            raise ValueError(f"allocate: {seq} already holds blocks; free it first")
        hits = self._lookup(seq)
        computed = len(hits) * self.block_size
        partial, matched = self._partial_hit(seq, len(hits))
        computed += matched
        n = len(seq) - computed if max_new_tokens is None else min(max_new_tokens, len(seq) - computed)
        num_new = self.blocks_needed(seq, computed + n) - len(hits) - (partial is not None)
        # Evictable hits leave the free pool too (a partial hit is always one).
        num_revived = sum(1 for b in hits if self._ref[b] == 0) + (partial is not None)
        if num_new + num_revived > self.num_free_blocks:
            return False
        for b in hits:
            if self._ref[b] == 0:
                del self._evictable[b]
            self._ref[b] += 1
        taken = []
        if partial is not None:
            del self._evictable[partial]
            self._unregister(partial)
            self._ref[partial] = 1
            taken.append(partial)
        seq.block_table = hits + taken + [self._take_free() for _ in range(num_new)]
        seq.num_computed_tokens = seq.num_cached_tokens = computed
        seq.num_hashed_blocks = len(hits)
        seq.num_draft_computed_tokens = 0  # a draft model's cache may not hold the hit blocks: it recomputes them
        return True

    def append_slots(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Ensure slots for positions up to ``num_computed_tokens + num_new_tokens``; False (no change) if the
        free blocks do not suffice."""
        need = self.blocks_needed(seq, seq.num_computed_tokens + num_new_tokens)
        if need > self.num_free_blocks:
            return False
        seq.block_table.extend(self._take_free() for _ in range(need))
        return True

    def mark_computed(self, seq: Sequence) -> None:
        """Register the blocks that became full and computed since the last call in the prefix cache."""
        if not self.enable_prefix_caching:
            return
        num_full = min(seq.num_computed_tokens, len(seq)) // self.block_size
        if num_full <= seq.num_hashed_blocks:
            return
        self._hash_blocks(seq, num_full)
        bs, tokens = self.block_size, None
        for i in range(seq.num_hashed_blocks, num_full):
            h, b = seq.block_hashes[i], seq.block_table[i]
            # Another sequence may have computed the same content concurrently; its block stays the cached
            # one and this one is freed plainly later.
            if h not in self._cached and self._hash[b] is None:
                self._cached[h] = b
                self._hash[b] = h
                parent = seq.block_hashes[i - 1] if i else b""
                tokens = seq.token_ids if tokens is None else tokens
                self._children.setdefault(parent, {})[b] = tuple(tokens[i * bs:(i + 1) * bs])
                self._parent[b] = parent
        seq.num_hashed_blocks = num_full

    def free(self, seq: Sequence) -> None:
        """Release the sequence's blocks. Registered blocks stay cached (evictable) until their space is needed.

        Blocks are released last-first so that, among them, a sequence's tail is evicted before its prefix.
        """
        for b in reversed(seq.block_table):
            self._release(b)
        seq.block_table = []
        seq.num_hashed_blocks = 0
        seq.num_draft_computed_tokens = 0

    def trim(self, seq: Sequence, num_tokens: int) -> None:
        """Release the blocks past those holding positions [0, num_tokens): the slots reserved ahead for draft
        tokens a speculative step rejected. Such blocks hold no computed position, so none is registered."""
        keep = -(-num_tokens // self.block_size)
        if keep < seq.num_hashed_blocks:
            raise ValueError(f"trim: {seq} would drop blocks registered in the prefix cache (keep {keep})")
        while len(seq.block_table) > keep:
            self._release(seq.block_table.pop())

    # ---- internals --------------------------------------------------------------------------------------
    def _release(self, b: int) -> None:
        """Drop one reference to block b; unreferenced, it stays cached (evictable) if registered, else is free."""
        self._ref[b] -= 1
        if self._ref[b] == 0:
            if self._hash[b] is not None:
                self._evictable[b] = None
            else:
                self._free.append(b)

    def _take_free(self) -> int:
        if self._free:
            b = self._free.pop()
        else:
            b, _ = self._evictable.popitem(last=False)
            self._unregister(b)
        self._ref[b] = 1
        return b

    def _unregister(self, b: int) -> None:
        """Take block ``b`` out of the prefix cache (its K/V is about to be overwritten)."""
        del self._cached[self._hash[b]]
        self._hash[b] = None
        parent = self._parent.pop(b)
        siblings = self._children[parent]
        del siblings[b]
        if not siblings:
            del self._children[parent]

    def _partial_hit(self, seq: Sequence, num_hits: int) -> tuple[int | None, int]:
        """An unreferenced cached block that continues ``seq``'s ``num_hits`` whole-block hits and shares the
        most leading tokens with ``seq``'s next ones (at least one, and one token left to compute), and how many
        it shares; (None, 0) if there is none."""
        if not self.enable_prefix_caching:
            return None, 0
        start = num_hits * self.block_size
        want = seq.token_ids[start:len(seq) - 1][:self.block_size - 1]
        siblings = self._children.get(seq.block_hashes[num_hits - 1] if num_hits else b"")
        if not want or not siblings:
            return None, 0
        best, best_n = None, 0
        for i, b in enumerate(reversed(siblings)):  # most recently registered first
            if i == _PARTIAL_CANDIDATES:
                break
            if self._ref[b]:
                continue
            have = siblings[b]
            n = 0
            for x, y in zip(want, have, strict=False):
                if x != y:
                    break
                n += 1
            if n > best_n:
                best, best_n = b, n
                if n == len(want):
                    break
        return best, best_n

    def _lookup(self, seq: Sequence) -> list[int]:
        if not self.enable_prefix_caching:
            return []
        max_hits = (len(seq) - 1) // self.block_size
        self._hash_blocks(seq, max_hits)
        hits = []
        for h in seq.block_hashes[:max_hits]:
            b = self._cached.get(h)
            if b is None:
                break
            hits.append(b)
        return hits

    def _hash_blocks(self, seq: Sequence, num_blocks: int) -> None:
        """Extend ``seq.block_hashes`` to cover its first ``num_blocks`` full blocks."""
        done = len(seq.block_hashes)
        if done >= num_blocks:
            return
        bs, tokens = self.block_size, seq.token_ids
        parent = seq.block_hashes[-1] if done else b""
        for i in range(done, num_blocks):
            parent = hashlib.sha256(parent + array("q", tokens[i * bs:(i + 1) * bs]).tobytes()).digest()
            seq.block_hashes.append(parent)
