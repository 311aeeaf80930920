#!/usr/bin/env python3
"""Renders the test chat templates and Jinja probes with transformers' own Jinja setup and
writes the goldens the C++ tests compare against, byte for byte.

    python3 tools/text/make_template_goldens.py [OUT_DIR]   (default tests/text/data/templates)

- probes.json: every template of template_probes.py rendered with its CONTEXT by the
  environment transformers compiles chat templates with (ImmutableSandboxedEnvironment,
  trim_blocks, lstrip_blocks, loopcontrols, raise_exception, tojson as transformers defines
  it); a template that fails to compile or raises is recorded as an error.
- goldens.json: each *.jinja of OUT_DIR rendered on the conversations of conversations.py
  through transformers.utils.chat_template_utils.render_jinja_template (what
  apply_chat_template calls), with and without add_generation_prompt, enable_thinking and
  tools.
- agentic/goldens.json: each *.jinja of OUT_DIR/agentic (tool-calling templates in the manner of
  GLM-4.7/5 and DeepSeek-V3.1) rendered on the 60 conversations of agentic_conversations.py,
  each with its own tools, under two of the KWARGS variants (chat_template_kwargs) with and
  without add_generation_prompt.
"""
import json
import os
import sys

import jinja2
import transformers
from transformers.utils.chat_template_utils import _compile_jinja_template, render_jinja_template

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from agentic_conversations import KWARGS, corpus  # noqa: E402
from conversations import CONVERSATIONS, TOOLS  # noqa: E402
from template_probes import CONTEXT, PROBES  # noqa: E402

SPECIAL_TOKENS = {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>",
                  "pad_token": "<|endoftext|>"}
TOOL_CONVERSATIONS = {"system_user", "tool_call_dict_args", "tool_call_string_args", "parallel_tool_calls"}


def render_probe(template):
    try:
        return {"output": _compile_jinja_template(template).render(**CONTEXT)}
    except Exception as e:  # noqa: BLE001 - any failure is an expected error
        return {"error": f"{type(e).__name__}: {e}"}


def variants(conversation):
    out = [(False, None, False), (True, None, False), (True, True, False), (True, False, False)]
    if conversation in TOOL_CONVERSATIONS:
        out += [(True, None, True), (True, False, True)]
    return out


def render(source, conv, tools, agp, extra):
    try:
        rendered, _ = render_jinja_template(conversations=[conv], tools=tools, chat_template=source,
                                            add_generation_prompt=agp, **SPECIAL_TOKENS, **extra)
        return {"output": rendered[0]}
    except Exception as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {e}"}


def agentic_goldens(out_dir):
    adir = os.path.join(out_dir, "agentic")
    conversations = corpus()
    cases = []
    for fname in sorted(os.listdir(adir)):
        if not fname.endswith(".jinja"):
            continue
        with open(os.path.join(adir, fname), encoding="utf-8") as f:
            source = f.read()
        for i, (name, tools, msgs) in enumerate(conversations):
            for k in (i % len(KWARGS), (i + 2) % len(KWARGS)):
                agp = (i + k) % 4 != 0
                rec = {"template": fname, "conversation": name, "add_generation_prompt": agp, "extra": KWARGS[k]}
                rec.update(render(source, msgs, tools, agp, KWARGS[k]))
                cases.append(rec)
    with open(os.path.join(adir, "goldens.json"), "w", encoding="utf-8") as f:
        json.dump({"jinja2_version": jinja2.__version__, "transformers_version": transformers.__version__,
                   "special_tokens": SPECIAL_TOKENS,
                   "conversations": {n: {"tools": t, "messages": m} for n, t, m in conversations},
                   "cases": cases}, f, ensure_ascii=False, indent=0)
    errors = sum("error" in c for c in cases)
    print(f"{len(conversations)} agentic conversations, {len(cases)} renders ({errors} errors)")
    for c in cases:
        if "error" in c:
            print("  error:", c["template"], c["conversation"], c["error"])


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__),
                                                                  "../../tests/text/data/templates")
    probes = []
    for name, template in PROBES:
        rec = {"name": name, "template": template}
        rec.update(render_probe(template))
        probes.append(rec)
    with open(os.path.join(out_dir, "probes.json"), "w", encoding="utf-8") as f:
        json.dump({"jinja2_version": jinja2.__version__, "transformers_version": transformers.__version__,
                   "context": CONTEXT, "probes": probes}, f, ensure_ascii=False, indent=0)

    cases = []
    for fname in sorted(os.listdir(out_dir)):
        if not fname.endswith(".jinja"):
            continue
        with open(os.path.join(out_dir, fname), encoding="utf-8") as f:
            source = f.read()
        for conv_name, conv in CONVERSATIONS.items():
            for agp, thinking, with_tools in variants(conv_name):
                extra = {} if thinking is None else {"enable_thinking": thinking}
                rec = {"template": fname, "conversation": conv_name, "add_generation_prompt": agp,
                       "extra": extra, "tools": with_tools}
                try:
                    rendered, _ = render_jinja_template(
                        conversations=[conv], tools=TOOLS if with_tools else None, chat_template=source,
                        add_generation_prompt=agp, **SPECIAL_TOKENS, **extra)
                    rec["output"] = rendered[0]
                except Exception as e:  # noqa: BLE001
                    rec["error"] = f"{type(e).__name__}: {e}"
                cases.append(rec)
    with open(os.path.join(out_dir, "goldens.json"), "w", encoding="utf-8") as f:
        json.dump({"jinja2_version": jinja2.__version__, "transformers_version": transformers.__version__,
                   "special_tokens": SPECIAL_TOKENS, "tools": TOOLS, "conversations": CONVERSATIONS,
                   "cases": cases}, f, ensure_ascii=False, indent=0)
    errors = sum("error" in c for c in cases)
    perrors = sum("error" in p for p in probes)
    print(f"{len(probes)} probes ({perrors} errors), {len(cases)} template renders ({errors} errors)")
    agentic_goldens(out_dir)


if __name__ == "__main__":
    main()
