package vllmsim

import (
	"errors"
	"fmt"

	"github.com/ardanlabs/jinja"
)

// vLLM does not hand a request's messages and tools to the chat template as
// they came: it rebuilds each message (parse_chat_messages), parses tool
// call arguments into objects (_postprocess_messages), and dumps each tool
// through its pydantic model. The template sees the result, so a router
// that renders prompts must reproduce it, and so must the simulator.

// conversation rebuilds the messages as vLLM passes them to the template:
// role and content (normalised by content), tool_calls on assistant
// messages, tool_call_id on tool messages, name when it is a string, and
// nothing else; tool call arguments given as a JSON string become the value
// it encodes, and absent or empty arguments become {}.
func conversation(msgs jinja.Value, content func(jinja.Value) (jinja.Value, error)) (jinja.Value, error) {
	if !msgs.IsList() || msgs.AsList().Len() == 0 {
		return msgs, errors.New("messages must be a non-empty list")
	}
	out := make([]jinja.Value, 0, msgs.AsList().Len())
	for i, m := range msgs.AsList().Items {
		if !m.IsDict() {
			return msgs, fmt.Errorf("messages[%d] is not an object", i)
		}
		in := m.AsDict()
		role, ok := in.Get("role")
		if !ok || !role.IsString() {
			return msgs, fmt.Errorf("messages[%d].role must be a string", i)
		}
		c, _ := in.Get("content")
		if c.IsUndefined() {
			c = jinja.None()
		}
		flat, err := content(c)
		if err != nil {
			return msgs, fmt.Errorf("messages[%d].content: %w", i, err)
		}
		nm := jinja.NewDict()
		d := nm.AsDict()
		d.Set("role", role)
		d.Set("content", flat)
		switch role.AsString() {
		case "assistant":
			if calls, ok := in.Get("tool_calls"); ok && !calls.IsNone() {
				if err := parseArguments(calls); err != nil {
					return msgs, fmt.Errorf("messages[%d].tool_calls: %w", i, err)
				}
				d.Set("tool_calls", calls)
			}
		case "tool":
			if id, ok := in.Get("tool_call_id"); ok {
				d.Set("tool_call_id", id)
			}
		}
		if name, ok := in.Get("name"); ok && name.IsString() {
			d.Set("name", name)
		}
		out = append(out, nm)
	}
	return jinja.NewList(out), nil
}

// parseArguments replaces each call's function.arguments string with the
// JSON value it holds, as vLLM's _postprocess_messages does.
func parseArguments(calls jinja.Value) error {
	if !calls.IsList() {
		return errors.New("must be a list")
	}
	for i, c := range calls.AsList().Items {
		if !c.IsDict() {
			return fmt.Errorf("[%d] is not an object", i)
		}
		fn, ok := c.AsDict().Get("function")
		if !ok || !fn.IsDict() {
			return fmt.Errorf("[%d].function must be an object", i)
		}
		args, _ := fn.AsDict().Get("arguments")
		if !args.IsTruthy() {
			fn.AsDict().Set("arguments", jinja.NewDict())
			continue
		}
		if !args.IsString() {
			continue
		}
		v, err := jsonValue([]byte(args.AsString()))
		if err != nil {
			return fmt.Errorf("[%d].function.arguments is not JSON: %w", i, err)
		}
		fn.AsDict().Set("arguments", v)
	}
	return nil
}

// dumpTools is [tool.model_dump() for tool in request.tools]: type first,
// then function with name, description and parameters first (null when
// absent), then any other fields in the order given.
func dumpTools(tools jinja.Value) (jinja.Value, error) {
	if !tools.IsList() {
		return tools, errors.New("tools must be a list")
	}
	out := make([]jinja.Value, 0, tools.AsList().Len())
	for i, t := range tools.AsList().Items {
		if !t.IsDict() {
			return tools, fmt.Errorf("tools[%d] is not an object", i)
		}
		fn, ok := t.AsDict().Get("function")
		if !ok || !fn.IsDict() {
			return tools, fmt.Errorf("tools[%d].function must be an object", i)
		}
		if name, ok := fn.AsDict().Get("name"); !ok || !name.IsString() {
			return tools, fmt.Errorf("tools[%d].function.name must be a string", i)
		}
		nt := jinja.NewDict()
		nt.AsDict().Set("type", jinja.NewString("function"))
		nt.AsDict().Set("function", ordered(fn, "name", "description", "parameters"))
		for _, k := range t.AsDict().OrderedKeys() {
			if k != "type" && k != "function" {
				v, _ := t.AsDict().Get(k)
				nt.AsDict().Set(k, v)
			}
		}
		out = append(out, nt)
	}
	return jinja.NewList(out), nil
}

// ordered copies dict d with the given keys first (null when absent), then
// the rest in d's order.
func ordered(d jinja.Value, first ...string) jinja.Value {
	out := jinja.NewDict()
	for _, k := range first {
		v, ok := d.AsDict().Get(k)
		if !ok {
			v = jinja.None()
		}
		out.AsDict().Set(k, v)
	}
	for _, k := range d.AsDict().OrderedKeys() {
		if _, ok := out.AsDict().Get(k); !ok {
			v, _ := d.AsDict().Get(k)
			out.AsDict().Set(k, v)
		}
	}
	return out
}
