package vllmsim

import (
	"errors"
	"math"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/ardanlabs/jinja"
)

// transformers gives chat templates a tojson of its own: Python's
// json.dumps with ensure_ascii=False, keys in insertion order, indent and
// separators as asked. ardanlabs/jinja v1.8.0's tojson sorts keys and
// escapes <, > and & when asked to indent (Llama 3 indents its tools), and
// the releases that fix it need a newer Go than this module's. So the
// engine compiles templates with their tojson filters renamed (pyFilter),
// and passes its own under that name: ardanlabs/jinja takes a filter it has
// no builtin for from the render's variables.

// pyFilter is the name tojson filters are renamed to.
const pyFilter = "py_tojson"

// tojsonFilter matches a use of the tojson filter.
var tojsonFilter = regexp.MustCompile(`\|\s*tojson\b`)

// withPyToJSON renames src's tojson filters to pyFilter.
func withPyToJSON(src string) string { return tojsonFilter.ReplaceAllString(src, "| "+pyFilter) }

// pyToJSON is transformers' tojson(x, ensure_ascii=False, indent=None,
// separators=None, sort_keys=False); sort_keys is not supported, as no
// template of the simulator's sets it.
var pyToJSON = jinja.NewCallable("tojson", func(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.Undefined(), errors.New("tojson: no value")
	}
	arg := func(i int, name string) jinja.Value {
		if v, ok := kwargs[name]; ok {
			return v
		}
		if i < len(args) {
			return args[i]
		}
		return jinja.None()
	}
	if v := arg(1, "ensure_ascii"); v.IsTruthy() {
		return jinja.Undefined(), errors.New("tojson: ensure_ascii is not supported")
	}
	if v := arg(4, "sort_keys"); v.IsTruthy() {
		return jinja.Undefined(), errors.New("tojson: sort_keys is not supported")
	}
	e := pyEncoder{item: ", ", key: ": "}
	if v := arg(2, "indent"); !v.IsNone() && !v.IsUndefined() {
		switch {
		case v.IsString():
			e.indent = v.AsString()
		case v.IsInt():
			e.indent = strings.Repeat(" ", int(max(0, v.AsInt())))
		default:
			return jinja.Undefined(), errors.New("tojson: indent must be an integer or a string")
		}
		e.indented, e.item = true, ","
	}
	if v := arg(3, "separators"); !v.IsNone() && !v.IsUndefined() {
		if !v.IsList() || v.AsList().Len() != 2 || !v.AsList().Items[0].IsString() || !v.AsList().Items[1].IsString() {
			return jinja.Undefined(), errors.New("tojson: separators must be two strings")
		}
		e.item, e.key = v.AsList().Items[0].AsString(), v.AsList().Items[1].AsString()
	}
	if err := e.value(args[0], 0); err != nil {
		return jinja.Undefined(), err
	}
	return jinja.NewString(e.b.String()), nil
})

// pyEncoder prints values as Python's json.dumps does.
type pyEncoder struct {
	b         strings.Builder
	item, key string
	indent    string
	indented  bool
}

func (e *pyEncoder) newline(depth int) {
	if e.indented {
		e.b.WriteByte('\n')
		for range depth {
			e.b.WriteString(e.indent)
		}
	}
}

func (e *pyEncoder) value(v jinja.Value, depth int) error {
	switch {
	case v.IsNone() || v.IsUndefined():
		e.b.WriteString("null")
	case v.IsBool():
		e.b.WriteString(strconv.FormatBool(v.AsBool()))
	case v.IsInt():
		e.b.WriteString(strconv.FormatInt(v.AsInt(), 10))
	case v.IsFloat():
		e.b.WriteString(pyFloat(v.AsFloat()))
	case v.IsString():
		e.str(v.AsString())
	case v.IsList():
		items := v.AsList().Items
		if len(items) == 0 {
			e.b.WriteString("[]")
			return nil
		}
		e.b.WriteByte('[')
		for i, x := range items {
			if i > 0 {
				e.b.WriteString(e.item)
			}
			e.newline(depth + 1)
			if err := e.value(x, depth+1); err != nil {
				return err
			}
		}
		e.newline(depth)
		e.b.WriteByte(']')
	case v.IsDict():
		d := v.AsDict()
		keys := d.OrderedKeys()
		if len(keys) == 0 {
			e.b.WriteString("{}")
			return nil
		}
		e.b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				e.b.WriteString(e.item)
			}
			e.newline(depth + 1)
			e.str(k)
			e.b.WriteString(e.key)
			x, _ := d.Get(k)
			if err := e.value(x, depth+1); err != nil {
				return err
			}
		}
		e.newline(depth)
		e.b.WriteByte('}')
	default:
		return errors.New("tojson: cannot encode a callable")
	}
	return nil
}

// str quotes s as json.dumps(ensure_ascii=False) does: only the quote, the
// backslash and control characters are escaped.
func (e *pyEncoder) str(s string) {
	const hex = "0123456789abcdef"
	e.b.WriteByte('"')
	for i := 0; i < len(s); {
		c := s[i]
		if c >= utf8.RuneSelf {
			r, n := utf8.DecodeRuneInString(s[i:])
			e.b.WriteRune(r)
			i += n
			continue
		}
		switch c {
		case '"':
			e.b.WriteString(`\"`)
		case '\\':
			e.b.WriteString(`\\`)
		case '\n':
			e.b.WriteString(`\n`)
		case '\r':
			e.b.WriteString(`\r`)
		case '\t':
			e.b.WriteString(`\t`)
		case '\b':
			e.b.WriteString(`\b`)
		case '\f':
			e.b.WriteString(`\f`)
		default:
			if c < 0x20 {
				e.b.WriteString(`\u00`)
				e.b.WriteByte(hex[c>>4])
				e.b.WriteByte(hex[c&15])
			} else {
				e.b.WriteByte(c)
			}
		}
		i++
	}
	e.b.WriteByte('"')
}

// pyFloat prints f as Python's float repr: the shortest digits that round
// trip, positional from 1e-4 up to 1e16 and with ".0" when integral,
// scientific outside that range.
func pyFloat(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	if a := math.Abs(f); a != 0 && (a < 1e-4 || a >= 1e16) {
		s := strconv.FormatFloat(f, 'e', -1, 64)
		// Go writes e-05 and e+16 as Python does; only a lone "e+0"
		// style needs no change, so the output stands.
		return s
	}
	s := strconv.FormatFloat(f, 'f', -1, 64)
	if !strings.ContainsAny(s, ".") {
		s += ".0"
	}
	return s
}
