"""A CPU's per-call price for the scorer's batch plans (race_core.scoring.prices): read from a table
of prices measured per machine class and model shape (a user's, then the shipped one), a fixed
default for a class nobody measured; never measured by the pipeline itself."""

from __future__ import annotations

import json

import pytest

from race_core.scoring import plan, prices
from race_core.scoring.hf import HFScorer


@pytest.fixture
def unmeasured(tiny_policy, tmp_path, monkeypatch):
    """The tiny model on a machine with an empty shipped table and no table of its own."""
    monkeypatch.delenv(prices.USER_TABLE, raising=False)
    monkeypatch.setattr(prices, "TABLE", tmp_path / "shipped.json")
    monkeypatch.setattr(plan, "measure_overhead", lambda model: pytest.fail("the pipeline measured a price"))
    prices._read.cache_clear()
    yield tiny_policy, tmp_path
    prices._read.cache_clear()


def test_a_class_nobody_measured_plans_at_the_default_without_measuring(unmeasured):
    (model, tokenizer), _ = unmeasured
    price, source = prices.cpu_overhead(model)
    key = prices.entry_key(prices.machine_class(), prices.model_shape(model))
    assert price == plan.CPU_OVERHEAD and source == f"default (class not measured: race bench price; entry {key})"
    scorer = HFScorer(model, tokenizer)
    assert scorer.cost.overhead == plan.CPU_OVERHEAD and scorer.stats.extra["overhead_source"] == source


def test_the_users_table_comes_before_the_shipped_one(unmeasured, monkeypatch):
    (model, tokenizer), root = unmeasured
    key = prices.entry_key(prices.machine_class(), prices.model_shape(model))
    prices.TABLE.write_text(json.dumps({key: {"forward_overhead": 128.0}, "other": {"forward_overhead": 2.0}}))
    assert prices.cpu_overhead(model) == (128.0, f"prices.json {key}")
    own = root / "mine.json"
    own.write_text(json.dumps({key: {"forward_overhead": 8.0}}))
    monkeypatch.setenv(prices.USER_TABLE, str(own))
    assert prices.cpu_overhead(model) == (8.0, f"${prices.USER_TABLE} {key}")
    assert HFScorer(model, tokenizer).cost.overhead == 8.0
    own.write_text("not json")
    prices._read.cache_clear()
    with pytest.raises(ValueError, match="mine.json: not a table of forward prices"):
        prices.cpu_overhead(model)


def test_the_class_is_the_cpu_and_the_shape_is_the_models_not_its_weights(tiny_policy):
    model, _ = tiny_policy
    machine = prices.machine_class()
    assert set(machine) == {"cpu", "vendor", "matrix_extensions"}  # not the threads: workers of one host plan alike
    shape = prices.model_shape(model)
    assert shape["layers"] == model.config.num_hidden_layers and shape["dtype"] == "float32"
    assert prices.entry_key(machine, shape) != prices.entry_key(machine, {**shape, "dtype": "bfloat16"})


def test_race_bench_price_measures_an_entry_the_pipeline_then_reads(tiny_checkpoint, tmp_path, monkeypatch, capsys):
    from flows.cli import main
    from race_core.policy import load_policy

    own = tmp_path / "mine.json"
    assert main(["bench", "price", "--models", "tiny", "--repeats", "3", "--cache-dir", str(tiny_checkpoint.parent),
                 "--out", str(own)]) == 0
    (key, entry), = json.loads(own.read_text()).items()
    assert len(entry["measured"]) == 3 and entry["forward_overhead"] == sorted(entry["measured"])[1]
    assert all(f >= 1 and int(f) & (int(f) - 1) == 0 for f in entry["measured"])  # powers of two
    assert key == prices.entry_key(entry["machine"], entry["shape"]) and entry["torch_threads"] >= 1
    monkeypatch.setenv(prices.USER_TABLE, str(own))
    prices._read.cache_clear()
    model, _ = load_policy(tiny_checkpoint)
    assert prices.cpu_overhead(model) == (entry["forward_overhead"], f"${prices.USER_TABLE} {key}")
    prices._read.cache_clear()


def test_the_shipped_table_is_well_formed():
    for key, entry in prices.tables()[-1][1].items():
        assert key == prices.entry_key(entry["machine"], entry["shape"])
        price = entry["forward_overhead"]
        assert price >= 1 and int(price) & (int(price) - 1) == 0 and price in entry["measured"]
