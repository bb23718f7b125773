"""Opening a GGUF file safely: header sanity checks before parsing, tensor extents checked against the file size."""

from __future__ import annotations

import os
import struct

from .errors import ModelLoadError

_MAGIC = b"GGUF"
# Smallest encodings: a metadata pair is a key (u64 length + >=1 byte) + u32 type + >=1 byte of value;
# a tensor info is a name (u64 length + >=1 byte) + u32 n_dims + >=1 u64 dim + u32 type + u64 offset.
_MIN_KV_BYTES = 8 + 1 + 4 + 1
_MIN_TENSOR_INFO_BYTES = 8 + 1 + 4 + 8 + 4 + 8


def _corrupt(path: str, why: str) -> ModelLoadError:
    return ModelLoadError(f"{path} is not a usable GGUF file: {why}. The file is truncated or corrupted "
                          "(an interrupted download?); download it again.")


def _check_header(path: str, size: int) -> None:
    """Reject what GGUFReader would choke on, before it maps or loops over anything."""
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


def open_gguf(path: str):
    """A ``gguf.GGUFReader`` over ``path`` whose every tensor lies inside the file; ModelLoadError otherwise."""
    import gguf

    size = os.path.getsize(path)
    _check_header(path, size)
    try:
        reader = gguf.GGUFReader(path, "r")
    except Exception as e:  # the reader signals bad bytes with assorted ValueError/IndexError/KeyError/...
        raise _corrupt(path, f"{type(e).__name__}: {e}") from e
    for t in reader.tensors:
        try:
            block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(t.tensor_type)]
        except (ValueError, KeyError) as e:
            raise _corrupt(path, f"tensor {t.name} has unknown type {int(t.tensor_type)}") from e
        n = int(t.n_elements)
        if n % block:
            raise _corrupt(path, f"tensor {t.name} has {n} elements, not a multiple of its block of {block}")
        nbytes = n // block * type_size
        end = int(t.data_offset) + nbytes
        if end > size or t.data.nbytes != nbytes:
            raise _corrupt(path, f"tensor {t.name} needs bytes up to offset {end} but the file has {size}")
    return reader


def field(reader, key: str, default=None):
    """The python value of metadata ``key`` (str, int, float, bool or list), or ``default`` when absent."""
    f = reader.fields.get(key)
    if f is None:
        return default
    try:
        return f.contents()
    except Exception as e:
        raise ModelLoadError(f"GGUF metadata {key!r} cannot be read ({e}); the file is corrupted") from e


def require(reader, key: str, path: str):
    """Like ``field`` but the key must be present."""
    value = field(reader, key)
    if value is None:
        raise ModelLoadError(f"{path} lacks the GGUF metadata key {key!r}, which this loader needs; "
                             "re-convert the model with a current llama.cpp convert_hf_to_gguf.py")
    return value
