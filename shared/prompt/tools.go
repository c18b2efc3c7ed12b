package prompt

import "unicode/utf8"

// member is one member of an object to print: a key in the body, or a
// literal key the normalisation adds; val is its value in the body, absent
// (ok false) for null.
type member struct {
	lit string
	key str
	val raw
}

func (r *Renderer) appendKey(dst []byte, m *member) []byte {
	if m.lit != "" {
		return append(append(append(dst, '"'), m.lit...), '"')
	}
	return appendPyString(dst, r.s.b[m.key.off:m.key.end])
}

func (r *Renderer) appendVal(dst []byte, v raw, indent, level int) ([]byte, error) {
	if !v.ok {
		return append(dst, "null"...), nil
	}
	sub := scanner{b: r.s.b[:v.end], pos: int(v.off)}
	return appendPyJSON(dst, &sub, indent, level, level+2)
}

// sub returns a scanner over one value of the body.
func (r *Renderer) sub(v raw) *scanner {
	return &scanner{b: r.s.b[:v.end], pos: int(v.off)}
}

// toolsSet reports whether the request has tools (not null), which the
// llama3 and mistral templates test with "tools is not none".
func (r *Renderer) toolsSet() bool { return r.req.tools.ok }

// eachTool calls f with each element of tools.
func (r *Renderer) eachTool(f func(i int, tool raw) error) error {
	s := r.sub(r.req.tools)
	if s.ws() != '[' {
		return malformed("tools is not an array")
	}
	i := 0
	return s.array(1, func() error {
		s.ws()
		v := raw{off: int32(s.pos), ok: true}
		if err := s.skip(2); err != nil {
			return err
		}
		v.end = int32(s.pos)
		err := f(i, v)
		i++
		return err
	})
}

// countTools returns the number of tools (0 when absent).
func (r *Renderer) countTools() (int, error) {
	if !r.toolsSet() {
		return 0, nil
	}
	n := 0
	err := r.eachTool(func(int, raw) error { n++; return nil })
	return n, err
}

// normalize lays out tool as vLLM's model_dump does, in r.kv: the function's
// members from fn0 (name, description, parameters, then the rest as given),
// and the tool's members other than type and function from ext0.
func (r *Renderer) normalize(tool raw) (fn0, ext0 int, err error) {
	s := r.sub(tool)
	if s.ws() != '{' {
		return 0, 0, malformed("a tool is not an object")
	}
	r.kv = r.kv[:0]
	var fn raw
	err = s.object(2, func(key str) error {
		switch {
		case s.equalStr(key, "type"):
			if s.ws() != '"' {
				return malformed("a tool's type is not \"function\"")
			}
			v, err := s.str()
			if err == nil && !s.equalStr(v, "function") {
				return malformed("a tool's type is not \"function\"")
			}
			return err
		case s.equalStr(key, "function"):
			fn = r.valueAt(s, 3)
			return r.err
		}
		r.kv = append(r.kv, member{key: key, val: r.valueAt(s, 3)})
		return r.err
	})
	if err != nil {
		return 0, 0, err
	}
	if !fn.ok || r.s.b[fn.off] != '{' {
		return 0, 0, malformed("a tool has no function object")
	}
	// Function members go after the tool's extras collected so far.
	fn0 = len(r.kv)
	r.kv = append(r.kv, member{lit: "name"}, member{lit: "description"}, member{lit: "parameters"})
	haveName := false
	fs := r.sub(fn)
	err = fs.object(3, func(key str) error {
		var slot *member
		switch {
		case fs.equalStr(key, "name"):
			if fs.ws() != '"' {
				return malformed("a tool's function name is not a string")
			}
			haveName, slot = true, &r.kv[fn0]
		case fs.equalStr(key, "description"):
			if c := fs.ws(); c != '"' && c != 'n' {
				return malformed("a tool's description is not a string")
			}
			slot = &r.kv[fn0+1]
		case fs.equalStr(key, "parameters"):
			if c := fs.ws(); c != '{' && c != 'n' {
				return malformed("a tool's parameters are not an object")
			}
			slot = &r.kv[fn0+2]
		default:
			r.kv = append(r.kv, member{key: key, val: r.valueAt(fs, 4)})
			return r.err
		}
		slot.val = r.valueAt(fs, 4)
		return r.err
	})
	if err == nil && !haveName {
		err = malformed("a tool's function has no name")
	}
	// Put the tool's extras after the function's members.
	ext0 = len(r.kv)
	r.kv = append(r.kv, r.kv[:fn0]...)
	return fn0, ext0, err
}

// valueAt skips the value at s and returns its extent, null as absent; a
// failure is left in r.err.
func (r *Renderer) valueAt(s *scanner, depth int) raw {
	c := s.ws()
	v := raw{off: int32(s.pos), ok: c != 'n'}
	r.err = s.skip(depth)
	v.end = int32(s.pos)
	return v
}

// appendTool appends tojson(tool) of the normalised tool.
func (r *Renderer) appendTool(dst []byte, tool raw, indent int) ([]byte, error) {
	fn0, ext0, err := r.normalize(tool)
	if err != nil {
		return dst, err
	}
	dst = append(dst, '{')
	dst = pySeparator(dst, 0, indent, 1)
	dst = append(dst, `"type": "function"`...)
	dst = pySeparator(dst, 1, indent, 1)
	dst = append(dst, `"function": {`...)
	for i := fn0; i < ext0; i++ {
		dst = pySeparator(dst, i-fn0, indent, 2)
		dst = r.appendKey(dst, &r.kv[i])
		dst = append(dst, ": "...)
		if dst, err = r.appendVal(dst, r.kv[i].val, indent, 2); err != nil {
			return dst, err
		}
	}
	dst = pyClose(dst, ext0-fn0, '}', indent, 1)
	for i := ext0; i < len(r.kv); i++ {
		dst = pySeparator(dst, 2+i-ext0, indent, 1)
		dst = r.appendKey(dst, &r.kv[i])
		dst = append(dst, ": "...)
		if dst, err = r.appendVal(dst, r.kv[i].val, indent, 1); err != nil {
			return dst, err
		}
	}
	return pyClose(dst, 2, '}', indent, 0), nil
}

// call is one entry of an assistant's tool_calls.
type call struct {
	fn    raw // the function object
	name  str
	args  raw // absent when missing or null
	id    str
	idSet bool
}

// eachCall calls f with each of m's tool calls. vLLM hands templates the
// request's tool calls, so each needs a function object with a name.
func (r *Renderer) eachCall(m *message, f func(i int, c call) error) error {
	s := r.sub(m.calls)
	if s.ws() != '[' {
		return malformed("tool_calls is not an array")
	}
	i := 0
	return s.array(3, func() error {
		var c call
		if s.ws() != '{' {
			return malformed("a tool call is not an object")
		}
		err := s.object(4, func(key str) error {
			switch {
			case s.equalStr(key, "function"):
				c.fn = r.valueAt(s, 5)
				return r.err
			case s.equalStr(key, "id"):
				c.idSet = true
				if s.ws() == '"' {
					v, err := s.str()
					c.id = v
					return err
				}
			}
			return s.skip(5)
		})
		if err != nil {
			return err
		}
		if !c.fn.ok || r.s.b[c.fn.off] != '{' {
			return malformed("a tool call has no function object")
		}
		fs := r.sub(c.fn)
		err = fs.object(5, func(key str) error {
			switch {
			case fs.equalStr(key, "name"):
				if fs.ws() == '"' {
					v, err := fs.str()
					c.name = v
					return err
				}
			case fs.equalStr(key, "arguments"):
				c.args = r.valueAt(fs, 6)
				return r.err
			}
			return fs.skip(6)
		})
		if err != nil {
			return err
		}
		if !c.name.ok {
			return malformed("a tool call's function has no name")
		}
		err = f(i, c)
		i++
		return err
	})
}

// countCalls returns how many tool calls m carries (0 when none).
func (r *Renderer) countCalls(m *message) (int, error) {
	if m.role != roleAssistant || !m.calls.ok {
		return 0, nil
	}
	n := 0
	err := r.eachCall(m, func(int, call) error { n++; return nil })
	return n, err
}

// appendArgs appends tojson of a tool call's arguments as vLLM hands them to
// the template: a JSON string parsed, a missing, null or empty value as {}.
func (r *Renderer) appendArgs(dst []byte, args raw) ([]byte, error) {
	if !args.ok {
		return append(dst, "{}"...), nil
	}
	s := r.sub(args)
	switch s.ws() {
	case '"':
		v, _ := s.str()
		r.tmp = s.appendStr(r.tmp[:0], v)
		doc := scanner{b: r.tmp}
		if doc.atEnd() {
			return append(dst, "{}"...), nil
		}
		dst, err := appendPyJSON(dst, &doc, 0, 0, 0)
		if err != nil || !doc.atEnd() {
			return dst, malformed("a tool call's arguments are not JSON")
		}
		return dst, nil
	case '{', '[':
		if args.end-args.off <= 2 || isEmptyContainer(s) {
			return append(dst, "{}"...), nil
		}
		return appendPyJSON(dst, s, 0, 0, 0)
	}
	return dst, malformed("a tool call's arguments are neither a string nor an object")
}

func isEmptyContainer(s *scanner) bool {
	t := *s
	t.pos++
	c := t.ws()
	return c == '}' || c == ']'
}

// runeCount is the length Jinja's length filter gives a string.
func (r *Renderer) runeCount(v str) int {
	if !v.esc {
		return utf8.RuneCount(r.s.b[v.off:v.end])
	}
	var buf [64]byte
	return utf8.RuneCount(r.s.appendStr(buf[:0], v))
}
