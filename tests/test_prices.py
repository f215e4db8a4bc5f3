"""A CPU's per-call price for the scorer's batch plans (race_core.scoring.prices): measured once per
machine class and model shape, then fixed: the shipped table first, then this machine's cache, the
first writer's figure kept."""

from __future__ import annotations

import json

import pytest

from race_core.scoring import plan, prices


@pytest.fixture
def fresh(tiny_policy, tmp_path, monkeypatch):
    """The tiny model with no figure anywhere: an empty cache folder, no shipped table."""
    monkeypatch.setenv("RACE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(prices, "TABLE", tmp_path / "prices.json")
    model, _ = tiny_policy
    plan._measured.pop(model, None)
    return model, tmp_path


def test_a_price_is_measured_once_then_read_from_this_machines_cache(fresh, monkeypatch):
    model, root = fresh
    price, source = prices.cpu_overhead(model)
    assert source == "measured" and price >= 1 and int(price) & (int(price) - 1) == 0
    (written,) = (root / "cache" / "forward-prices").glob("*.json")
    entry = json.loads(written.read_text())
    assert entry["forward_overhead"] == price and entry["shape"] == prices.model_shape(model)
    assert entry["machine"] == prices.machine_class() and entry["machine"]["torch_threads"] >= 1
    assert written.stem == prices.entry_key(entry["machine"], entry["shape"])
    plan._measured.pop(model, None)
    monkeypatch.setattr(plan, "measure_overhead", lambda m: pytest.fail("measured again"))
    assert prices.cpu_overhead(model) == (price, "cache")


def test_the_shipped_table_comes_first_and_the_first_cached_figure_stays(fresh, monkeypatch):
    model, root = fresh
    key = prices.entry_key(prices.machine_class(), prices.model_shape(model))
    cached = root / "cache" / "forward-prices" / f"{key}.json"
    cached.parent.mkdir(parents=True)
    cached.write_text(json.dumps({"forward_overhead": 8.0}))  # another process wrote it first
    monkeypatch.setattr(plan, "measure_overhead", lambda m: pytest.fail("a figure existed"))
    assert prices.cpu_overhead(model) == (8.0, "cache")
    prices.TABLE.write_text(json.dumps({key: {"forward_overhead": 128.0}, "other": {"forward_overhead": 2.0}}))
    assert prices.cpu_overhead(model) == (128.0, "table")


def test_the_machine_class_names_the_cpu_and_a_model_shape_not_its_weights(tiny_policy):
    import torch

    model, _ = tiny_policy
    machine = prices.machine_class()
    assert set(machine) == {"cpu", "vendor", "matrix_extensions", "torch_threads"}
    assert machine["torch_threads"] == torch.get_num_threads()
    shape = prices.model_shape(model)
    assert shape["layers"] == model.config.num_hidden_layers and shape["dtype"] == "float32"
    assert prices.entry_key(machine, shape) != prices.entry_key({**machine, "torch_threads": 99}, shape)


def test_the_shipped_table_is_well_formed():
    for key, entry in prices.table().items():
        assert key == prices.entry_key(entry["machine"], entry["shape"])
        price = entry["forward_overhead"]
        assert price >= 1 and int(price) & (int(price) - 1) == 0 and price in entry["measured"]
