"""`race export`: the openai and sharegpt exports read back through `race import` as the same
trajectories (removed reasoning, tool calls, parallel calls, system and tools included); sharegpt
alternates as LLaMA-Factory requires and describes itself in dataset_info.json; the tokens export is
the renderer's ids with the assistant mask and the removed turns flagged; and TRL's SFTTrainer trains
the tiny model on the openai export (the reasoning, and the empty think block of a removed turn, in
the text it trains on)."""

from __future__ import annotations

import dataclasses
import io
import json

import pytest

from flows.cli import main
from race_core.decisions import remove_reasoning
from race_core.envs.expert import expert_dataset
from race_core.export import openai_record, template_reasoning_field
from race_core.importers import ImportOptions, import_stream
from race_core.policy import load_tokenizer
from race_core.render import ASSISTANT_ROLES, Renderer, Role
from race_core.schema import ToolCall, Trajectory, Turn, trajectory_id
from storage.parquet import compressed_row, write_dataset

TOOLS = ({"type": "function", "function": {"name": "search", "description": "Search the wiki.",
          "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}},)


def _tool_trajectories() -> list[Trajectory]:
    one = Trajectory("Who wrote Dune?", "wiki", "r1", (
        Turn("Look it up.", (ToolCall("search", {"query": "Dune author"}),), "Frank Herbert"),
        Turn("Check both.", (ToolCall("search", {"query": "a"}, "call_a"), ToolCall("search", {"query": "b"}, "call_b")),
             "first\n\nsecond"),
        Turn("Done.", "Frank Herbert", ""),
    ), system="You answer with tools.", tools=TOOLS)
    return [one]


def _compressed(tmp_path, trajectories: list[Trajectory]):
    """A compressed.parquet of `trajectories`, turn 1's reasoning removed in every other one."""
    rows, removed = [], {}
    for k, trajectory in enumerate(trajectories):
        skipped = [1] if k % 2 == 0 and len(trajectory.turns) > 1 else []
        compressed = remove_reasoning(trajectory, skipped)  # keeps the source trajectory's id, as the pipeline does
        rows.append(compressed_row(compressed, skipped, 0, 0, "test", 1e-3))
        removed[k] = (compressed, skipped)
    path = tmp_path / "compressed.parquet"
    write_dataset("compressed", rows, path)
    return path, removed


def _lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _import(path, fmt: str) -> list[Trajectory]:
    items = list(import_stream(io.BytesIO(path.read_bytes()), str(path), fmt, ImportOptions()))
    assert all(isinstance(item, Trajectory) for item in items), items
    return items


@pytest.mark.parametrize("fmt,field", [("openai", "reasoning_content"), ("openai", "content"),
                                       ("openai", "thinking"), ("sharegpt", None)])
def test_the_export_imports_back_as_the_same_trajectories(tmp_path, fmt, field):
    trajectories = expert_dataset(6, seed=2, difficulty=2) + _tool_trajectories()
    source, compressed = _compressed(tmp_path, trajectories)
    out = tmp_path / f"{fmt}.jsonl"
    args = ["export", "--format", fmt, "--input", str(source), "--out", str(out)]
    assert main(args + (["--reasoning-field", field] if field else [])) == 0
    records = _lines(out)
    assert [r["reasoning_removed"] for r in records] == [
        [t in skipped for t in range(len(c.turns))] for c, skipped in compressed.values()]
    if field == "thinking":  # our importer reads reasoning_content / reasoning / think blocks, not GPT-OSS's field
        assert all("thinking" in m for r in records for m in r["messages"] if m["role"] == "assistant")
        return
    back = _import(out, fmt)
    for (original, _), imported in zip(compressed.values(), back, strict=True):
        if fmt == "sharegpt":  # LLaMA-Factory's calls have no ids, and its conversations end on the assistant
            turns = [Turn(t.reasoning, tuple(dataclasses.replace(c, id="") for c in t.tool_calls) or t.action,
                          t.observation) for t in original.turns]
            turns[-1] = Turn(turns[-1].reasoning, turns[-1].action, "")
            original = dataclasses.replace(original, turns=tuple(turns))
        assert imported.turns == original.turns and imported.system == original.system
        assert imported.tools == original.tools and imported.question == original.question
        assert imported.id == trajectory_id(original)  # the same content (the record's id names the source's)


def test_openai_reasoning_field_and_tool_calls_are_where_templates_read_them():
    trajectory = _tool_trajectories()[0]
    record = openai_record(trajectory, [1], "reasoning_content")
    roles = [m["role"] for m in record["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "tool", "tool", "assistant"]
    first, parallel = record["messages"][2], record["messages"][4]
    assert first["reasoning_content"] == "Look it up." and first["content"] == ""
    assert first["tool_calls"] == [{"type": "function", "function": {"name": "search",
                                                                      "arguments": {"query": "Dune author"}}}]
    assert [c["id"] for c in parallel["tool_calls"]] == ["call_a", "call_b"]  # the source's ids, kept
    assert [m.get("tool_call_id") for m in record["messages"][5:7]] == ["call_a", "call_b"]
    assert record["messages"][5]["content"] == "first\n\nsecond" and record["messages"][6]["content"] == ""
    assert record["tools"] == list(TOOLS) and record["reasoning_removed"] == [False, True, False]
    inline = openai_record(trajectory, [], "content")["messages"][-1]
    assert inline == {"role": "assistant", "content": "<think>Done.</think>\nFrank Herbert"}


def test_sharegpt_alternates_as_llama_factory_requires_and_describes_itself(tmp_path):
    source, _ = _compressed(tmp_path, expert_dataset(4, seed=1, difficulty=2) + _tool_trajectories())
    (tmp_path / "dataset_info.json").write_text(json.dumps({"theirs": {"file_name": "theirs.json"}}))
    out = tmp_path / "race_calc.jsonl"
    assert main(["export", "--format", "sharegpt", "--input", str(source), "--out", str(out)]) == 0
    for record in _lines(out):
        speakers = [c["from"] for c in record["conversations"]]
        assert len(speakers) % 2 == 0
        assert all(s in ("human", "observation") for s in speakers[0::2])
        assert all(s in ("gpt", "function_call") for s in speakers[1::2])
        assert all(c["value"].startswith("<think>") for c in record["conversations"][1::2])
    calls = _lines(out)[-1]
    assert json.loads(calls["tools"]) == list(TOOLS) and calls["system"] == "You answer with tools."
    parallel = calls["conversations"][3]["value"]
    assert parallel.startswith("<think></think>[")  # turn 1's reasoning removed; parallel calls as a list
    info = json.loads((tmp_path / "dataset_info.json").read_text())
    assert info["theirs"] == {"file_name": "theirs.json"}  # merged, nothing lost
    assert info["race_calc"] == {"file_name": "race_calc.jsonl", "formatting": "sharegpt",
                                 "columns": {"messages": "conversations", "system": "system", "tools": "tools"}}


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_tokens_export_is_the_renderers_ids_with_the_assistant_mask_and_removed_turns(tmp_path, tiny_checkpoint,
                                                                                    suffix):
    import pandas as pd

    source, compressed = _compressed(tmp_path, expert_dataset(5, seed=3, difficulty=2))
    out = tmp_path / f"tokens{suffix}"
    assert main(["export", "--format", "tokens", "--input", str(source), "--out", str(out),
                 "--checkpoint", str(tiny_checkpoint)]) == 0
    records = _lines(out) if suffix == ".jsonl" else pd.read_parquet(out).to_dict("records")
    renderer = Renderer(load_tokenizer(tiny_checkpoint))
    for record, (trajectory, skipped) in zip(records, compressed.values(), strict=True):
        rendered = renderer.render(trajectory)
        assert list(record["input_ids"]) == rendered.input_ids.tolist()
        assert list(record["assistant_mask"]) == rendered.mask(*ASSISTANT_ROLES).astype(int).tolist()
        assert list(record["token_turns"]) == rendered.turns.tolist()
        assert list(record["reasoning_removed"]) == [t in skipped for t in range(len(trajectory.turns))]
        for t in skipped:  # a removed turn: its think block is empty, its close marker is there
            assert rendered.reasoning_token_count(t) == 0 and rendered.mask(Role.CLOSE, turn=t).any()
    assert any(any(r["reasoning_removed"]) for r in records)
    info = json.loads((tmp_path / "tokens.info.json").read_text())
    assert info["roles"]["2"] == "reasoning" and info["render_mode"] == renderer.render_mode


def test_export_errors_name_what_is_missing(tmp_path, capsys):
    source, _ = _compressed(tmp_path, expert_dataset(2, seed=1))
    assert main(["export", "--format", "tokens", "--input", str(source), "--out", str(tmp_path / "t.jsonl")]) == 2
    assert "--format tokens needs --checkpoint" in capsys.readouterr().err
    assert main(["export", "--format", "openai", "--input", str(tmp_path / "nope.parquet"),
                 "--out", str(tmp_path / "o.jsonl")]) == 2
    assert "nope.parquet" in capsys.readouterr().err and not (tmp_path / "o.jsonl").exists()


def test_the_reasoning_field_is_the_one_the_chat_template_reads(tiny_checkpoint):
    tokenizer = load_tokenizer(tiny_checkpoint)
    assert template_reasoning_field(tokenizer) == "content"  # the tiny template renders content only
    tokenizer.chat_template = ("{% for m in messages %}{{ m['role'] }}: {% if m.reasoning_content is defined %}"
                               "<think>{{ m.reasoning_content }}</think>{% endif %}{{ m['content'] }}\n{% endfor %}")
    assert template_reasoning_field(tokenizer) == "reasoning_content"


def test_trls_sft_trainer_trains_the_tiny_model_on_the_openai_export(tmp_path, tiny_checkpoint):
    """The openai export loads where users load it: datasets' JSON loader, TRL's SFTTrainer, the
    checkpoint's own chat template (reasoning as an inline think block: the tiny template reads no
    reasoning field, and `--reasoning-field auto` finds that)."""
    import torch
    from datasets import load_dataset
    from trl import SFTConfig, SFTTrainer

    from race_core.policy import load_policy

    source, compressed = _compressed(tmp_path, expert_dataset(8, seed=2, difficulty=1))
    out = tmp_path / "train.jsonl"
    assert main(["export", "--format", "openai", "--input", str(source), "--out", str(out),
                 "--checkpoint", str(tiny_checkpoint)]) == 0
    model, tokenizer = load_policy(tiny_checkpoint)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    dataset = load_dataset("json", data_files=str(out), split="train", cache_dir=str(tmp_path / "hf-cache"))
    args = SFTConfig(output_dir=str(tmp_path / "trl"), max_steps=3, per_device_train_batch_size=4, learning_rate=1e-3,
                     report_to="none", save_strategy="no", logging_steps=1, use_cpu=True, max_length=1024)
    trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)
    first, _ = compressed[0]  # turn 1's reasoning removed
    text = tokenizer.decode(trainer.train_dataset[0]["input_ids"])
    assert f"<think>{first.turns[0].reasoning}</think>" in text and "<think></think>" in text
    result = trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert result.global_step == 3 and len(losses) == 3 and all(0 < loss < 20 for loss in losses)
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
