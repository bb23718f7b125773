"""``engine tune-spec``: a tiny grid on the built-in model measures, picks, and prints a --speculative-config that
the engine accepts; the JSON it writes holds every measurement; bad grids are one-line errors."""

from __future__ import annotations

import json

import pytest

from engine.core import cli
from engine.core.engine.spec_decode import SpeculativeConfig
from engine.core.engine.spec_decode.tuning import WORKLOADS


@pytest.mark.usefixtures("default_model")
def test_tune_spec_prints_a_table_the_engine_accepts(tmp_path, capsys):
    out = tmp_path / "table.json"
    assert cli.main(["tune-spec", "--batch-sizes", "1,2", "--ks", "2", "--max-tokens", "6", "--repeats", "1",
                     "--out", str(out)]) == 0
    text = capsys.readouterr().out
    line = next(x for x in text.splitlines() if x.startswith("--speculative-config "))
    config = json.loads(line.split(" ", 1)[1].strip("'"))
    saved = json.loads(out.read_text())
    assert saved["speculative_config"] == config and config["method"] == "ngram"
    spec = SpeculativeConfig.from_dict(config)
    table = spec.num_speculative_tokens_per_batch_size
    assert set(table.values()) <= {0, 2} and min(table) == 1
    rates = saved["tok_per_s"]
    assert set(rates) == {"1", "2"} and all(set(by_k) == {"0", "2"} for by_k in rates.values())
    assert all(set(by_w) == set(WORKLOADS) and min(by_w.values()) > 0 for by_k in rates.values()
               for by_w in by_k.values())
    # The choice follows the measurements: k = 2 where it beats k = 0 on both workloads' geometric mean and is not
    # slower than the floor on either; the printed table gives each measured batch size that choice, as the engine
    # reads it (the entry of the largest batch size not above it).
    for b, by_k in rates.items():
        ratios = [by_k["2"][w] / by_k["0"][w] for w in WORKLOADS]
        want = 2 if min(ratios) >= 0.97 and ratios[0] * ratios[1] > 1 else 0
        assert spec.num_tokens_for(int(b)) == want, (b, ratios, table)


@pytest.mark.parametrize("argv, message", [
    (["--ks", "0,9"], "0..8"),
    (["--batch-sizes", "0"], ">= 1"),
    (["--batch-sizes", "a"], ">= 1"),
])
def test_bad_grids_are_one_line_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["tune-spec", *argv])
    assert exc.value.code == cli.USER_ERROR
    assert message in capsys.readouterr().err
