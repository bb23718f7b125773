"""core/loader/gguf_file.py against gguf-py's own GGUFReader (the reference), and its errors on bad bytes."""

from __future__ import annotations

import random
import struct

import gguf
import numpy as np
import pytest

from engine.core.loader import ModelLoadError, default_model_path
from engine.core.loader.gguf_file import field, open_gguf, require

V = gguf.GGUFValueType
Q = gguf.GGMLQuantizationType


def _same_as_gguf_reader(path) -> None:
    """Every metadata value and every tensor (name, type, shape, offset, bytes) equals GGUFReader's."""
    ours, ref = open_gguf(str(path)), gguf.GGUFReader(str(path))
    keys = [k for k in ref.fields if not k.startswith("GGUF.")]
    assert list(ours.fields) == keys
    for k in keys:
        want, got = ref.fields[k].contents(), field(ours, k)
        assert got == want and type(got) is type(want), k
        if isinstance(want, list) and want:
            assert type(got[0]) is type(want[0]), k
    assert ours.data_offset == ref.data_offset and len(ours.tensors) == len(ref.tensors)
    for a, b in zip(ref.tensors, ours.tensors, strict=True):
        assert (b.name, b.tensor_type, list(b.shape), b.n_elements, b.n_bytes, b.data_offset) == \
            (a.name, int(a.tensor_type), a.shape.tolist(), a.n_elements, a.n_bytes, a.data_offset)
        assert b.data.dtype == a.data.dtype and b.data.shape == a.data.shape
        assert np.array_equal(b.data.view(np.uint8), a.data.view(np.uint8)), a.name


def _random_file(path, rng: random.Random, alignment: int | None = None):
    """A GGUF with one key of every value type, arrays of each, and tensors of every type the reader sizes itself
    plus two it sizes through gguf (Q6_K, Q5_K); random values and shapes."""
    w = gguf.GGUFWriter(str(path), "llama")
    if alignment:
        w.add_custom_alignment(alignment)
    ints = {V.UINT8: (0, 255), V.INT8: (-128, 127), V.UINT16: (0, 65535), V.INT16: (-32768, 32767),
            V.UINT32: (0, 2**32 - 1), V.INT32: (-2**31, 2**31 - 1), V.UINT64: (0, 2**64 - 1),
            V.INT64: (-2**63, 2**63 - 1)}
    for vt, (lo, hi) in ints.items():
        w.add_key_value(f"t.{vt.name}", rng.randint(lo, hi), vt)
        w.add_key_value(f"t.{vt.name}.arr", [rng.randint(lo, hi) for _ in range(rng.randint(1, 50))], V.ARRAY,
                        sub_type=vt)
    w.add_key_value("t.f32", rng.uniform(-1e6, 1e6), V.FLOAT32)
    w.add_key_value("t.f64", rng.uniform(-1e300, 1e300), V.FLOAT64)
    w.add_key_value("t.f32.arr", [rng.uniform(-9, 9) for _ in range(33)], V.ARRAY, sub_type=V.FLOAT32)
    w.add_key_value("t.bool", rng.random() < 0.5, V.BOOL)
    w.add_key_value("t.bool.arr", [rng.random() < 0.5 for _ in range(17)], V.ARRAY, sub_type=V.BOOL)
    words = ["".join(chr(rng.choice([rng.randint(32, 126), rng.randint(0xA0, 0x2FFF), rng.randint(0x1F300, 0x1F64F)]))
                     for _ in range(rng.randint(0, 12))) for _ in range(500)]
    w.add_key_value("t.str", words[0] + "é", V.STRING)
    w.add_key_value("t.str.arr", words, V.ARRAY, sub_type=V.STRING)
    kinds = [Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q8_0, Q.Q6_K, Q.Q5_K, Q.I32]
    for i, q in enumerate(kinds):
        rows, cols = rng.randint(1, 5), 256 * rng.randint(1, 3)
        a = np.random.default_rng(rng.randrange(2**32)).standard_normal((rows, cols)).astype(np.float32)
        if q == Q.F32:
            w.add_tensor(f"x{i}", a)
        elif q == Q.F16:
            w.add_tensor(f"x{i}", a.astype(np.float16))
        elif q == Q.I32:
            w.add_tensor(f"x{i}", (a * 1000).astype(np.int32))
        elif q in (Q.Q6_K, Q.Q5_K):  # gguf-py cannot quantize these; any bytes make a valid tensor
            block, size = gguf.GGML_QUANT_SIZES[q]
            w.add_tensor(f"x{i}", np.frombuffer(rng.randbytes(rows * cols // block * size), np.uint8)
                         .reshape(rows, -1), raw_dtype=q)
        else:
            w.add_tensor(f"x{i}", gguf.quants.quantize(a, q), raw_dtype=q)
    w.add_tensor("v", np.random.default_rng(rng.randrange(2**32)).standard_normal(7).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("alignment", [None, 64, 8])
def test_every_value_and_tensor_type_matches_gguf_reader(tmp_path, alignment):
    path = _random_file(tmp_path / "r.gguf", random.Random(), alignment)
    _same_as_gguf_reader(path)
    assert open_gguf(str(path)).alignment == (alignment or 32)


@pytest.mark.usefixtures("default_model")
def test_default_model_matches_gguf_reader():
    path = default_model_path()
    f = open_gguf(path)
    assert len(require(f, "tokenizer.ggml.tokens", path)) == 49152
    _same_as_gguf_reader(path)


def test_nested_arrays_keep_their_structure(tmp_path):
    w = gguf.GGUFWriter(str(tmp_path / "n.gguf"), "llama")
    nested = [[random.randint(0, 9) for _ in range(random.randint(1, 4))] for _ in range(5)]
    w.add_key_value("nested", nested, V.ARRAY, sub_type=V.ARRAY)
    w.add_key_value("strs", [["a", "bc"], ["d"]], V.ARRAY, sub_type=V.ARRAY)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    f = open_gguf(str(tmp_path / "n.gguf"))
    assert field(f, "nested") == nested and field(f, "strs") == [["a", "bc"], ["d"]]


def _header(kvs: bytes, n_kv: int, tensors: bytes = b"", n_tensors: int = 0) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv) + kvs + tensors


def _s(text: bytes) -> bytes:
    return struct.pack("<Q", len(text)) + text


def _kv_u32(key: bytes, value: int) -> bytes:
    return _s(key) + struct.pack("<II", 4, value)


def _fails(tmp_path, data: bytes, *needles) -> str:
    path = tmp_path / "bad.gguf"
    path.write_bytes(data + bytes(512))
    with pytest.raises(ModelLoadError) as err:
        f = open_gguf(str(path))
        for k in f.fields:
            field(f, k)
    for n in needles:
        assert n in str(err.value), str(err.value)
    return str(err.value)


def test_structural_errors_are_named(tmp_path):
    _fails(tmp_path, _header(_kv_u32(b"a", 1) * 2, 2), "'a' appears twice")
    _fails(tmp_path, _header(_s(b"k") + struct.pack("<I", 99) + bytes(8), 1), "unknown value type 99")
    _fails(tmp_path, _header(_s(b"k") + struct.pack("<IIQ", 9, 77, 1), 1), "array of unknown value type 77")
    _fails(tmp_path, _header(_kv_u32(b"general.alignment", 48), 1), "power of two")
    _fails(tmp_path, _header(_s(b"k") + struct.pack("<IIQ", 9, 4, 1 << 40), 1), "runs past the end")
    _fails(tmp_path, _header(_s(b"k") + struct.pack("<IIQ", 9, 8, 1 << 40), 1), "runs past the end")
    _fails(tmp_path, _header(_s(b"k") + struct.pack("<I", 8) + struct.pack("<Q", 1 << 50), 1), "runs past")
    _fails(tmp_path, _header(_s(b"\xff\xfe") + struct.pack("<II", 4, 0), 1), "not UTF-8")
    _fails(tmp_path, _header(_s(b"k") + struct.pack("<I", 8) + _s(b"\xff\xfe"), 1), "'k' cannot be read")
    info = _s(b"t") + struct.pack("<IQIQ", 1, 32, 0, 0)
    _fails(tmp_path, _header(b"", 0, info * 2, 2), "tensor t appears twice")
    _fails(tmp_path, _header(b"", 0, _s(b"t") + struct.pack("<IQIQ", 1, 32, 250, 0), 1), "unknown type 250")
    _fails(tmp_path, _header(b"", 0, _s(b"t") + struct.pack("<IQIQ", 1, 48, 2, 0), 1), "block of 32")
    _fails(tmp_path, _header(b"", 0, _s(b"t") + struct.pack("<I", 9), 1), "9 dimensions")
    be = b"GGUF" + struct.pack(">IQQ", 3, 0, 0)
    _fails(tmp_path, be, "big-endian")


def test_every_truncation_of_the_header_is_an_error(tmp_path):
    """Cut a small valid file at random points inside its metadata and tensor infos: always ModelLoadError."""
    src = _random_file(tmp_path / "r.gguf", random.Random())
    data = src.read_bytes()
    header_end = open_gguf(str(src)).data_offset
    path = tmp_path / "cut.gguf"
    for cut in random.sample(range(24, header_end), 40):
        path.write_bytes(data[:cut])
        with pytest.raises(ModelLoadError, match="download it again"):
            open_gguf(str(path))
