"""Files for running an exported model outside transformers: an Ollama Modelfile and GGUF notes.

Ollama's TEMPLATE is a Go template, not Jinja, so each gym chat template has its Go counterpart
here (the layouts Ollama's own library uses for these families), with the stop sequences that end
an assistant turn. Each renders a conversation exactly as the Jinja template does (tests render both
ways, the Go side with tests/go_template.py), except the BOS token, which llama.cpp adds itself.
`{{-` trims the template text before it, newlines included: after a turn's closing newline, write
`{{ else if` without the dash. A model with a chat template gym does not know gets a Modelfile without
TEMPLATE: Ollama then uses the chat template embedded in the GGUF file.
"""

from __future__ import annotations

import json

_CHATML = (
    "{{- range .Messages }}<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>\n{{ end }}"
    "<|im_start|>assistant\n"
)
_QWEN_DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
_LLAMA3_TURNS = (
    '{{- range .Messages }}{{ if ne .Role "system" }}<|start_header_id|>{{ .Role }}<|end_header_id|>\n\n'
    "{{ .Content }}<|eot_id|>{{ end }}{{ end }}<|start_header_id|>assistant<|end_header_id|>\n\n"
)

# gym template name -> (Go template, stop sequences)
TEMPLATES: dict[str, tuple[str, list[str]]] = {
    "chatml": (_CHATML, ["<|im_end|>", "<|im_start|>"]),
    "qwen3": (_CHATML, ["<|im_end|>", "<|im_start|>"]),
    "qwen2.5": (
        "{{- if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n{{ else }}<|im_start|>system\n"
        + _QWEN_DEFAULT_SYSTEM
        + '<|im_end|>\n{{ end }}{{- range .Messages }}{{ if ne .Role "system" }}<|im_start|>{{ .Role }}\n'
        "{{ .Content }}<|im_end|>\n{{ end }}{{ end }}<|im_start|>assistant\n",
        ["<|im_end|>", "<|im_start|>"],
    ),
    "phi4": (
        "{{- range .Messages }}<|im_start|>{{ .Role }}<|im_sep|>{{ .Content }}<|im_end|>{{ end }}"
        "<|im_start|>assistant<|im_sep|>",
        ["<|im_end|>", "<|im_start|>"],
    ),
    "llama3": (
        "{{- if .System }}<|start_header_id|>system<|end_header_id|>\n\n{{ .System }}<|eot_id|>{{ end }}"
        + _LLAMA3_TURNS,
        ["<|eot_id|>", "<|start_header_id|>"],
    ),
    "llama3.1": (
        "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
        "Today Date: 26 Jul 2024\n\n{{ if .System }}{{ .System }}{{ end }}<|eot_id|>" + _LLAMA3_TURNS,
        ["<|eot_id|>", "<|eom_id|>", "<|start_header_id|>"],
    ),
    "mistral": (
        '{{- range $i, $_ := .Messages }}{{- if eq .Role "user" }}[INST] '
        "{{ if and $.System (eq (len (slice $.Messages $i)) 1) }}{{ $.System }}\n\n{{ end }}"
        "{{ .Content }}[/INST]"
        '{{- else if eq .Role "assistant" }} {{ .Content }}</s>{{ end }}{{ end }}',
        ["[INST]", "[/INST]", "</s>"],
    ),
    "gemma": (
        '{{- range $i, $_ := .Messages }}{{- if eq .Role "user" }}<start_of_turn>user\n'
        "{{ if and $.System (eq $i 1) }}{{ $.System }}\n\n{{ end }}{{ .Content }}<end_of_turn>\n"
        '{{ else if eq .Role "assistant" }}<start_of_turn>model\n{{ .Content }}<end_of_turn>\n'
        "{{ end }}{{ end }}<start_of_turn>model\n",
        ["<end_of_turn>", "<start_of_turn>"],
    ),
    "phi3": (
        "{{- range .Messages }}<|{{ .Role }}|>\n{{ .Content }}<|end|>\n{{ end }}<|assistant|>\n",
        ["<|end|>", "<|user|>", "<|endoftext|>"],
    ),
    "phi4-mini": (
        "{{- range .Messages }}<|{{ .Role }}|>{{ .Content }}<|end|>{{ end }}<|assistant|>",
        ["<|end|>", "<|user|>", "<|endoftext|>"],
    ),
    "deepseek": (
        '{{- if .System }}{{ .System }}{{ end }}{{- range .Messages }}{{- if eq .Role "user" }}<｜User｜>'
        '{{ .Content }}{{- else if eq .Role "assistant" }}<｜Assistant｜>{{ .Content }}<｜end▁of▁sentence｜>'
        "{{- end }}{{- end }}<｜Assistant｜><think>\n",
        ["<｜end▁of▁sentence｜>", "<｜User｜>"],
    ),
    "deepseek-llm": (
        '{{- if .System }}{{ .System }}\n\n{{ end }}{{- range .Messages }}{{- if eq .Role "user" }}User: '
        '{{ .Content }}\n\n{{ else if eq .Role "assistant" }}Assistant: {{ .Content }}<｜end▁of▁sentence｜>'
        "{{- end }}{{- end }}Assistant:",
        ["<｜end▁of▁sentence｜>", "User:"],
    ),
    "alpaca": (
        "{{- if .System }}{{ .System }}{{ else }}Below is an instruction that describes a task. Write a "
        "response that appropriately completes the request.\n\n{{ end }}{{- range .Messages }}"
        '{{- if eq .Role "user" }}### Instruction:\n{{ .Content }}\n\n### Response:\n'
        '{{ else if eq .Role "assistant" }}{{ .Content }}</s>\n\n{{ end }}{{- end }}',
        ["### Instruction:", "</s>"],
    ),
}


def stop_sequences(template: str | None, eos_token: str | None) -> list[str]:
    """What ends an assistant turn: the template's markers, else the tokenizer's end-of-sequence token."""
    stops = list(TEMPLATES[template][1]) if template in TEMPLATES else []
    if eos_token and eos_token not in stops:
        stops.append(eos_token)
    return stops


def modelfile(
    template: str | None, eos_token: str | None, source: str = ".", system: str | None = None
) -> str:
    """An Ollama Modelfile for the exported directory (`ollama create NAME -f Modelfile` inside it); `system`:
    the default system message the model was trained with (Ollama's SYSTEM, used when a chat has none)."""
    lines = [
        "# Ollama Modelfile written by gym export. Inside this directory: ollama create NAME -f Modelfile",
        "# FROM . imports these safetensors (Ollama converts supported architectures itself); to use a",
        "# GGUF you converted (see GGUF.md), write FROM ./model-Q4_K_M.gguf instead.",
        f"FROM {source}",
    ]
    if template in TEMPLATES:
        lines.append(f'TEMPLATE """{TEMPLATES[template][0]}"""')
    else:
        lines.append("# No TEMPLATE: Ollama uses the chat template stored with the model's tokenizer.")
    if system is not None and '"""' in system:  # Ollama's Modelfile strings have no escapes
        lines.append('# No SYSTEM: the default system message holds """, which no Modelfile string can.')
    elif system is not None:
        lines.append(f'SYSTEM """{system}"""')
    lines += [
        f"PARAMETER stop {json.dumps(s, ensure_ascii=False)}" for s in stop_sequences(template, eos_token)
    ]
    return "\n".join(lines) + "\n"


def gguf_notes(model_type: str, template: str | None, eos_token: str | None) -> str:
    """GGUF.md: how to turn this directory into GGUF files with llama.cpp, and what to check."""
    stops = ", ".join(f"`{s}`" for s in stop_sequences(template, eos_token)) or "(none recorded)"
    return f"""# Converting to GGUF (llama.cpp)

This directory is laid out the way llama.cpp's converter expects: `config.json`
(`model_type: {model_type}`), safetensors weights (sharded files are read through
`model.safetensors.index.json`), `generation_config.json`, and the tokenizer with its chat template
in `tokenizer_config.json` / `chat_template.jinja` (the converter stores it as
`tokenizer.chat_template` in the GGUF metadata).

```bash
git clone https://github.com/ggml-org/llama.cpp && pip install -r llama.cpp/requirements.txt
python llama.cpp/convert_hf_to_gguf.py . --outfile model-f16.gguf --outtype f16
llama.cpp/build/bin/llama-quantize model-f16.gguf model-Q4_K_M.gguf Q4_K_M
llama.cpp/build/bin/llama-cli -m model-Q4_K_M.gguf -cnv      # chat with the embedded template
```

- Architecture `{model_type}` must be one the converter supports (Llama, Qwen2/3, Mistral, Gemma,
  Phi-3 and most hub decoder models are).
- Convert merged weights only: a LoRA adapter converts separately (`convert_lora_to_gguf.py`).
- Generation should stop at: {stops}.
- Chat template: {f"gym's `{template}`" if template else "the tokenizer's own"}; the Ollama `Modelfile`
  beside this file carries the same layout as a Go template.
"""
