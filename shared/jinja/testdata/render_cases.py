#!/usr/bin/env python3
"""Render shared/jinja's test cases with real Jinja2.

Every chat template in e2e/vllmsim/templates is rendered, with Jinja2 set up
as transformers sets it up, for every conversation of
shared/prompt/testdata/render_reference.py (its cases and cachesync's probe
set), prepared as vLLM prepares them. So are the snippets below, small
templates that pin one rule each. cases.json holds the variables each render
got and its text (or that Jinja2 raised); the Go tests read it and never run
Python. Regenerate from the repository root (needs jinja2 and xxhash):

    python3 shared/jinja/testdata/render_cases.py

With --dir DIR it renders every *.jinja in DIR instead, with made-up special
tokens, into --out: a way to try the evaluator on many templates at once.
"""

import argparse
import datetime
import json
import os
import sys

import jinja2
import jinja2.nodes

ROOT = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.join(ROOT, "..", "..", "..")
sys.path.insert(0, os.path.join(REPO, "shared", "prompt", "testdata"))
import render_reference as ref  # noqa: E402

TEMPLATES = os.path.join(REPO, "e2e", "vllmsim", "templates")

# Small templates, each pinning a rule of Jinja2 under transformers'
# settings (trim_blocks, lstrip_blocks, loopcontrols, tojson as json.dumps).
SNIPPETS = {
    "trim_blocks": "{% if true %}\nA\n{% endif %}\nB",
    "lstrip_blocks": "x\n    {% if true %}\n    y\n    {% endif %}\nz",
    "lstrip_not_midline": "x {% if true %}y{% endif %} z",
    "minus_strips": "a  \n  {%- if true -%}  \n  b  \n  {%- endif -%}  \n  c",
    "plus_keeps": "a\n  {%+ if true %}b{% endif +%}\nc",
    "var_no_trim": "{{ 'a' }}\nb\n  {{ 'c' }}",
    "comment": "a\n  {# note #}\nb{#- x -#}  c",
    "for_loop": "{% for x in [1, 2, 3] %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.revindex }},{% endfor %}",
    "for_filter": "{% for x in range(10) if x is odd %}{{ x }}{{ loop.length }};{% endfor %}",
    "for_else": "{% for x in [] %}{{ x }}{% else %}empty{% endfor %}",
    "for_unpack": "{% for k, v in {'a': 1, 'b': [2]}.items() %}{{ k }}={{ v }};{% endfor %}",
    "loop_controls": "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}",
    "loop_scope": "{% set x = 1 %}{% for i in [1, 2] %}{% set x = x + i %}{{ x }}{% endfor %}{{ x }}",
    "namespace": "{% set ns = namespace(n=0, s='') %}{% for i in [1, 2, 3] %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}",
    "set_block": "{% set x %}a{{ 1 + 1 }}b{% endset %}[{{ x }}]",
    "macro": "{% macro m(a, b='B', c=none) %}{{ a }}{{ b }}{{ c }}{% endmacro %}{{ m(1) }}|{{ m(1, 2) }}|{{ m(1, c=3) }}",
    "macro_recursive": "{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(4) }}",
    "precedence": "{{ 1 + 2 * 3 }} {{ -2 ** 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 'a' ~ 1 + 2 }} {{ not 1 == 2 }}",
    "compare_chain": "{{ 1 < 2 < 3 }} {{ 1 < 3 < 2 }} {{ 'b' in 'abc' }} {{ 2 not in [1, 3] }} {{ 'k' in {'k': 1} }}",
    "ternary": "{{ 'y' if 1 else 'n' }}{{ 'y' if 0 else 'n' }}[{{ 'y' if 0 }}]",
    "printing": "{{ none }} {{ true }} {{ 1.0 }} {{ 1e20 }} {{ 0.1 + 0.2 }} {{ [1, 'a', none, 2.5] }} {{ {'k': \"it's\", 'n': [true]} }} {{ ('a',) }} {{ undefined_name }}",
    "strings": "{{ '  a b  '.strip() }}|{{ 'xxaxx'.strip('x') }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a b c'.split(' ', 1) }}|{{ 'abc'.startswith(('x', 'a')) }}|{{ 'abc'.endswith('c') }}|{{ 'aXa'.replace('a', 'b') }}|{{ 'ab'.upper() }}{{ 'AB'.lower() }}|{{ 'héllo'[1:3] }}|{{ 'abc'[::-1] }}|{{ 'abc'[-1] }}|{{ 'hello world'.title() }}|{{ 'hELLO'.capitalize() }}",
    "filters": "{{ [3, 1, 2]|length }} {{ 'héllo'|length }} {{ [1, 2]|first }}{{ [1, 2]|last }} {{ [1, 2]|join('-') }} {{ 'abc'|list }} {{ none|default('d') }} {{ undefined_name|default('d') }} {{ ''|default('d', true) }} {{ ' x '|trim }} {{ 5|string }}x {{ [1, 2]|reverse|list }} {{ '3'|int + 1 }} {{ -3|abs }} {{ [1, 2, 3]|sum }} {{ 'a\nb'|indent(2) }}",
    "select": "{% set ms = [{'role': 'user', 'c': 1}, {'role': 'system', 'c': 2}, {'role': 'user'}] %}{{ ms|selectattr('role', 'equalto', 'user')|list|length }} {{ ms|rejectattr('role', 'eq', 'user')|map(attribute='c')|list }} {{ ms|selectattr('c')|list|length }} {{ [0, 1, 2]|select|list }} {{ [0, 1, 2]|reject('odd')|list }} {{ ms|map(attribute='c', default=0)|list }} {{ ['a', 'b']|map('upper')|list }}",
    "tests": "{{ x is defined }} {{ none is none }} {{ 'a' is string }} {{ {} is mapping }} {{ [] is iterable }} {{ 'a' is iterable }} {{ 1 is number }} {{ true is number }} {{ 1 is integer }} {{ true is integer }} {{ 1.5 is float }} {{ true is boolean }} {{ 3 is divisibleby 3 }} {{ 1 is sameas 1 }} {{ false is sameas false }} {{ 2 is even }} {{ 'a' is in 'abc' }} {{ [] is sequence }} {{ {} is sequence }} {{ 1 is not none }}",
    "tojson": "{{ {'a': [1, 2.5, none, true], 'b': 'é\"\\n\\u0001', 'c': {}}|tojson }}|{{ [1, {'x': []}]|tojson(indent=2) }}|{{ {'b': 1, 'a': 2}|tojson(sort_keys=true) }}|{{ 'é'|tojson(ensure_ascii=true) }}|{{ [1, 2]|tojson(separators=(',', ':')) }}",
    "dict_methods": "{% set d = {'a': 1, 'items': 2} %}{{ d.get('a') }}{{ d.get('z', 'dz') }}{{ d.get('z') }}{{ d.keys()|list }}{{ d.values()|list }}{{ d['items'] }}{{ d.items()|list }}{{ d.a }}{{ d.z is defined }}",
    "index_out_of_range": "{{ [1][5] is defined }}{{ [1, 2][-1] }}",
    "raise": "{{ raise_exception('stop here') }}",
    "undefined_attribute": "{{ nothing.at_all }}",
    "mutation_refused": "{% set l = [1] %}{{ l.append(2) }}",
    "strftime": "{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%Y-%m-%d %H:%M:%S %A %B %j %p %I') }}",
    "raw": "{% raw %}{{ not rendered }}{% endraw %}",
    "generation": "{% generation %}kept{% endgeneration %}",
    "string_concat": "{{ 'a' 'b' }}{{ 'x' + 'y' }}{{ [1] + [2] }}{{ 'ab' * 2 }}",
    "set_unpack": "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set c, d = [3, 4] %}{{ c }}{{ d }}",
    "ns_dict": "{% set ns = namespace({'a': 1}) %}{{ ns.a }}",
    "slice_list": "{{ [1, 2, 3, 4][1:] }}{{ [1, 2, 3, 4][:-1] }}{{ [1, 2, 3, 4][::2] }}{{ [1, 2, 3, 4][3:0:-1] }}",
    "loop_prev_next": "{% for x in 'abc' %}{{ loop.previtem }}{{ x }}{{ loop.nextitem }}{{ loop.cycle('o', 'e') }};{% endfor %}",
    "not_precedence": "{{ not true and false }}{{ not (true and false) }}{{ 1 if not none else 2 }}",
    "filter_on_neg": "{{ -1|abs }}{{ (1 - 3)|abs }}",
    "tojson_positional": "{{ 'é'|tojson(true) }}|{{ [1]|tojson(false, 2) }}",
    "reverse_is_iterator": "{{ [1, 2]|reverse is sequence }}{{ [1, 2]|reverse is iterable }}{{ [1, 2]|reverse|list }}{{ 'ab'|reverse }}",
    "reverse_not_json": "{{ [1, 2]|reverse|tojson }}",
    "unknown_filter": "{{ 1|no_such_filter }}",
    "unknown_test": "{{ 1 is no_such_test }}",
    "unknown_filter_in_if": "{% if false %}{{ 1|no_such_filter }}{{ 2 is no_such_test }}{% endif %}ok",
    "unknown_test_reached": "{% if x %}{{ 1 is no_such_test }}{% endif %}",
    "format": "{{ '%s=%r;%d%%'|format({'a': [1, none]}, 'q\\'s', 2.9) }}|{{ '%i'|format(true) }}|{{ '%s'|format('é') }}",
    "format_too_few": "{{ '%s %s'|format(1) }}",
    "format_too_many": "{{ 'x'|format(1) }}",
    "sort_min_max": "{{ ['b', 'A', 'c']|sort }}{{ ['b', 'A', 'c']|sort(true) }}{{ [{'n': 2}, {'n': 1}]|sort(attribute='n') }}{{ ['b', 'A']|min }}{{ [3, 1, 2]|max }}{{ {'b': 1, 'A': 2}|dictsort }}{{ {'a': 2, 'b': 1}|dictsort(by='value', reverse=true) }}",
}


def environment():
    return ref.environment()


def render_case(env, tmpl, source, special, raw):
    body = json.loads(raw)
    fmt = ref.content_format(env, source)
    kwargs = dict(body.get("chat_template_kwargs") or {})
    variables = {"messages": ref.conversation(body, fmt), "tools": ref.tools_of(body), "documents": None,
                 "add_generation_prompt": body.get("add_generation_prompt", True), **special, **kwargs}
    try:
        return variables, {"text": tmpl.render(**variables)}
    except Exception as e:
        return variables, {"error": "%s: %s" % (type(e).__name__, e)}


def special_tokens(name):
    for family, (file, special, _) in ref.FAMILIES.items():
        if os.path.basename(file) == name:
            return special
    return {"bos_token": "<s>", "eos_token": "</s>"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default=TEMPLATES)
    ap.add_argument("--out", default=os.path.join(ROOT, "cases.json"))
    args = ap.parse_args()
    env = environment()
    bodies = {**ref.CASES, **ref.probe_cases()}
    cases = []
    for name, src in SNIPPETS.items():
        try:
            out = {"text": env.from_string(src).render(x=1)}
        except Exception as e:
            out = {"error": "%s: %s" % (type(e).__name__, e)}
        cases.append({"template": "snippet:" + name, "source": src, "vars": {"x": 1}, **out})
    sources = {}
    for file in sorted(os.listdir(args.dir)):
        if not file.endswith(".jinja"):
            continue
        with open(os.path.join(args.dir, file), encoding="utf-8") as f:
            source = f.read()
        try:
            tmpl = env.from_string(source)
        except Exception as e:
            print("skip %s: %s" % (file, e), file=sys.stderr)
            continue
        sources[file] = source
        for body_name, raw in bodies.items():
            variables, out = render_case(env, tmpl, source, special_tokens(file), raw)
            cases.append({"template": file, "case": body_name, "vars": variables, **out})
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump({"generator": "shared/jinja/testdata/render_cases.py", "jinja2": jinja2.__version__,
                   "now": ref.REFERENCE_TIME.isoformat(), "templates": sources, "cases": cases},
                  f, ensure_ascii=False, indent=0)
        f.write("\n")
    print("wrote %d cases to %s" % (len(cases), args.out), file=sys.stderr)


if __name__ == "__main__":
    main()
