"""`race serve --allow-root`: a served run reads and writes only under the allowed roots."""

import os

import pytest

from flows.roots import ROOTS_ENV, allowed_roots, check_within_roots, roots_env


def test_paths_and_urls_outside_the_roots_are_refused_naming_the_parameter(tmp_path):
    root = tmp_path / "data"
    (root / "sub").mkdir(parents=True)
    roots = (str(root), "s3://bucket/race")
    check_within_roots({"inputs": [str(root / "sub" / "*.jsonl"), "s3://bucket/race/in.jsonl"],
                        "store": "s3://bucket/race/store", "report_dir": None}, roots)
    outside = {"inputs": [str(root / ".." / "etc.jsonl")], "report_dir": "/etc/race",
               "store": "s3://bucket/racecar/store", "checkpoint": "http://127.0.0.1:9/model"}
    for name, value in outside.items():
        with pytest.raises(ValueError, match=f"parameter '{name}'.*outside the roots"):
            check_within_roots({name: value}, roots)


def test_a_symlink_out_of_a_root_is_outside(tmp_path):
    root = tmp_path / "data"
    root.mkdir()
    (root / "escape").symlink_to("/etc")
    with pytest.raises(ValueError, match="outside the roots"):
        check_within_roots({"inputs": [str(root / "escape" / "passwd")]}, (str(root),))


def test_unrestricted_without_the_variable_and_restricted_with_it(monkeypatch, tmp_path):
    monkeypatch.delenv(ROOTS_ENV, raising=False)
    assert allowed_roots() is None
    check_within_roots({"inputs": ["http://example.invalid/x"]}, allowed_roots())
    monkeypatch.setenv(ROOTS_ENV, roots_env([str(tmp_path), "s3://b/p"]))
    assert allowed_roots() == (str(tmp_path.resolve()), "s3://b/p")
    assert os.environ[ROOTS_ENV]


def test_the_pipeline_flow_checks_its_parameters_against_the_roots(prefect_harness, tiny_checkpoint, demo_inputs,
                                                                   tmp_path, monkeypatch):
    from flows.pipeline import race_pipeline
    from race_core.config import COVER_STAGES, PipelineConfig

    monkeypatch.setenv(ROOTS_ENV, roots_env([str(tmp_path), str(tiny_checkpoint)]))
    config = PipelineConfig(inputs=tuple(demo_inputs), checkpoint=str(tiny_checkpoint), store=str(tmp_path / "s"),
                            stages=COVER_STAGES, report_dir="/tmp/elsewhere-race-report")
    with pytest.raises(ValueError, match="parameter 'report_dir'"):
        race_pipeline(config)
