"""Render chat templates as transformers' apply_chat_template does.

Reads [{"template": path, "vars": {...}}, ...] as JSON on stdin and prints
the rendered strings (or {"error": message}) as a JSON list: the reference
the simulator's Go Jinja rendering is checked against.
"""

import json
import sys
from datetime import datetime

try:
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError as e:
    print(f"render: {e}; install e2e/requirements.txt", file=sys.stderr)
    sys.exit(3)


def raise_exception(message):
    raise ValueError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # transformers overrides Jinja's tojson with this.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception
env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)

out = []
for case in json.load(sys.stdin):
    with open(case["template"]) as f:
        template = env.from_string(f.read())
    try:
        out.append(template.render(**case["vars"]))
    except Exception as e:
        out.append({"error": str(e)})
json.dump(out, sys.stdout)
