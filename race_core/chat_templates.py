"""Chat templates we ship, for checkpoints whose own template cannot render tool calls.

`CHATML_TOOLS` is ChatML with tools in the Hermes convention (the format of Qwen2.5-style tool
models): the tools' JSON schemas inside `<tools></tools>` in the system message, each call as
`<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>` after the assistant's content, and tool
results as a user message of `<tool_response>` blocks. `with_chat_template` writes a copy of a
checkpoint folder whose tokenizer carries another template (weights linked, not copied), which is
how `race model smollm2 --chat-template chatml-tools` makes the tool-calling SmolLM2 of the tests.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

CHATML_TOOLS = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, "
    "\"arguments\": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'assistant' and not message.tool_calls) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant' }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls %}"
    "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + tool_call.name + '\", \"arguments\": ' "
    "+ (tool_call.arguments | tojson) + '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

TEMPLATES = {"chatml-tools": CHATML_TOOLS}
LINKED_SUFFIXES = (".safetensors",)  # weights are linked (or copied where links fail), never rewritten


def chat_template_text(name_or_file: str) -> str:
    """A shipped template by name (`chatml-tools`) or the text of a Jinja file."""
    if name_or_file in TEMPLATES:
        return TEMPLATES[name_or_file]
    path = Path(name_or_file)
    if not path.is_file():
        raise FileNotFoundError(f"chat template {name_or_file!r} is neither a shipped one {sorted(TEMPLATES)} "
                                "nor a Jinja file")
    return path.read_text(encoding="utf-8")


def with_chat_template(checkpoint: str | Path, template: str, out: str | Path) -> Path:
    """A copy of the checkpoint folder at `out` whose tokenizer uses `template` (a name or a file).

    Weights are hard-linked (copied across file systems); the tokenizer is saved anew with the
    template. The folder is built beside `out` and renamed when complete; an existing `out` is reused."""
    from transformers import AutoTokenizer

    from race_core.policy import check_checkpoint_dir

    source, target = check_checkpoint_dir(checkpoint), Path(out)
    if target.exists():
        return check_checkpoint_dir(target)
    text = chat_template_text(template)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        for path in source.iterdir():
            if path.is_file() and path.suffix in LINKED_SUFFIXES:
                try:
                    os.link(path, tmp / path.name)
                except OSError:
                    shutil.copy2(path, tmp / path.name)
            elif path.is_file() and path.name in ("config.json", "generation_config.json"):
                shutil.copy2(path, tmp / path.name)
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True, trust_remote_code=False)
        tokenizer.chat_template = text
        tokenizer.save_pretrained(tmp)
        tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target
