package prompt

import (
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/kvroute/kvroute/shared/jinja"
)

// harmony renders a chat request as vLLM renders it for gpt-oss: not with
// the model's Jinja template but through openai-harmony
// (vllm/entrypoints/openai/parser/harmony_utils.py). vLLM builds a system
// message (harmony's defaults, the reasoning_effort, today's date), a
// developer message from a leading system or developer message's text and
// the tools, then one harmony message per chat message: reasoning as an
// analysis message (dropped before the last final answer), an answer as a
// final one, each tool call as a commentary message to functions.NAME and
// each tool result as one from it; later system and developer messages
// become developer instructions. harmony.json pins every case to the real
// encoder.
func (r *Renderer) harmony(dst []byte) ([]byte, error) {
	msgs := r.msgs
	if r.reasoning {
		return dst, unsupported("reasoning in a Messages or Responses request, which harmony prints")
	}
	effort := "medium"
	if r.req.effortSet {
		if r.req.effortBad {
			return dst, malformed("reasoning_effort is not a string")
		}
		r.tmp = r.s.appendStr(r.tmp[:0], r.req.effort)
		switch e := string(r.tmp); e {
		case "low", "medium", "high":
			effort = e
		default:
			return dst, rejected("harmony has no reasoning_effort " + strconv.Quote(e))
		}
	}
	tools, err := r.harmonyTools()
	if err != nil {
		return dst, err
	}
	dst = append(dst, "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: "...)
	dst = appendISODate(dst, r.now())
	dst = append(dst, "\n\nReasoning: "...)
	dst = append(dst, effort...)
	dst = append(dst, "\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message."...)
	if len(tools) > 0 {
		dst = append(dst, "\nCalls to these tools must go to the commentary channel: 'functions'."...)
	}
	dst = append(dst, "<|end|>"...)

	first := 0
	if len(msgs) > 0 && (msgs[0].role == roleSystem || msgs[0].role == roleDeveloper) {
		first = 1
		start := len(dst)
		dst = append(dst, "<|start|>developer<|message|># Instructions\n\n"...)
		text, ok := r.harmonyText(dst, &msgs[0])
		if (!ok || len(text) == len(dst)) && len(tools) == 0 {
			// No instructions and no tools: no developer message.
			dst = dst[:start]
		} else {
			if !ok {
				text = append(dst[:start], "<|start|>developer<|message|>"...)
			}
			dst = text
			if len(tools) > 0 {
				if ok {
					dst = append(dst, "\n\n"...)
				}
				dst = append(dst, tools...)
			}
			dst = append(dst, "<|end|>"...)
		}
	} else if len(tools) > 0 {
		dst = append(dst, "<|start|>developer<|message|>"...)
		dst = append(append(dst, tools...), "<|end|>"...)
	}
	msgs = msgs[first:]

	// Reasoning up to the last final answer is dropped, as vLLM's
	// auto_drop_analysis_messages drops it.
	lastFinal, err := r.harmonyCalls(msgs)
	if err != nil {
		return dst, err
	}
	for i := range msgs {
		m := &msgs[i]
		switch {
		case m.role == roleAssistant && r.withCalls[i]:
			start := len(dst)
			dst = append(dst, "<|start|>assistant<|channel|>commentary<|message|>"...)
			if text, ok := r.harmonyText(dst, m); ok && len(text) > len(dst) {
				dst = append(text, "<|end|>"...)
			} else {
				dst = dst[:start]
			}
			if i > lastFinal {
				dst = r.harmonyAnalysis(dst, m)
			}
			err := r.eachCall(m, func(_ int, c call) error {
				dst = append(dst, "<|start|>assistant to=functions."...)
				dst = r.s.appendStr(dst, c.name)
				dst = append(dst, "<|channel|>commentary json<|message|>"...)
				if c.args.ok {
					s := r.sub(c.args)
					if s.ws() != '"' {
						if r.converted {
							// vLLM serialises a tool_use's input itself.
							return unsupported("tool call arguments converted from a Messages or Responses request")
						}
						return malformed("a tool call's arguments are not a string")
					}
					v, err := s.str()
					if err != nil {
						return err
					}
					dst = s.appendStr(dst, v)
				}
				dst = append(dst, "<|call|>"...)
				return nil
			})
			if err != nil {
				return dst, err
			}
		case m.role == roleTool:
			dst = append(dst, "<|start|>functions."...)
			if m.callID.ok {
				if name, ok := r.callNames[r.idKey(m.callID)]; ok {
					dst = r.s.appendStr(dst, name)
				}
			}
			dst = append(dst, " to=assistant<|channel|>commentary<|message|>"...)
			if text, ok := r.harmonyText(dst, m); ok {
				dst = text
			}
			dst = append(dst, "<|end|>"...)
		case m.role == roleAssistant:
			if i > lastFinal {
				dst = r.harmonyAnalysis(dst, m)
			}
			if r.harmonyFinal(m, i) {
				dst = append(dst, "<|start|>assistant<|channel|>final<|message|>"...)
				if dst, err = r.harmonyContents(dst, m); err != nil {
					return dst, err
				}
				dst = append(dst, "<|end|>"...)
			} else if _, err = r.harmonyContents(r.scratch[:0], m); err != nil {
				return dst, err
			}
		case m.role == roleSystem || m.role == roleDeveloper:
			if _, err = r.harmonyContents(r.scratch[:0], m); err != nil {
				return dst, err
			}
			start := len(dst)
			dst = append(dst, "<|start|>developer<|message|># Instructions\n\n"...)
			if text, ok := r.harmonyText(dst, m); ok {
				dst = append(text, "<|end|>"...)
			} else {
				dst = dst[:start]
			}
		case m.role == roleUser:
			dst = append(dst, "<|start|>user<|message|>"...)
			if dst, err = r.harmonyContents(dst, m); err != nil {
				return dst, err
			}
			dst = append(dst, "<|end|>"...)
		default:
			return dst, rejected("harmony has no role " + strconv.Quote(string(r.s.appendStr(r.tmp[:0], m.roleName))))
		}
	}
	return append(dst, "<|start|>assistant"...), nil
}

// harmonyText appends the text vLLM takes from m's content for
// instructions, tool results and tool-call commentary: a string as is,
// else the text of the parts that have one, joined; ok is false when
// there is none (null, or parts without text).
func (r *Renderer) harmonyText(dst []byte, m *message) ([]byte, bool) {
	switch m.kind {
	case contentString:
		return r.s.appendStr(dst, m.text), true
	case contentParts:
		ok := false
		for i := m.p0; i < m.p1; i++ {
			if p := &r.parts[i]; !p.media && !p.refusal {
				dst, ok = r.s.appendStr(dst, p.text), true
			}
		}
		return dst, ok
	}
	return dst, false
}

// harmonyContents appends m's content as harmony text contents, one per
// part: a text part's text, "" for any other. vLLM reads each part as an
// object, and fails on a bare string.
func (r *Renderer) harmonyContents(dst []byte, m *message) ([]byte, error) {
	switch m.kind {
	case contentString:
		return r.s.appendStr(dst, m.text), nil
	case contentParts:
		for i := m.p0; i < m.p1; i++ {
			switch p := &r.parts[i]; {
			case p.bare:
				return dst, rejected("a content part that is a bare string, which vLLM's harmony conversion reads as an object")
			case !p.media && !p.refusal:
				dst = r.s.appendStr(dst, p.text)
			}
		}
	}
	return dst, nil
}

// harmonyFinal reports whether msgs[i], m, becomes a final answer: an
// assistant message without tool calls (an empty array of them counts as
// none, any other value as some) whose content's first text is not empty.
func (r *Renderer) harmonyFinal(m *message, i int) bool {
	if m.role != roleAssistant || r.withCalls[i] || (m.calls.ok && r.s.b[m.calls.off] != '[') {
		return false
	}
	switch m.kind {
	case contentString:
		return m.text.end > m.text.off
	case contentParts:
		if m.p1 == m.p0 {
			return false
		}
		p := &r.parts[m.p0]
		return !p.media && !p.refusal && p.text.end > p.text.off
	}
	return false
}

// harmonyAnalysis appends m's reasoning as an analysis message.
func (r *Renderer) harmonyAnalysis(dst []byte, m *message) []byte {
	if !m.reasoning.ok || m.reasoning.end == m.reasoning.off {
		return dst
	}
	dst = append(dst, "<|start|>assistant<|channel|>analysis<|message|>"...)
	return append(r.s.appendStr(dst, m.reasoning), "<|end|>"...)
}

// harmonyCalls walks the tool calls of msgs once: r.withCalls says which
// messages are assistant messages with some, r.callNames maps each call
// id (by idKey) to its function name, the last call's with that id, as
// vLLM looks up the function a tool result answers. It returns the index
// of the last final answer, -1 for none.
func (r *Renderer) harmonyCalls(msgs []message) (int, error) {
	r.withCalls = slices.Grow(r.withCalls[:0], len(msgs))[:len(msgs)]
	if r.callNames == nil {
		r.callNames = make(map[uint64]str)
	}
	clear(r.callNames)
	for i := range msgs {
		m := &msgs[i]
		r.withCalls[i] = false
		if m.role != roleAssistant || !m.calls.ok || r.s.b[m.calls.off] != '[' {
			continue
		}
		err := r.eachCall(m, func(_ int, c call) error {
			r.withCalls[i] = true
			if c.id.ok {
				r.callNames[r.idKey(c.id)] = c.name
			}
			return nil
		})
		if err != nil {
			return -1, err
		}
	}
	last := -1
	for i := range msgs {
		if r.harmonyFinal(&msgs[i], i) {
			last = i
		}
	}
	return last, nil
}

// idKey is a tool call id's key in r.callNames: XXH64 of its decoded text.
func (r *Renderer) idKey(id str) uint64 {
	r.tmp = r.s.appendStr(r.tmp[:0], id)
	return xxhash.Sum64(r.tmp)
}

// harmonyTools returns the developer message's tools section ("" without
// tools): each function's description as comments and its parameters'
// JSON schema as a TypeScript type, as openai-harmony writes them.
func (r *Renderer) harmonyTools() ([]byte, error) {
	if !r.toolsSet() {
		return nil, nil
	}
	var b []byte
	err := r.eachTool(func(i int, tool raw) error {
		if i == 0 {
			b = append(b, "# Tools\n\n## functions\n\nnamespace functions {\n\n"...)
		}
		v, err := r.toolValue(tool)
		if err != nil {
			return err
		}
		fv, _ := v.(*jinja.Dict).Get("function")
		fn := fv.(*jinja.Dict)
		name, _ := fn.Get("name")
		ns, ok := name.(string)
		if !ok {
			return malformed("a tool's function name is not a string")
		}
		desc, _ := fn.Get("description")
		if d, ok := desc.(string); ok {
			for _, line := range rustLines(d) {
				b = append(append(append(b, "// "...), line...), '\n')
			}
		} else if desc != nil {
			return malformed("a tool's description is not a string")
		}
		b = append(append(b, "type "...), ns...)
		params, _ := fn.Get("parameters")
		if params == nil {
			b = append(b, " = () => any;\n\n"...)
			return nil
		}
		if _, ok := params.(*jinja.Dict); !ok {
			return malformed("a tool's parameters are not an object")
		}
		b = append(b, " = (_: "...)
		b = appendTS(b, params, "")
		b = append(b, ") => any;\n\n"...)
		return nil
	})
	if err != nil || len(b) == 0 {
		return nil, err
	}
	return append(b, "} // namespace functions"...), nil
}

// rustLines splits s as Rust's str::lines: at "\n" or "\r\n", no line
// after a final one; a last line without "\n" keeps a trailing "\r".
func rustLines(s string) []string {
	if s == "" {
		return nil
	}
	ended := strings.HasSuffix(s, "\n")
	lines := strings.Split(strings.TrimSuffix(s, "\n"), "\n")
	for i, l := range lines {
		if i < len(lines)-1 || ended {
			lines[i] = strings.TrimSuffix(l, "\r")
		}
	}
	return lines
}

// appendTS appends a JSON schema as openai-harmony's
// json_schema_to_typescript writes it.
func appendTS(dst []byte, schema jinja.Value, indent string) []byte {
	d, ok := schema.(*jinja.Dict)
	if !ok {
		return append(dst, "any"...)
	}
	if variants, ok := get(d, "oneOf").(*jinja.List); ok {
		for _, v := range variants.Items {
			dst = append(append(append(dst, '\n'), indent...), " | "...)
			dst = appendNullable(dst, v, indent+"   ")
			var comments []string
			if desc, ok := get(v, "description").(string); ok {
				comments = append(comments, desc)
			}
			if def, ok := getOK(v, "default"); ok {
				if s, isStr := def.(string); isStr && !isEnum(v) {
					comments = append(comments, `default: "`+s+`"`)
				} else {
					comments = append(comments, "default: "+string(appendSerdeJSON(nil, def)))
				}
			}
			if len(comments) > 0 {
				dst = append(append(dst, " // "...), strings.Join(comments, " ")...)
			}
		}
		return dst
	}
	if types, ok := get(d, "type").(*jinja.List); ok {
		out, n := appendUnion(dst, types, func(dst []byte, s string) []byte {
			if s == "integer" {
				s = "number"
			}
			return append(dst, s...)
		})
		if n > 0 {
			return out
		}
	}
	typ, ok := get(d, "type").(string)
	if !ok {
		return append(dst, "any"...)
	}
	switch typ {
	case "object":
		return appendTSObject(dst, d, indent)
	case "string":
		if enum, ok := get(d, "enum").(*jinja.List); ok {
			out, n := appendUnion(dst, enum, func(dst []byte, s string) []byte {
				return append(append(append(dst, '"'), s...), '"')
			})
			if n > 0 {
				return out
			}
		}
		return append(dst, "string"...)
	case "number", "integer":
		return append(dst, "number"...)
	case "boolean":
		return append(dst, "boolean"...)
	case "array":
		if items, ok := getOK(d, "items"); ok {
			return append(appendTS(dst, items, indent), "[]"...)
		}
		return append(dst, "Array<any>"...)
	}
	return append(dst, "any"...)
}

// appendUnion appends the strings of l, each as each writes it, joined
// with " | "; n counts them (other items are left out).
func appendUnion(dst []byte, l *jinja.List, each func(dst []byte, s string) []byte) (out []byte, n int) {
	for _, v := range l.Items {
		if s, ok := v.(string); ok {
			if n > 0 {
				dst = append(dst, " | "...)
			}
			dst = each(dst, s)
			n++
		}
	}
	return dst, n
}

// appendTSObject writes an object schema: its properties one per line,
// their titles, descriptions, examples and defaults as comments, "?" on
// those not required, oneOf properties as a list of variants.
func appendTSObject(dst []byte, d *jinja.Dict, indent string) []byte {
	if desc, ok := get(d, "description").(string); ok {
		dst = append(append(append(append(dst, indent...), "// "...), desc...), '\n')
	}
	dst = append(dst, "{\n"...)
	props, _ := get(d, "properties").(*jinja.Dict)
	required := map[string]bool{}
	if req, ok := get(d, "required").(*jinja.List); ok {
		for _, k := range req.Items {
			if s, ok := k.(string); ok {
				required[s] = true
			}
		}
	}
	comment := func(text string) {
		dst = append(append(append(append(dst, indent...), "// "...), text...), '\n')
	}
	if props != nil {
		props.Each(func(key string, val jinja.Value) {
			optional := ""
			if !required[key] {
				optional = "?"
			}
			if title, ok := get(val, "title").(string); ok {
				comment(title)
				dst = append(append(dst, indent...), "//\n"...)
			}
			_, hasOneOf := getOK(val, "oneOf")
			desc, hasDesc := get(val, "description").(string)
			if !hasOneOf && hasDesc {
				comment(desc)
			}
			if ex, ok := get(val, "examples").(*jinja.List); ok && len(ex.Items) > 0 {
				comment("Examples:")
				for _, e := range ex.Items {
					if s, ok := e.(string); ok {
						comment(`- "` + s + `"`)
					}
				}
			}
			if variants, ok := get(val, "oneOf").(*jinja.List); ok {
				skip := false
				if len(variants.Items) > 0 && hasDesc {
					first, ok := get(variants.Items[0], "description").(string)
					skip = ok && first == desc
				}
				above := hasDesc && !skip
				if above {
					comment(desc)
				}
				if def, ok := getOK(val, "default"); ok {
					comment("default: " + defaultComment(def, val))
				}
				dst = append(append(append(append(dst, indent...), key...), optional...), ":\n"...)
				for i, v := range variants.Items {
					dst = append(append(dst, indent...), " | "...)
					dst = appendNullable(dst, v, indent+"   ")
					var comments []string
					if vd, ok := get(v, "description").(string); ok && !(i == 0 && above) && !(hasDesc && vd == desc) {
						comments = append(comments, vd)
					}
					if def, ok := getOK(v, "default"); ok {
						comments = append(comments, "default: "+defaultComment(def, v))
					}
					if len(comments) > 0 {
						dst = append(append(dst, " // "...), strings.Join(comments, " ")...)
					}
					dst = append(dst, '\n')
				}
				dst = append(append(dst, indent...), ",\n"...)
				return
			}
			dst = append(append(append(append(dst, indent...), key...), optional...), ": "...)
			dst = append(appendNullable(dst, val, indent+"    "), ',')
			if def, ok := getOK(val, "default"); ok && !hasOneOf {
				dst = append(append(dst, " // default: "...), defaultComment(def, val)...)
			}
			dst = append(dst, '\n')
		})
	}
	return append(append(dst, indent...), '}')
}

// appendNullable appends v's type, with " | null" when it is nullable
// and the type does not already say null.
func appendNullable(dst []byte, v jinja.Value, indent string) []byte {
	start := len(dst)
	dst = appendTS(dst, v, indent)
	if b, _ := get(v, "nullable").(bool); b && !strings.Contains(string(dst[start:]), "null") {
		dst = append(dst, " | null"...)
	}
	return dst
}

// defaultComment is how a property's default is commented: a string
// quoted, unless its schema is an enum, anything else as JSON.
func defaultComment(def, schema jinja.Value) string {
	if s, ok := def.(string); ok {
		if isEnum(schema) {
			return s
		}
		return `"` + s + `"`
	}
	return string(appendSerdeJSON(nil, def))
}

func isEnum(schema jinja.Value) bool {
	l, ok := get(schema, "enum").(*jinja.List)
	return ok && len(l.Items) > 0
}

// get returns v's member key, nil when v is not an object or lacks it.
func get(v jinja.Value, key string) jinja.Value {
	x, _ := getOK(v, key)
	return x
}

func getOK(v jinja.Value, key string) (jinja.Value, bool) {
	if d, ok := v.(*jinja.Dict); ok {
		return d.Get(key)
	}
	return nil, false
}

// appendSerdeJSON appends v as Rust's serde_json prints a value: compact,
// members in their order, strings escaped as Python's json.dumps escapes
// them without ensure_ascii (the same rules), floats as ryu writes them.
func appendSerdeJSON(dst []byte, v jinja.Value) []byte {
	switch x := v.(type) {
	case nil:
		return append(dst, "null"...)
	case bool:
		return strconv.AppendBool(dst, x)
	case int64:
		return strconv.AppendInt(dst, x, 10)
	case float64:
		return appendRyu(dst, x)
	case string:
		return jinja.AppendJSONString(dst, x)
	case *jinja.List:
		dst = append(dst, '[')
		for i, it := range x.Items {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendSerdeJSON(dst, it)
		}
		return append(dst, ']')
	case *jinja.Dict:
		dst = append(dst, '{')
		i := 0
		x.Each(func(k string, it jinja.Value) {
			if i > 0 {
				dst = append(dst, ',')
			}
			i++
			dst = append(jinja.AppendJSONString(dst, k), ':')
			dst = appendSerdeJSON(dst, it)
		})
		return append(dst, '}')
	}
	if digits, ok := jinja.BigInt(v); ok {
		// serde_json keeps an integer within u64; beyond, a float,
		// which its parser may round a last digit differently.
		if _, err := strconv.ParseUint(digits, 10, 64); err == nil {
			return append(dst, digits...)
		}
		f, _ := strconv.ParseFloat(digits, 64)
		return appendRyu(dst, f)
	}
	return append(dst, "null"...)
}

// appendRyu appends f as the ryu crate's format_finite does: the
// shortest digits, in plain notation (with ".0" when whole) when the
// decimal point falls within 16 digits of them, else d.ddde±N.
func appendRyu(dst []byte, f float64) []byte {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return append(dst, "null"...)
	}
	if math.Signbit(f) {
		dst = append(dst, '-')
		f = -f
	}
	if f == 0 {
		return append(dst, "0.0"...)
	}
	e := strconv.AppendFloat(nil, f, 'e', -1, 64) // d.ddde±XX
	mant, exp, _ := strings.Cut(string(e), "e")
	digits := strings.Replace(mant, ".", "", 1)
	x, _ := strconv.Atoi(exp)
	k := x + 1 // where the decimal point goes after the first k digits
	n := len(digits)
	switch {
	case k >= n && k <= 16:
		dst = append(dst, digits...)
		dst = append(dst, strings.Repeat("0", k-n)...)
		return append(dst, ".0"...)
	case k > 0 && k <= 16:
		return append(append(append(dst, digits[:k]...), '.'), digits[k:]...)
	case k > -5 && k <= 0:
		dst = append(append(dst, "0."...), strings.Repeat("0", -k)...)
		return append(dst, digits...)
	}
	dst = append(dst, digits[0])
	if n > 1 {
		dst = append(append(dst, '.'), digits[1:]...)
	}
	return strconv.AppendInt(append(dst, 'e'), int64(k-1), 10)
}

// appendISODate appends t's UTC date as strftime("%Y-%m-%d") prints it.
func appendISODate(dst []byte, t time.Time) []byte {
	y, m, d := t.UTC().Date()
	dst = strconv.AppendInt(dst, int64(y), 10)
	return append(dst, '-', byte('0'+m/10), byte('0'+m%10), '-', byte('0'+d/10), byte('0'+d%10))
}
