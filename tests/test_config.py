"""One config per stage: every field documented, reachable from the CLI, and the same object after
the trip through Prefect's parameter validation (what a UI or API run sends); what a field may hold
is its type (choices, bounds), checked alike by `check`, `from_dict` and Prefect; and the dicts the
stage keys hash stay what they were."""

import dataclasses
import json
import math
from pathlib import Path

import pytest

from flows.cli import build_parser
from flows.options import config_from_args
from race_core.config import (
    BACKENDS,
    DEMO_CONFIG,
    EXECUTORS,
    SECTIONS,
    STAGES,
    CoverConfig,
    EvalConfig,
    IngestConfig,
    NightlyConfig,
    PipelineConfig,
    Resources,
    RLConfig,
    SFTConfig,
    canonical_dtype,
    check_fields,
    field_help,
    from_dict,
    key_fields,
    replace,
)
from race_core.importers import INPUT_FORMATS

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


def test_paths_given_as_path_objects_are_held_as_the_strings_they_name(tmp_path):
    """A script passes `Path`s (inputs, checkpoint, store, report folder): the config holds their
    text, so it checks, round-trips through a dict and keys as the same run given strings."""
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    given = PipelineConfig(inputs=[tmp_path / "a.jsonl"], checkpoint=tmp_path / "ckpt", store=tmp_path / "s",
                           report_dir=tmp_path / "r")
    text = PipelineConfig(inputs=(str(tmp_path / "a.jsonl"),), checkpoint=str(tmp_path / "ckpt"),
                          store=str(tmp_path / "s"), report_dir=str(tmp_path / "r"))
    assert given == text and given.check() is given
    assert PipelineConfig(inputs=tmp_path / "a.jsonl").inputs == (str(tmp_path / "a.jsonl"),)


def test_every_shipped_config_holds_values_its_types_allow():
    from deployments import SERVE_DEFAULTS
    from flows.ablate import PRESETS

    for config in (PipelineConfig(), DEMO_CONFIG, *(p.config for p in PRESETS.values())):
        check_fields(PipelineConfig, dataclasses.asdict(config))
    check_fields(NightlyConfig, dataclasses.asdict(SERVE_DEFAULTS))


BAD_VALUES = [  # (dotted field, value, what the message says after "parameter '<field>': ")
    ("cover.backend", "tgi", "'tgi' is not one of \\['hf', 'vllm'\\]"),
    ("cover.epsilon", float("nan"), "input should be a finite number"),
    ("cover.epsilon", math.inf, "input should be a finite number"),
    ("cover.epsilon", -0.1, "input should be greater than or equal to 0, got -0.1"),
    ("cover.epsilon", 10.0, "input should be less than 10, got 10.0"),
    ("ingest.format", "xml", "'xml' is not one of \\['race', 'auto'"),
    ("resources.device", "tpu", "string should match pattern '\\^\\(cpu\\|cuda\\)', got 'tpu'"),
    ("resources.batch_size", 0, "input should be greater than or equal to 1, got 0"),
    ("resources.shard_size", 0, "input should be greater than or equal to 1"),
    ("resources.pool_shards", 0, "input should be greater than or equal to 1"),
    ("resources.lease_timeout", 0.0, "input should be greater than 0, got 0.0"),
    ("resources.pickup_timeout", -1.0, "input should be greater than 0"),
    ("resources.executor", "dask", "'dask' is not one of \\['', 'local', 'pool', 'ray'\\]"),
    ("resources.ray_actors", -1, "input should be greater than or equal to 0, got -1"),
    ("resources.train_processes", -1, "input should be greater than or equal to 0"),
    ("resources.train_save_every", -1, "input should be greater than or equal to 0"),
    ("resources.mixed_precision", "fp8", "'fp8' is not one of \\['no', 'bf16', 'fp16'\\]"),
    ("rl.iterations", -1, "input should be greater than or equal to 0"),
    ("rl.length_penalty", -0.5, "input should be greater than or equal to 0"),
    ("rl.length_penalty", math.inf, "input should be a finite number"),
    ("rl.micro_batch", -1, "input should be greater than or equal to 0"),
    ("rl.sample_chunk", -1, "input should be greater than or equal to 0"),
    ("rl.env", "chess", "unknown environment 'chess': expected one of \\['calculator', 'lookup', 'scienceworld', 'textworld-cooking'\\] or module:attribute"),
    ("rl.sampler", "tgi", "'tgi' is not one of"),
    ("evaluate.env", "chess", "unknown environment 'chess'"),
    ("evaluate.env", "tests_nowhere:ENV", "environment 'tests_nowhere:ENV': cannot load 'tests_nowhere:ENV': "
                                          "ModuleNotFoundError"),
    ("evaluate.sampler", "tgi", "'tgi' is not one of"),
    ("stages", ("cover", "bake"), "unknown \\['bake'\\]"),
    ("force", ("scoring",), "unknown \\['scoring'\\]"),
]


@pytest.mark.parametrize(("name", "value", "reason"), BAD_VALUES, ids=[f"{n}={v}" for n, v, _ in BAD_VALUES])
def test_a_bad_value_is_an_error_naming_its_parameter_and_the_reason(name, value, reason, tmp_path):
    (tmp_path / "config.json").write_text("{}")
    good = PipelineConfig(inputs=("x.jsonl",), checkpoint=str(tmp_path))
    assert good.check() is good
    message = f"parameter '{name}': {reason}"
    with pytest.raises(ValueError, match=message):
        replace(good, **{name: value}).check()
    data = dataclasses.asdict(good)
    head, _, rest = name.partition(".")
    (data[head] if rest else data)[rest or head] = value
    with pytest.raises(ValueError, match=message):  # the dict form (a stored spec, a sent parameter)
        from_dict(PipelineConfig, data)
    if head in ("ingest", "cover", "resources"):  # the nightly flow's sections: its check says the same
        nightly = NightlyConfig(checkpoint=str(tmp_path))
        with pytest.raises(ValueError, match=message):
            replace(nightly, **{name: value}).check()


def test_checks_that_span_fields_stay_and_several_bad_values_are_named_together(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    good = PipelineConfig(inputs=("x.jsonl",), checkpoint=str(tmp_path))
    with pytest.raises(ValueError, match="parameter 'resources.pool': --executor pool needs the work pool's name"):
        replace(good, **{"resources.executor": "pool"}).check()
    with pytest.raises(ValueError, match="parameter 'rl': environment 'lookup': shape must be one of"):
        replace(good, **{"rl.env": "lookup", "rl.shape": "two-part"}).check()
    with pytest.raises(ValueError, match=r"parameter 'evaluate': environment 'calculator': shape must be one of "
                                         r"\('random', 'two-part'\), got 'spiral'"):  # an environment owns its shapes
        replace(good, **{"evaluate.shape": "spiral"}).check()
    with pytest.raises(ValueError, match="parameter 'checkpoint': .* is not a local save_pretrained folder"):
        replace(good, checkpoint=str(tmp_path / "none")).check()
    with pytest.raises(ValueError, match="parameter 'inputs': give at least one"):
        replace(good, inputs=()).check()
    with pytest.raises(ValueError, match="parameter 'cover.epsilon': .*; parameter 'resources.batch_size': "):
        replace(good, **{"cover.epsilon": -1.0, "resources.batch_size": 0}).check()
    with pytest.raises(ValueError, match="parameter 'resources.kv_budget': "):  # a __post_init__'s own message
        from_dict(Resources, {"kv_budget": "2 parsecs"})


def test_the_configs_build_without_pydantic():
    """A bare CUDA machine (torch and transformers only, `bench.gpu_bare`) builds configs: the fields'
    bounds are read by pydantic only when a config is validated."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['pydantic'] = None\n"
            "from race_core.config import DEMO_CONFIG, Resources, field_types, replace\n"
            "assert Resources(kv_budget='1KiB', dtype='bf16').kv_budget == 1024 and field_types(Resources)\n"
            "assert replace(DEMO_CONFIG, **{'cover.epsilon': 0.1}).cover.epsilon == 0.1\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parents[1], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_option_choices_are_the_field_types_choices():
    run = build_parser()._subparsers._group_actions[0].choices["run"]
    choices = {a.dest: a.choices for a in run._actions if a.choices}
    assert choices["config:cover.backend"] == choices["config:rl.sampler"] == list(BACKENDS)
    assert choices["config:resources.executor"] == list(EXECUTORS)  # not "": that is the option not given
    assert choices["config:stages"] == choices["config:force"] == list(STAGES)
    assert choices["config:ingest.format"] == list(INPUT_FORMATS)


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


def test_prefect_turns_away_a_ui_form_with_a_bad_value_or_an_unknown_key():
    """The field types are the form's: choices are a dropdown, bounds are checked before the run starts."""
    from prefect.exceptions import ParameterTypeError

    from flows.pipeline import race_pipeline

    sent = json.loads(json.dumps({"config": dataclasses.asdict(replace(DEMO_CONFIG, inputs=("a.jsonl",)))}))
    for section, key, value, reason in (("cover", "backend", "tgi", "Input should be 'hf' or 'vllm'"),
                                        ("resources", "batch_size", 0, "greater than or equal to 1"),
                                        ("cover", "epsilonn", 0.1, "nexpected keyword argument")):
        bad = json.loads(json.dumps(sent))
        bad["config"][section][key] = value
        with pytest.raises(ParameterTypeError, match=f"config.{section}.{key}: .*{reason}"):
            race_pipeline.validate_parameters(bad)
    definitions = race_pipeline.parameters.model_dump()["definitions"]
    assert definitions["CoverConfig"]["properties"]["backend"]["enum"] == list(BACKENDS)
    assert definitions["CoverConfig"]["properties"]["epsilon"]["exclusiveMaximum"] == 10
    assert definitions["Resources"]["properties"]["batch_size"]["minimum"] == 1
    assert definitions["PipelineConfig"]["additionalProperties"] is False


def test_vllm_eager_reaches_only_vllm_engines_and_a_cpu_engine_prefills_prompts_whole():
    from race_core.config import Resources

    assert Resources(vllm_eager=True, device="cuda").engine_options("vllm") == {"enforce_eager": True}
    assert Resources(vllm_eager=True).engine_options("hf") == {} == Resources(device="cuda:1").engine_options("vllm")
    assert Resources().engine_options("vllm") == {"enable_chunked_prefill": False}  # cpu (tests/test_vllm_stages.py)
