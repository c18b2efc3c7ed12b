#!/usr/bin/env python3
"""Render reference outputs for shared/prompt's tests with real Jinja2.

Each case is a raw chat-completions request body. The script prepares the
messages the way vLLM's chat endpoint does before it calls the tokenizer's
apply_chat_template, renders each real template of e2e/vllmsim/templates with
Jinja2 configured as transformers configures it, and writes every body and
output to reference.json. The Go tests read that file; they never run Python.

It also renders cachesync's template-check probes (probe_* cases), so that
the probe set itself is pinned to Jinja2. Regenerate (needs jinja2 and
xxhash: apt-get install python3-jinja2, pip install xxhash) from the
repository root:

    python3 shared/prompt/testdata/render_reference.py
"""

import datetime
import json
import os
import sys

import jinja2
import jinja2.ext
import jinja2.nodes
import xxhash
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.dirname(os.path.abspath(__file__))
TEMPLATES = os.path.join(ROOT, "..", "..", "..", "e2e", "vllmsim", "templates")
# The templates only shared/prompt's general path renders.
GENERAL = os.path.join(ROOT, "..", "templates")
# The probe set cachesync has every engine render (cachesync/internal/verify).
PROBES = os.path.join(ROOT, "..", "..", "..", "cachesync", "internal", "verify", "probes.json")

# family: (template file, special tokens of the model, content format vLLM
# detects for the template: "string" joins text parts, "openai" keeps them).
FAMILIES = {
    "chatml": ("chatml.jinja", {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, "string"),
    "llama3": ("llama3.jinja", {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}, "string"),
    "mistral": ("mistral.jinja", {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}, "string"),
    "gemma": ("gemma.jinja", {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"}, "openai"),
    "qwen3": ("qwen3.jinja", {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, "string"),
    "llama3.2": ("llama3.2.jinja", {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}, "string"),
}

# The general path's families (shared/prompt/templates/SOURCES.md): the
# content format is detected from the template, as vLLM detects it.
for _name, _special in {
    "deepseek-v3.1": {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"},
    "deepseek-r1": {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"},
    "gpt-oss": {"bos_token": "<|startoftext|>", "eos_token": "<|return|>"},
    "mistral-small-3.2": {"bos_token": "<s>", "eos_token": "</s>"},
    "phi-3.5": {"bos_token": "<s>", "eos_token": "<|endoftext|>"},
    "granite-3.3": {"bos_token": "<|end_of_text|>", "eos_token": "<|end_of_text|>"},
    "hermes": {"bos_token": "<|begin_of_text|>", "eos_token": "<|im_end|>"},
    "vllm-llama3.1-json": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "vllm-llama4-json": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot|>"},
    "vllm-llama4-pythonic": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot|>"},
    "vllm-phi4-mini": {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"},
    "vllm-hermes": {"bos_token": "<|begin_of_text|>", "eos_token": "<|im_end|>"},
    "vllm-chatml": {"eos_token": "<|im_end|>"},
}.items():
    FAMILIES[_name] = (os.path.join(GENERAL, _name + ".jinja"), _special, None)

# The clock strftime_now reads (transformers gives templates the process's
# local time; the Go test sets Renderer.Now to the same instant, in UTC).
REFERENCE_TIME = datetime.datetime(2026, 12, 1, 15, 4, 5, tzinfo=datetime.timezone.utc)

MEDIA = ["image_url", "input_audio", "audio_url", "video_url", "image", "audio", "video",
         "input_image", "image_embeds", "audio_embeds", "image_pil", "file"]


class AssistantTracker(jinja2.ext.Extension):
    """transformers' {% generation %} tag: it marks assistant text for
    training masks and renders its body unchanged."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def environment():
    # As transformers' _compile_jinja_template sets it up.
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[AssistantTracker, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = REFERENCE_TIME.strftime
    return env


def marker(part):
    """kvroute's stand-in for a media part: XXH64 of its URL or data."""
    keys = [part["type"]] if "type" in part else [k for k in part if k in MEDIA]
    for k in keys:
        v = part.get(k)
        if isinstance(v, str):
            return "<|media:%016x|>" % xxhash.xxh64_intdigest(v.encode())
        if isinstance(v, dict):
            for kk, vv in v.items():
                if kk in ("url", "data") and isinstance(vv, str):
                    return "<|media:%016x|>" % xxhash.xxh64_intdigest(vv.encode())
    raise ValueError("no payload in media part %r" % part)


def parts(content, fmt, leading_system):
    """vLLM's _parse_chat_message_content for one message's content."""
    if content is None:
        content = []
    elif isinstance(content, str):
        content = [{"type": "text", "text": content}]
    out = []
    for p in content:
        if isinstance(p, str):
            out.append(("text", p))
        elif p.get("type") in ("text", "input_text", "output_text"):
            out.append(("text", p["text"]))
        elif p.get("type") == "refusal":
            out.append(("text", p["refusal"]))
        else:
            out.append(("media", marker(p)))
    if fmt == "string":
        return "\n".join(t for _, t in out)
    # Gemma's template reads messages[0]['content'][0]['text'] of a leading
    # system message; a media part there has no text, as on vLLM.
    return [{"type": "image"} if kind == "media" and leading_system else {"type": "text", "text": t}
            for kind, t in out]


def conversation(body, fmt):
    """The messages vLLM passes to apply_chat_template."""
    conv = []
    for i, m in enumerate(body["messages"]):
        role = m["role"]
        cm = {"role": role, "content": parts(m.get("content"), fmt, i == 0 and role == "system")}
        if role == "assistant" and m.get("tool_calls") is not None:
            cm["tool_calls"] = m["tool_calls"]
        elif role == "tool" and "tool_call_id" in m:
            cm["tool_call_id"] = m["tool_call_id"]
        if isinstance(m.get("name"), str):
            cm["name"] = m["name"]
        conv.append(cm)
    # vLLM's _postprocess_messages: tool call arguments become objects.
    for cm in conv:
        for call in cm.get("tool_calls") or []:
            args = call["function"].get("arguments")
            if args:
                if not isinstance(args, (dict, list)):
                    call["function"]["arguments"] = json.loads(args)
            else:
                call["function"]["arguments"] = {}
    return conv


def tools_of(body):
    """vLLM's [tool.model_dump() for tool in request.tools]."""
    tools = body.get("tools")
    if tools is None:
        return None
    out = []
    for t in tools:
        fn = t["function"]
        nfn = {"name": fn["name"], "description": fn.get("description"), "parameters": fn.get("parameters")}
        nfn.update((k, v) for k, v in fn.items() if k not in nfn)
        nt = {"type": "function", "function": nfn}
        nt.update((k, v) for k, v in t.items() if k not in ("type", "function"))
        out.append(nt)
    return out


def content_format(env, source):
    """vLLM's _detect_content_format: "openai" when the template loops over
    a message's content (filters aside), else "string"."""
    for loop in env.parse(source).find_all(jinja2.nodes.For):
        it = loop.iter
        while isinstance(it, jinja2.nodes.Filter):
            it = it.node
        if isinstance(it, jinja2.nodes.Getitem) and isinstance(it.arg, jinja2.nodes.Const) and it.arg.value == "content":
            return "openai"
        if isinstance(it, jinja2.nodes.Getattr) and it.attr == "content":
            return "openai"
    return "string"


def render(env, family, raw):
    name, special, fmt = FAMILIES[family]
    with open(os.path.join(TEMPLATES, name), encoding="utf-8") as f:
        source = f.read()
    template = env.from_string(source)
    fmt = fmt or content_format(env, source)
    body = json.loads(raw)
    try:
        # vLLM passes chat_template_kwargs to the template as variables.
        kwargs = dict(body.get("chat_template_kwargs") or {})
        text = template.render(messages=conversation(body, fmt), tools=tools_of(body), documents=None,
                               add_generation_prompt=body.get("add_generation_prompt", True), **special, **kwargs)
    except Exception as e:  # the engine answers these with an error
        return {"error": "%s: %s" % (type(e).__name__, e)}
    return {"text": text}


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the weather for a city, e.g. \"Paris\".",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name: Zürich, São Paulo, 東京"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}
CLOCK = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}, "strict": True}}


def j(obj):
    return json.dumps(obj, ensure_ascii=False)


def long_body():
    msgs = [{"role": "system", "content": "You answer in full sentences.\n"}]
    for i in range(40):
        role = "user" if i % 2 == 0 else "assistant"
        msgs.append({"role": role, "content": ("Turn %d: " % i) + "lorem ipsum dolor sit amet, \"quoted\" é\n" * 10})
    return j({"model": "m", "messages": msgs, "max_tokens": 16})


# Raw bodies, some written by hand to carry particular escapes.
CASES = {
    "system_user": j({"model": "Qwen/Qwen2.5-7B-Instruct", "messages": [
        {"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hello!"}]}),
    "user_only": '{"messages":[{"role":"user","content":"What is 2+2?"}],"model":"m","stream":true}',
    "multi_turn": j({"model": "m", "messages": [
        {"role": "system", "content": "Be kind."},
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke."}, {"role": "assistant", "content": "Why did the chicken cross the road?"},
        {"role": "user", "content": "Why?"}]}),
    "developer_role": j({"model": "m", "messages": [
        {"role": "developer", "content": "Answer in French."}, {"role": "user", "content": "Hello"}]}),
    "later_system": j({"model": "m", "messages": [
        {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
        {"role": "system", "content": "new rules"}, {"role": "user", "content": "c"}]}),
    "system_only": j({"model": "m", "messages": [{"role": "system", "content": "  just a system prompt  "}]}),
    "names": j({"model": "m", "messages": [
        {"role": "system", "content": "Moderate.", "name": "mod"},
        {"role": "user", "content": "hi", "name": "alice"}, {"role": "assistant", "content": "hello alice"},
        {"role": "user", "content": "hi", "name": "bob"}]}),
    "parts": j({"model": "m", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "First part."}, {"type": "text", "text": " second part "}, "third, bare"]},
        {"role": "assistant", "content": [{"type": "text", "text": "Seen."}]},
        {"role": "user", "content": [{"type": "text", "text": "Describe:"},
                                     {"type": "image_url", "image_url": {"url": "https://example.com/cat.png", "detail": "low"}},
                                     {"type": "text", "text": "and"},
                                     {"type": "input_audio", "input_audio": {"data": "UklGRiQAAABXQVZF", "format": "wav"}}]}]}),
    "system_parts": j({"model": "m", "messages": [
        {"role": "system", "content": [{"type": "text", "text": "Rule one."}, {"type": "text", "text": "Rule two."}]},
        {"role": "user", "content": "go"}]}),
    "escapes": '{"model":"m","messages":[{"role":"system","content":"Tab\\there, quote \\" and backslash \\\\ and slash \\/ done."},'
               '{"role":"user","content":"  \\n caf\\u00e9 \\ud83d\\ude00 \\u4e2d\\u6587 line\\u2028sep \\r\\n\\u00a0"},'
               '{"role":"assistant","content":"\\u0001ctl\\u001f and \\b\\f fine"},'
               '{"role":"user","content":"emoji raw 😀 and é raw; unicode whitespace\\u3000"}]}',
    "whitespace_content": j({"model": "m", "messages": [
        {"role": "user", "content": " \t\n "}, {"role": "assistant", "content": "\u2003ok\u2003"}, {"role": "user", "content": ""}]}),
    "tool_flow": j({"model": "m", "tools": [WEATHER, CLOCK], "messages": [
        {"role": "system", "content": "Use tools when useful."},
        {"role": "user", "content": "Weather in Zürich?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call12345", "type": "function", "function": {
            "name": "get_weather", "arguments": "{\"city\": \"Z\\u00fcrich\", \"unit\": \"celsius\"}"}}]},
        {"role": "tool", "tool_call_id": "call12345", "content": "{\"temp\": 21.5, \"sky\": \"clear\"}\n"},
        {"role": "assistant", "content": "It is 21.5 °C and clear."},
        {"role": "user", "content": "Thanks"}]}),
    "parallel_calls": j({"model": "m", "tools": [WEATHER], "messages": [
        {"role": "user", "content": "Paris and Rome?"},
        {"role": "assistant", "content": "Checking both.", "tool_calls": [
            {"id": "callAAAAA", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
            {"id": "callBBBBB", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Rome\"}"}}]},
        {"role": "tool", "tool_call_id": "callAAAAA", "content": "sunny"},
        {"role": "tool", "tool_call_id": "callBBBBB", "content": "rain"}]}),
    "arguments_numbers": '{"model":"m","messages":[{"role":"user","content":"go"},{"role":"assistant","tool_calls":[{"id":"abcdefghi","type":"function",'
                         '"function":{"name":"calc","arguments":"{\\"a\\":1.50,\\"b\\":1e2,\\"c\\":-0,\\"d\\":2.5e-7,\\"e\\":12345678901234567890,'
                         '\\"f\\":[1,[2,{}],[]],\\"g\\":\\"x\\\\u00e9\\\\n\\\\/\\",\\"h\\":true,\\"i\\":null,\\"j\\":1E+20,\\"k\\":0.0001,\\"l\\":1e16}"}}]},'
                         '{"role":"tool","tool_call_id":"abcdefghi","content":"done"}],"tools":[]}',
    "arguments_object": j({"model": "m", "messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "xyz123456", "type": "function", "function": {
            "name": "noop", "arguments": {"z": 1, "a": [True, None]}}}]},
        {"role": "tool", "tool_call_id": "xyz123456", "content": "ok"}]}),
    "arguments_empty": j({"model": "m", "messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "xyz123456", "type": "function", "function": {
            "name": "noop", "arguments": ""}}]}]}),
    "tool_content_quoting": j({"model": "m", "messages": [
        {"role": "user", "content": "run it"},
        {"role": "assistant", "tool_calls": [{"id": "run000001", "type": "function", "function": {"name": "run", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "run000001", "content": "line 1\nsaid \"hi\" \\ tab\t é\u0001"}]}),
    "empty_tools": j({"model": "m", "tools": [], "messages": [{"role": "user", "content": "hello"}]}),
    "tools_unicode": '{"model":"m","tools":[{"type":"function","function":{"name":"lookup","description":"Look up a path like a\\/b \\u2014 fast","parameters":'
                     '{"type":"object","properties":{"q":{"type":"string","default":"caf\\u00e9"},"n":{"type":"integer","minimum":1.0}}}}}],'
                     '"messages":[{"role":"user","content":"find it"}]}',
    "repeated_last_user": j({"model": "m", "tools": [CLOCK], "messages": [
        {"role": "user", "content": "again"}, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "again"}]}),
    "no_generation_prompt": j({"model": "m", "add_generation_prompt": False, "messages": [
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}),
    "alternation_broken": j({"model": "m", "messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}),
    "long": long_body(),
    # Qwen3's thinking: earlier turns lose their reasoning, later ones keep
    # it, enable_thinking false closes an empty block; a multi-step tool
    # exchange whose last user turn is a wrapped tool response.
    "thinking_history": j({"model": "m", "messages": [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<think>\nAdd them.\n</think>\n\n4"},
        {"role": "user", "content": "and 3+3?"},
        {"role": "assistant", "content": "<think>\n\nAdd again.\n\n</think>\n\n\n6 </think> done"}]}),
    "thinking_off": j({"model": "m", "chat_template_kwargs": {"enable_thinking": False}, "messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]}),
    "date_string": j({"model": "m", "chat_template_kwargs": {"date_string": "02 Jan 2027 \u00e9"}, "messages": [
        {"role": "user", "content": "What day is it?"}]}),
    "date_string_not_a_string": j({"model": "m", "chat_template_kwargs": {"date_string": 20270102}, "messages": [
        {"role": "user", "content": "What day is it?"}]}),
    "thinking_on": j({"model": "m", "chat_template_kwargs": {"enable_thinking": True, "other": [1]}, "messages": [
        {"role": "user", "content": "Hi"}]}),
    "tool_response_user": j({"model": "m", "tools": [WEATHER], "messages": [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "<think>need the tool</think>Let me check.", "tool_calls": [
            {"id": "call_AAAAA", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}}]},
        {"role": "user", "content": "<tool_response>\n-3C\n</tool_response>"},
        {"role": "assistant", "content": "<think>cold</think>\nIt is -3C."}]}),
}


def probe_cases():
    with open(PROBES, encoding="utf-8") as f:
        return {"probe_" + p["name"]: j(p["body"]) for p in json.load(f)}


def main():
    env = environment()
    out = []
    for name, raw in {**CASES, **probe_cases()}.items():
        json.loads(raw)  # every body is valid JSON
        out.append({"name": name, "body": raw, "want": {f: render(env, f, raw) for f in FAMILIES}})
    path = os.path.join(ROOT, "reference.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"generator": "shared/prompt/testdata/render_reference.py",
                   "jinja2": jinja2.__version__, "now": REFERENCE_TIME.isoformat(), "cases": out}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("wrote %d cases to %s" % (len(out), os.path.relpath(path)), file=sys.stderr)


if __name__ == "__main__":
    main()
