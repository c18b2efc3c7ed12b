#!/usr/bin/env python3
"""Render reference outputs for shared/prompt's harmony renderer with the
real openai-harmony encoder.

vLLM serves gpt-oss chat requests without the Jinja chat template: it turns
the request into harmony messages (vllm/entrypoints/openai/parser/
harmony_utils.py: a leading system or developer message becomes the
developer instructions, tools the developer message's functions, then one
harmony message per chat message) and renders them with openai-harmony's
render_conversation_for_completion. This script prepares each body the way
that vLLM code does (written here from reading it; vLLM itself needs a GPU
stack this machine does not have), renders it with openai-harmony, and
writes harmony.json, which the Go tests read.

The bodies are render_reference.py's cases and cachesync's probes, plus
cases of what only harmony renders (reasoning, reasoning_effort, schemas).

Needs openai-harmony (0.0.8), jinja2 and xxhash (render_reference.py's
imports), and o200k_base.tiktoken in TIKTOKEN_ENCODINGS_BASE (the copy
github.com/pkoukk/tiktoken-go-loader embeds is the real file). From the
repository root:

    TIKTOKEN_ENCODINGS_BASE=DIR python3 shared/prompt/testdata/render_harmony.py
"""

import json
import os
import sys
from importlib.metadata import version

from openai_harmony import (Author, Conversation, DeveloperContent, HarmonyEncodingName, Message,
                            ReasoningEffort, Role, SystemContent, TextContent, ToolDescription,
                            load_harmony_encoding)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import render_reference  # noqa: E402

ROOT = os.path.dirname(os.path.abspath(__file__))
# vLLM prints the date of its process's clock (datetime.now), the Go test's
# Renderer.Now in UTC.
NOW = render_reference.REFERENCE_TIME
EFFORT = {"low": ReasoningEffort.LOW, "medium": ReasoningEffort.MEDIUM, "high": ReasoningEffort.HIGH}


def flatten(content):
    """A content's text parts joined; None when there are none."""
    if content is None or isinstance(content, str):
        return content
    if not isinstance(content, list):
        return None
    texts = [p if isinstance(p, str) else p.get("text") for p in content
             if isinstance(p, str) or (isinstance(p, dict) and p.get("text") is not None)]
    return "".join(texts) if texts else None


def contents(content):
    """One text content per part, "" for parts without text."""
    if not content:
        return [TextContent(text="")]
    if isinstance(content, str):
        return [TextContent(text=content)]
    return [TextContent(text=p.get("text", "")) for p in content]


def developer(instructions, tools=None):
    dev = DeveloperContent.new()
    if instructions is not None:
        dev = dev.with_instructions(instructions)
    if tools:
        fns = []
        for t in tools:
            if t.get("type", "function") != "function":
                raise ValueError("tool type %s not supported" % t.get("type"))
            fn = t["function"]
            fns.append(ToolDescription.new(fn["name"], fn.get("description") or "", parameters=fn.get("parameters")))
        dev = dev.with_function_tools(fns)
    return Message.from_role_and_content(Role.DEVELOPER, dev)


def message(m, call_names):
    role = m["role"]
    calls = m.get("tool_calls", [])
    out = []
    if role == "assistant" and calls:
        text = flatten(m.get("content"))
        if text:
            out.append(Message.from_role_and_content(Role.ASSISTANT, text).with_channel("commentary"))
        if m.get("reasoning"):
            out.append(Message.from_role_and_content(Role.ASSISTANT, m["reasoning"]).with_channel("analysis"))
        for c in calls:
            fn = c.get("function", {})
            args = fn.get("arguments", "") or ""
            if not isinstance(args, str):
                raise TypeError("arguments are not a string")
            out.append(Message.from_role_and_content(Role.ASSISTANT, args).with_channel("commentary")
                       .with_recipient("functions." + fn.get("name", "")).with_content_type("json"))
        return out
    if role == "tool":
        name = call_names.get(m.get("tool_call_id", ""), "")
        text = flatten(m.get("content")) or ""
        return [Message.from_author_and_content(Author.new(Role.TOOL, "functions." + name), text)
                .with_channel("commentary").with_recipient("assistant")]
    if role == "assistant" and m.get("reasoning"):
        out.append(Message.from_role_and_content(Role.ASSISTANT, m["reasoning"]).with_channel("analysis"))
    parts = contents(m.get("content") or "")
    if role == "assistant":
        if parts[0].text:
            out.append(Message.from_role_and_contents(Role.ASSISTANT, parts).with_channel("final"))
    elif role in ("system", "developer"):
        text = flatten(m.get("content"))
        if text is not None:
            out.append(developer(text))
    else:
        out.append(Message.from_role_and_contents(Role(role), parts))
    return out


def drop_analysis(msgs):
    """vLLM's auto_drop_analysis_messages: reasoning before the last final
    answer is dropped."""
    last = max((i for i, m in enumerate(msgs) if m.author.role == Role.ASSISTANT and m.channel == "final"), default=-1)
    return [m for i, m in enumerate(msgs) if not (i < last and m.channel == "analysis")]


def render(enc, raw):
    body = json.loads(raw)
    try:
        msgs = list(body["messages"])
        instructions = None
        if msgs and msgs[0].get("role") in ("system", "developer"):
            instructions = flatten(msgs[0].get("content"))
            msgs = msgs[1:]
        system = SystemContent.new()
        effort = body.get("reasoning_effort")
        if effort is not None:
            system = system.with_reasoning_effort(EFFORT[effort])
        system = system.with_conversation_start_date(NOW.strftime("%Y-%m-%d"))
        conv = [Message.from_role_and_content(Role.SYSTEM, system)]
        tools = body.get("tools")
        if instructions or tools:
            conv.append(developer(instructions, tools))
        call_names = {}
        for m in msgs:
            for c in m.get("tool_calls", []):
                call_names[c.get("id")] = c.get("function", {}).get("name")
        rest = []
        for m in msgs:
            rest.extend(message(m, call_names))
        conv.extend(drop_analysis(rest))
        tokens = enc.render_conversation_for_completion(Conversation.from_messages(conv), Role.ASSISTANT)
    except Exception as e:  # the engine answers these with an error
        return {"error": "%s: %s" % (type(e).__name__, e)}
    return {"text": enc.decode_utf8(tokens)}


j = render_reference.j
WEATHER = render_reference.WEATHER
SCHEMA = {"type": "function", "function": {
    "name": "search", "description": "Search the catalogue.\nReturns at most ten items.",
    "parameters": {"type": "object", "description": "What to look for.", "properties": {
        "query": {"type": "string", "title": "Query", "description": "Words to match", "examples": ["red shoes", 3]},
        "limit": {"type": "integer", "default": 10},
        "sort": {"type": "string", "enum": ["price", "date"], "default": "date"},
        "ratio": {"type": "number", "default": 0.5, "nullable": True},
        "tags": {"type": "array", "items": {"type": "string"}},
        "any": {"type": "array"},
        "when": {"type": ["string", "null"]},
        "flag": {"type": "boolean", "default": False},
        "filter": {"type": "object", "properties": {
            "min": {"type": "number", "description": "Lowest price"},
            "inner": {"type": "object", "properties": {"deep": {"type": "string"}}, "required": ["deep"]}},
            "required": ["min"]},
        "mode": {"description": "How to match", "oneOf": [
            {"type": "string", "description": "How to match"},
            {"type": "integer", "description": "A preset", "default": 1}], "default": "exact"},
        "choice": {"oneOf": [{"type": "string", "enum": ["a", "b"], "default": "a"}, {"type": "null"}]},
        "free": {},
        "extra": {"type": "object", "default": {"k": [1, "x\u00e9\n\"/"], "n": None}},
        "floats": {"type": "array", "items": {"type": "number"}, "default": [1e-7, 1e-5, 1e15, 1e16, 2.5, -0.0, 123456.789]},
        "ints": {"type": "array", "default": [12345678901234567890, -7]}},
        "required": ["query", "mode"]}}}
BARE = {"type": "function", "function": {"name": "ping", "description": "Line one\r\nLine two\n\nafter a blank\r"}}
EMPTY = {"type": "function", "function": {"name": "noop", "description": "", "parameters": {}}}

CASES = {
    "harmony_reasoning": j({"model": "openai/gpt-oss-20b", "reasoning_effort": "high", "messages": [
        {"role": "developer", "content": "Answer in French."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "reasoning": "Simple addition.", "content": "4"},
        {"role": "user", "content": "3+3?"},
        {"role": "assistant", "reasoning": "Again.", "content": "6"},
        {"role": "user", "content": "and 4+4?"}]}),
    "harmony_reasoning_pending": j({"model": "m", "reasoning_effort": "low", "messages": [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "reasoning": "I need the tool.", "content": "Checking.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "-3C"}, {"type": "text", "text": " dry"}]}],
        "tools": [WEATHER]}),
    "harmony_effort_none": j({"model": "m", "reasoning_effort": "none", "messages": [{"role": "user", "content": "Hi"}]}),
    "harmony_schema": j({"model": "m", "tools": [SCHEMA, BARE, EMPTY], "messages": [
        {"role": "system", "content": [{"type": "text", "text": "Shop "}, {"type": "text", "text": "assistant."}]},
        {"role": "user", "content": "Find red shoes"}]}),
    "harmony_unknown_call": j({"model": "m", "messages": [
        {"role": "user", "content": "go"},
        {"role": "tool", "tool_call_id": "nobody", "content": "orphan"},
        {"role": "assistant", "content": [{"type": "text", "text": ""}, {"type": "text", "text": "dropped"}]},
        {"role": "developer", "content": [{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]},
        {"role": "system", "content": ""},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}, {"type": "text", "text": "this"}]}]}),
    "harmony_empty_system": j({"model": "m", "tools": [WEATHER], "messages": [
        {"role": "system", "content": ""}, {"role": "user", "content": "x"}]}),
}


def main():
    enc = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
    out = []
    cases = {**render_reference.CASES, **render_reference.probe_cases(), **CASES}
    for name, raw in cases.items():
        out.append({"name": name, "body": raw, "want": {"harmony": render(enc, raw)}})
    path = os.path.join(ROOT, "harmony.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"generator": "shared/prompt/testdata/render_harmony.py", "openai-harmony": version("openai-harmony"),
                   "now": NOW.isoformat(), "cases": out}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("wrote %d cases to %s" % (len(out), os.path.relpath(path)), file=sys.stderr)


if __name__ == "__main__":
    main()
