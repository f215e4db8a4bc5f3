"""One config per stage: every field documented, reachable from the CLI, and the same object after
the trip through Prefect's parameter validation (what a UI or API run sends); and the dicts the
stage keys hash stay what they were."""

import dataclasses
import json
from pathlib import Path

import pytest

from flows.cli import build_parser
from flows.options import config_from_args
from race_core.config import (
    DEMO_CONFIG,
    SECTIONS,
    CoverConfig,
    EvalConfig,
    IngestConfig,
    NightlyConfig,
    PipelineConfig,
    Resources,
    RLConfig,
    SFTConfig,
    canonical_dtype,
    field_help,
    from_dict,
    key_fields,
    replace,
)

PINNED = Path(__file__).parent / "fixtures" / "config_asdict.json"


def all_config_classes():
    return [PipelineConfig, NightlyConfig] + [type(getattr(PipelineConfig(), s)) for s in SECTIONS]


@pytest.mark.parametrize("cls", all_config_classes(), ids=lambda c: c.__name__)
def test_every_field_has_a_help_text(cls):
    helps = field_help(cls)
    sections = set(SECTIONS)
    missing = [f.name for f in dataclasses.fields(cls) if f.name not in sections and not helps.get(f.name)]
    assert not missing, f"{cls.__name__}: fields without a '# help' comment: {missing}"


def test_every_setting_is_an_option_of_race_run():
    parser = build_parser()
    run = parser._subparsers._group_actions[0].choices["run"]
    dests = {a.dest for a in run._actions}
    for section in SECTIONS:
        for f in dataclasses.fields(getattr(PipelineConfig(), section)):
            assert f"config:{section}.{f.name}" in dests, (section, f.name)


def test_race_run_options_build_the_config():
    args = build_parser().parse_args([
        "run", "--input", "a.jsonl", "b.jsonl", "--checkpoint", "/m", "--epsilon", "0.01", "--dtype", "bf16",
        "--sft-lr", "0.5", "--no-sft-length-grouping", "--rl-iterations", "3", "--rl-difficulty", "2",
        "--eval-tasks", "7", "--stages", "ingest", "cover", "--strict", "--seed", "5"])
    config = config_from_args(PipelineConfig(), args).with_seed(args.seed)
    expected = replace(PipelineConfig(inputs=("a.jsonl", "b.jsonl"), checkpoint="/m", stages=("ingest", "cover")),
                       **{"cover.epsilon": 0.01, "resources.dtype": "bfloat16", "sft.lr": 0.5,
                          "sft.length_grouping": False, "rl.iterations": 3, "rl.difficulty": 2,
                          "evaluate.tasks": 7, "ingest.strict": True, "sft.seed": 5, "rl.seed": 5,
                          "evaluate.seed": 5})
    assert config == expected


def test_options_not_given_keep_the_base_config():
    args = build_parser().parse_args(["demo", "--epsilon", "0.02"])
    config = config_from_args(DEMO_CONFIG, args)
    assert config == replace(DEMO_CONFIG, **{"cover.epsilon": 0.02})
    assert config.sft.lr == DEMO_CONFIG.sft.lr != PipelineConfig().sft.lr


def test_dict_form_round_trips_and_names_unknown_fields():
    config = replace(DEMO_CONFIG, inputs=("x",), **{"rl.difficulty": 3})
    assert from_dict(PipelineConfig, dataclasses.asdict(config)) == config
    with pytest.raises(ValueError, match="epsilonn"):
        from_dict(PipelineConfig, {"cover": {"epsilonn": 1}})


def test_the_dicts_the_stage_keys_hash_are_pinned():
    """`asdict` and `key_fields` of the shipped configs as the stored stage keys hashed them: the same
    names, order, defaults and value types (bytes, the canonical dtype, tuples)."""
    from deployments import SERVE_DEFAULTS
    from flows.ablate import PRESETS

    configs = {"PipelineConfig()": PipelineConfig(), "DEMO_CONFIG": DEMO_CONFIG, "NightlyConfig()": NightlyConfig(),
               "SERVE_DEFAULTS": SERVE_DEFAULTS,
               "Resources(kv_budget='2GiB', dtype='bf16')": Resources(kv_budget="2GiB", dtype="bf16"),
               **{f"PRESETS[{k!r}].config": PRESETS[k].config for k in ("tiny", "gpu", "cpu", "gpu-lookup")}}
    seen = {name: repr(dataclasses.asdict(config)) for name, config in configs.items()}
    for cls in (IngestConfig, CoverConfig, Resources, SFTConfig, RLConfig, EvalConfig):
        seen[f"key_fields({cls.__name__}())"] = repr(key_fields(cls()))
    for section in ("sft", "rl", "evaluate"):
        seen[f"key_fields(DEMO_CONFIG.{section})"] = repr(key_fields(getattr(DEMO_CONFIG, section)))
    assert seen == json.loads(PINNED.read_text())


def test_from_dict_keeps_the_values_as_given():
    """An int given for a float field stays an int (pydantic would make it 0.0: another stage key)."""
    for config in (CoverConfig(epsilon=0), RLConfig(temperature=1, difficulty=2), Resources(kv_budget="1KiB")):
        again = from_dict(type(config), json.loads(json.dumps(dataclasses.asdict(config))))
        assert repr(dataclasses.asdict(again)) == repr(dataclasses.asdict(config))


def test_dtype_names_are_canonical():
    assert canonical_dtype("bf16") == canonical_dtype("bfloat16") == "bfloat16"
    with pytest.raises(ValueError, match="unknown dtype 'float8'"):
        canonical_dtype("float8")


def test_prefect_validates_the_ui_form_into_the_config():
    """What the UI or the API sends (JSON) becomes the same frozen config inside the flow run."""
    import json

    from flows.pipeline import race_pipeline

    config = replace(DEMO_CONFIG, inputs=("data/a.jsonl",), checkpoint="/m", **{"resources.dtype": "bf16"})
    sent = json.loads(json.dumps({"config": dataclasses.asdict(config)}))
    received = race_pipeline.validate_parameters(sent)["config"]
    assert received == config
    schema = race_pipeline.parameters.model_dump()
    definitions = schema["definitions"]
    assert {"PipelineConfig", "CoverConfig", "SFTConfig", "RLConfig", "EvalConfig", "Resources"} <= set(definitions)
    assert definitions["CoverConfig"]["properties"]["epsilon"]["default"] == PipelineConfig().cover.epsilon


def test_vllm_eager_reaches_only_vllm_engines_and_a_cpu_engine_prefills_prompts_whole():
    from race_core.config import Resources

    assert Resources(vllm_eager=True, device="cuda").engine_options("vllm") == {"enforce_eager": True}
    assert Resources(vllm_eager=True).engine_options("hf") == {} == Resources(device="cuda:1").engine_options("vllm")
    assert Resources().engine_options("vllm") == {"enable_chunked_prefill": False}  # cpu (tests/test_vllm_stages.py)
