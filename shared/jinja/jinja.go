// Package jinja renders chat templates: the subset of Jinja2 that
// HuggingFace chat templates are written in, evaluated as transformers
// evaluates them (an immutable sandbox with trim_blocks, lstrip_blocks and
// loop controls; tojson as Python's json.dumps with ensure_ascii=False;
// raise_exception and strftime_now), so that a render is byte for byte the
// engine's.
//
// It is the general path for templates kvroute has no fast renderer for.
// It links no fmt, so it runs in the Wasm filter. What it does not support
// (template inheritance, includes, call blocks, recursive loops) fails when
// the template is parsed; a filter or test it has not fails when parsed or,
// inside an if, when reached, as in Jinja2. Never a silently different
// render.
package jinja

import (
	"strconv"
	"time"
)

// Template is a parsed template, safe for concurrent renders.
type Template struct {
	body []node
}

// Error is a template that cannot be parsed or a render that failed: a
// raise_exception, a type error, an undefined value used, a budget spent.
type Error struct {
	Line int // where in the template, when known
	Msg  string
}

func (e *Error) Error() string {
	if e.Line > 0 {
		return "jinja: line " + strconv.Itoa(e.Line) + ": " + e.Msg
	}
	return "jinja: " + e.Msg
}

func errors(msg string) error          { return &Error{Msg: msg} }
func errAt(line int, msg string) error { return &Error{Line: line, Msg: msg} }

// Parse parses a template's source.
func Parse(src string) (*Template, error) {
	toks, err := lex(src)
	if err != nil {
		return nil, err
	}
	p := &parser{toks: toks}
	body, _, err := p.body()
	if err != nil {
		return nil, err
	}
	return &Template{body: body}, nil
}

// LoopsOver reports whether some for loop of the template iterates over a
// value's field (x.field or x['field']), filters aside: vLLM passes a
// message's content as parts to templates that loop over "content".
func (t *Template) LoopsOver(field string) bool {
	var walk func([]node) bool
	walk = func(nodes []node) bool {
		for _, n := range nodes {
			switch n := n.(type) {
			case *forNode:
				it := n.iter
				for {
					f, ok := it.(*filterExpr)
					if !ok {
						break
					}
					it = f.x
				}
				switch x := it.(type) {
				case *attrExpr:
					if x.name == field {
						return true
					}
				case *itemExpr:
					if l, ok := x.key.(*literal); ok && l.v == Value(field) {
						return true
					}
				}
				if walk(n.body) || walk(n.els) {
					return true
				}
			case *ifNode:
				for _, b := range n.bodies {
					if walk(b) {
						return true
					}
				}
				if walk(n.els) {
					return true
				}
			case *macroNode:
				if walk(n.body) {
					return true
				}
			case *setNode:
				if walk(n.body) {
					return true
				}
			case *filterNode:
				if walk(n.body) {
					return true
				}
			}
		}
		return false
	}
	return walk(t.body)
}

// Options bound and feed a render.
type Options struct {
	// Now is the clock strftime_now reads (transformers: the engine
	// process's local time). Nil: time.Now in UTC.
	Now func() time.Time
	// MaxSteps bounds the statements and loop iterations a render may take,
	// MaxOutput the bytes it may write; zero takes the defaults (10 million,
	// 64 MiB).
	MaxSteps, MaxOutput int
}

func (o *Options) maxSteps() int {
	if o.MaxSteps > 0 {
		return o.MaxSteps
	}
	return 10_000_000
}

func (o *Options) maxOutput() int {
	if o.MaxOutput > 0 {
		return o.MaxOutput
	}
	return 64 << 20
}

// Render appends the template's output for the variables vars to dst.
func (t *Template) Render(dst []byte, vars *Dict, opts *Options) (out []byte, err error) {
	if opts == nil {
		opts = &Options{}
	}
	root := &scope{}
	if vars != nil {
		for i, k := range vars.keys {
			if name, ok := k.(string); ok {
				root.names = append(root.names, name)
				root.vals = append(root.vals, vars.vals[i])
			}
		}
	}
	r := &renderer{root: root, out: dst, opts: opts}
	defer func() {
		// A bug here must cost a render, not the worker's VM.
		if p := recover(); p != nil {
			out, err = dst, errors("internal error rendering the template")
		}
	}()
	if _, err := r.exec(t.body, root); err != nil {
		if e, ok := err.(*Error); ok && e.Line == 0 {
			e.Line = r.line
		}
		return dst, err
	}
	return r.out, nil
}

func (r *renderer) clock() time.Time {
	if r.opts.Now != nil {
		return r.opts.Now()
	}
	return time.Now().UTC()
}
