"""Reading a GGUF file: metadata as python values, tensors as numpy views of a copy-on-write memory map.

gguf-py's ``GGUFReader`` builds a numpy memmap slice for every piece of metadata, two per string, which for a
vocabulary of 49k tokens and 49k merges takes seconds. This reader parses the header with ``struct`` and plain
byte slices (tens of milliseconds), checks every count and extent against the file size before it allocates or
loops, and imports the ``gguf`` package only for tensor types whose sizes it does not know itself.
"""

from __future__ import annotations

import mmap
import os
import struct
from typing import NamedTuple

import numpy as np

from .errors import ModelLoadError

_MAGIC = b"GGUF"
_DEFAULT_ALIGNMENT = 32
# Smallest encodings: a metadata pair is a key (u64 length + >=1 byte) + u32 type + >=1 byte of value;
# a tensor info is a name (u64 length + >=1 byte) + u32 n_dims + >=1 u64 dim + u32 type + u64 offset.
_MIN_KV_BYTES = 8 + 1 + 4 + 1
_MIN_TENSOR_INFO_BYTES = 8 + 1 + 4 + 8 + 4 + 8
_MAX_DIMS = 4  # GGML_MAX_DIMS

# GGUF metadata value types -> struct code (numbers), plus STRING and ARRAY.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY, _UINT32 = 8, 9, 4
# GGML tensor types this module sizes itself: type -> (elements per block, bytes per block, numpy item type of
# ``GGUFTensor.data``; None = raw bytes). Other types are sized from gguf.GGML_QUANT_SIZES.
_TYPES = {0: (1, 4, np.float32), 1: (1, 2, np.float16), 30: (1, 2, None), 2: (32, 18, None), 3: (32, 20, None),
          8: (32, 34, None), 24: (1, 1, np.int8), 25: (1, 2, np.int16), 26: (1, 4, np.int32), 27: (1, 8, np.int64),
          28: (1, 8, np.float64)}


class GGUFTensor(NamedTuple):
    """One tensor of a GGUF file. ``shape`` is in GGUF order (innermost dimension first, as ggml's ne[]);
    ``data`` a read-only numpy view of its bytes: typed for float and integer types (outermost dimension first),
    uint8 rows of blocks for quantized ones (the last axis in bytes, as gguf-py's reader gives)."""

    name: str
    tensor_type: int
    shape: tuple[int, ...]
    n_elements: int
    n_bytes: int
    data_offset: int
    data: np.ndarray


class GGUFFile:
    """A parsed GGUF file: ``fields`` maps metadata keys to python values (str, int, float, bool, list);
    ``tensors`` lists GGUFTensor in file order. The file stays memory-mapped while any tensor view lives (weights
    loaded from it included), so, as with llama.cpp, overwrite it in place only when no model from it is loaded;
    replacing it (a new file renamed over it, as downloaders do) is always safe."""

    def __init__(self, path: str, fields: dict, tensors: list[GGUFTensor], alignment: int, data_offset: int):
        self.path, self.fields, self.tensors = path, fields, tensors
        self.alignment, self.data_offset = alignment, data_offset


class _Unreadable:
    """A metadata value whose bytes do not decode; reading it (not merely having it) is an error."""

    def __init__(self, why: str):
        self.why = why


def _corrupt(path: str, why: str) -> ModelLoadError:
    return ModelLoadError(f"{path} is not a usable GGUF file: {why}. The file is truncated or corrupted "
                          "(an interrupted download?); download it again.")


class _Parser:
    """Sequential reads over the mapped header; every read is bounds-checked against the file size."""

    def __init__(self, buf, path: str, pos: int):
        self.buf, self.path, self.end, self.pos = buf, path, len(buf), pos
        self._u64 = struct.Struct("<Q").unpack_from

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.end:
            raise _corrupt(self.path, f"{what} at offset {self.pos} runs past the end of the file ({self.end} bytes)")

    def scalar(self, code: str, what: str):
        size = struct.calcsize(code)
        self.need(size, what)
        value = struct.unpack_from("<" + code, self.buf, self.pos)[0]
        self.pos += size
        return value

    def raw_string(self, what: str) -> bytes:
        self.need(8, what)
        n = self._u64(self.buf, self.pos)[0]
        self.pos += 8
        self.need(n, what)
        s = self.buf[self.pos:self.pos + n]
        self.pos += n
        return s

    def name(self, what: str) -> str:
        raw = self.raw_string(what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise _corrupt(self.path, f"{what} at offset {self.pos - len(raw)} is not UTF-8 ({e})") from e

    def strings(self, count: int, what: str) -> list[bytes]:
        """``count`` length-prefixed strings, read in one tight loop (vocabularies hold ~10^5 of them)."""
        self.need(count * 8, what)
        buf, pos, end, u64 = self.buf, self.pos, self.end, self._u64
        out = []
        append = out.append
        for _ in range(count):
            if pos + 8 > end:
                break
            n = u64(buf, pos)[0]
            pos += 8
            if pos + n > end:
                break
            append(buf[pos:pos + n])
            pos += n
        self.pos = pos
        if len(out) < count:
            raise _corrupt(self.path, f"{what} (string {len(out)} of {count}) runs past the end of the file")
        return out

    def value(self, vtype: int, what: str, depth: int = 0):
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype], what)
        if vtype == _STRING:
            return _decode(self.raw_string(what))
        if vtype != _ARRAY:
            raise _corrupt(self.path, f"{what} has unknown value type {vtype}")
        if depth > 8:
            raise _corrupt(self.path, f"{what} nests arrays more than 8 deep")
        itype = self.scalar("I", what)
        count = self.scalar("Q", what)
        if itype in _SCALARS:
            size = struct.calcsize(_SCALARS[itype])
            self.need(count * size, what)
            arr = np.frombuffer(self.buf, dtype=np.dtype("<" + _SCALARS[itype]), count=count, offset=self.pos)
            self.pos += count * size
            return arr.tolist()
        if itype == _STRING:
            raw = self.strings(count, what)
            try:
                return [s.decode("utf-8") for s in raw]
            except UnicodeDecodeError as e:
                return _Unreadable(f"a string is not UTF-8 ({e})")
        if itype == _ARRAY:
            self.need(count * 12, what)  # each element is at least a type and a count
            items = [self.value(_ARRAY, what, depth + 1) for _ in range(count)]
            bad = next((v for v in items if isinstance(v, _Unreadable)), None)
            return items if bad is None else bad
        raise _corrupt(self.path, f"{what} is an array of unknown value type {itype}")


def _decode(raw: bytes):
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return _Unreadable(f"a string is not UTF-8 ({e})")


def _type_sizes(qtype: int) -> tuple[int, int, type | None]:
    if qtype in _TYPES:
        return _TYPES[qtype]
    import gguf  # only for the rarer tensor types

    try:
        block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(qtype)]
    except (ValueError, KeyError) as e:
        raise KeyError(qtype) from e
    return block, size, None


def open_gguf(path: str) -> GGUFFile:
    """The parsed GGUF file at ``path``; ModelLoadError when it is not one, is truncated, or a tensor lies
    (partly) outside it."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(24)
        if len(head) < 24:
            raise _corrupt(path, f"only {size} bytes, shorter than a GGUF header")
        if head[:4] != _MAGIC:
            raise _corrupt(path, f"it starts with {head[:4]!r}, not the GGUF magic {_MAGIC!r}")
        version_le = struct.unpack("<I", head[4:8])[0]
        endian = "<" if version_le & 0xFFFF else ">"  # big-endian files read as a huge little-endian version
        version, n_tensors, n_kv = struct.unpack(endian + "IQQ", head[4:24])
        if version not in (2, 3):
            raise _corrupt(path, f"GGUF version {version} is not one this loader reads (2 or 3)")
        if n_tensors * _MIN_TENSOR_INFO_BYTES + n_kv * _MIN_KV_BYTES > size - 24:
            raise _corrupt(path, f"the header declares {n_tensors} tensors and {n_kv} metadata entries, "
                                 f"more than {size} bytes can hold")
        if endian == ">":
            raise ModelLoadError(f"{path} is a big-endian GGUF file; this loader reads little-endian ones (the "
                                 "kind llama.cpp's converter writes by default). Re-convert it without --bigendian.")
        # Copy-on-write: tensor views are writable numpy arrays (torch.from_numpy wants them) whose writes, should a
        # caller make any, stay in this process; unwritten pages are the page cache's, shared and never copied.
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    p = _Parser(buf, path, 24)
    fields: dict = {}
    for i in range(n_kv):
        key = p.name(f"metadata key {i}")
        if key in fields:
            raise _corrupt(path, f"metadata key {key!r} appears twice")
        fields[key] = p.value(p.scalar("I", f"the type of {key!r}"), f"metadata {key!r}")
    infos = []
    for i in range(n_tensors):
        name = p.name(f"tensor name {i}")
        n_dims = p.scalar("I", f"tensor {name}")
        if not 1 <= n_dims <= _MAX_DIMS:
            raise _corrupt(path, f"tensor {name} has {n_dims} dimensions")
        p.need(8 * n_dims + 12, f"tensor {name}")
        dims = struct.unpack_from(f"<{n_dims}Q", buf, p.pos)
        qtype, offset = struct.unpack_from("<IQ", buf, p.pos + 8 * n_dims)
        p.pos += 8 * n_dims + 12
        infos.append((name, dims, qtype, offset))
    alignment = fields.get("general.alignment", _DEFAULT_ALIGNMENT)
    if type(alignment) is not int or alignment <= 0 or alignment & (alignment - 1):
        raise _corrupt(path, f"general.alignment {alignment!r} is not a power of two")
    start = -(-p.pos // alignment) * alignment
    tensors, seen = [], set()
    for name, dims, qtype, offset in infos:
        if name in seen:
            raise _corrupt(path, f"tensor {name} appears twice")
        seen.add(name)
        try:
            block, type_size, item = _type_sizes(qtype)
        except KeyError:
            raise _corrupt(path, f"tensor {name} has unknown type {qtype}") from None
        n = 1
        for d in dims:
            n *= d
        if dims[0] % block:
            raise _corrupt(path, f"tensor {name} has rows of {dims[0]} elements, not a multiple of its block "
                                 f"of {block}")
        nbytes = n // block * type_size
        begin = start + offset
        if begin + nbytes > size:
            raise _corrupt(path, f"tensor {name} needs bytes up to offset {begin + nbytes} but the file has {size}")
        outer = tuple(reversed(dims))
        if item is None:
            data = np.frombuffer(buf, np.uint8, nbytes, begin).reshape(*outer[:-1], dims[0] // block * type_size)
        else:
            data = np.frombuffer(buf, item, n, begin).reshape(outer)
        tensors.append(GGUFTensor(name, qtype, dims, n, nbytes, begin, data))
    return GGUFFile(path, fields, tensors, alignment, start)


def field(reader: GGUFFile, key: str, default=None):
    """The python value of metadata ``key`` (str, int, float, bool or list), or ``default`` when absent."""
    value = reader.fields.get(key)
    if value is None:
        return default
    if isinstance(value, _Unreadable):
        raise ModelLoadError(f"GGUF metadata {key!r} cannot be read ({value.why}); the file is corrupted")
    return value


def require(reader: GGUFFile, key: str, path: str):
    """Like ``field`` but the key must be present."""
    value = field(reader, key)
    if value is None:
        raise ModelLoadError(f"{path} lacks the GGUF metadata key {key!r}, which this loader needs; "
                             "re-convert the model with a current llama.cpp convert_hf_to_gguf.py")
    return value
