package jinja

import (
	"math"
	"strconv"
	"unicode/utf8"
)

// Value is what a template computes with, as Python sees it: nil (None),
// bool, int64, float64, string, *List, *Dict, or a value the template made
// itself (a namespace, a macro, a bound method, Undefined).
type Value = any

// List is a Python list (or tuple).
type List struct {
	Items []Value
	tuple bool
	// generator: what select, reject and map return in Jinja2. It is
	// true however empty, has no length, cannot be printed as JSON, and
	// iterates once.
	generator bool
}

// NewList returns a list of items.
func NewList(items ...Value) *List { return &List{Items: items} }

// Dict is a Python dict, in insertion order. Its keys are strings, or
// numbers, booleans and None when a template's literal makes them.
type Dict struct {
	keys []Value
	vals []Value
}

// NewDict returns an empty dict with room for n keys.
func NewDict(n int) *Dict {
	return &Dict{keys: make([]Value, 0, n), vals: make([]Value, 0, n)}
}

// Set sets key to v; a new key goes last, as in Python.
func (d *Dict) Set(key string, v Value) { d.set(key, v) }

func (d *Dict) set(key, v Value) {
	for i, k := range d.keys {
		if k == key {
			d.vals[i] = v
			return
		}
	}
	d.keys = append(d.keys, key)
	d.vals = append(d.vals, v)
}

// Get returns key's value and whether it is set.
func (d *Dict) Get(key string) (Value, bool) { return d.get(key) }

func (d *Dict) get(key Value) (Value, bool) {
	for i, k := range d.keys {
		if k == key {
			return d.vals[i], true
		}
	}
	return nil, false
}

// Each calls f with each string key and its value, in order.
func (d *Dict) Each(f func(key string, v Value)) {
	for i, k := range d.keys {
		if s, ok := k.(string); ok {
			f(s, d.vals[i])
		}
	}
}

// Truthy reports whether v is true in a condition, as Python's bool(v).
func Truthy(v Value) bool { return truthy(v) }

// Len returns the number of keys.
func (d *Dict) Len() int { return len(d.keys) }

// Undefined is a name or member that does not exist. It prints as nothing,
// iterates as empty and is false; anything else done with it fails, as
// with Jinja2's default Undefined.
type Undefined struct{ name string }

// bigInt is an integer outside int64, as Python's json.loads keeps it:
// its decimal digits. It prints and converts to JSON; arithmetic on it
// fails.
type bigInt string

// BigInt returns the decimal digits of an integer Number kept beyond
// int64, and whether v is one.
func BigInt(v Value) (string, bool) {
	b, ok := v.(bigInt)
	return string(b), ok
}

// Number returns the value Python's json.loads makes of a JSON number's
// text: an int (int64, or digits beyond it) without a fraction or an
// exponent, else a float.
func Number(text string) (Value, error) {
	isInt := true
	for i := 0; i < len(text); i++ {
		if c := text[i]; c == '.' || c == 'e' || c == 'E' {
			isInt = false
			break
		}
	}
	if isInt {
		if i, err := strconv.ParseInt(text, 10, 64); err == nil {
			return i, nil
		}
		if text == "" || (text[0] != '-' && (text[0] < '0' || text[0] > '9')) {
			return nil, errors("bad number " + strconv.Quote(text))
		}
		return bigInt(text), nil
	}
	f, err := strconv.ParseFloat(text, 64)
	if err != nil && f == 0 {
		return nil, errors("bad number " + strconv.Quote(text))
	}
	return f, nil // an overflow is ±Inf, as in Python
}

// markup is a string marked safe (the safe and escape filters): adding a
// plain string to it escapes that string first, as MarkupSafe does.
type markup string

// namespace is what namespace() returns: the one object a template may
// assign attributes of, so that a loop can carry state out.
type namespace struct{ Dict }

type callable func(c *call) (Value, error)

// call is one call of a builtin: its arguments, and the renderer for
// those (filters, tests) that call back into the template.
type call struct {
	r    *renderer
	name string
	args []Value
	kw   []kwValue
}

type kwValue struct {
	name string
	v    Value
}

// plain returns markup as the string it is, for what treats both alike.
func plain(v Value) Value {
	if m, ok := v.(markup); ok {
		return string(m)
	}
	return v
}

func isUndefined(v Value) bool {
	_, ok := v.(Undefined)
	return ok
}

func truthy(v Value) bool {
	switch x := v.(type) {
	case nil, Undefined:
		return false
	case bool:
		return x
	case int64:
		return x != 0
	case float64:
		return x != 0
	case string:
		return x != ""
	case markup:
		return x != ""
	case *List:
		return x.generator || len(x.Items) > 0
	case *Dict:
		return len(x.keys) > 0
	}
	return true
}

func typeName(v Value) string {
	switch v := v.(type) {
	case nil:
		return "NoneType"
	case Undefined:
		return "Undefined"
	case bool:
		return "bool"
	case int64:
		return "int"
	case float64:
		return "float"
	case string:
		return "str"
	case markup:
		return "Markup"
	case bigInt:
		return "int"
	case *List:
		switch {
		case v.tuple:
			return "tuple"
		case v.generator:
			return "generator"
		}
		return "list"
	case *Dict:
		return "dict"
	case *namespace:
		return "Namespace"
	}
	return "function"
}

// number returns v as a float and whether it is a number (bools are
// Python ints).
func number(v Value) (float64, bool) {
	switch x := v.(type) {
	case bool:
		if x {
			return 1, true
		}
		return 0, true
	case int64:
		return float64(x), true
	case float64:
		return x, true
	}
	return 0, false
}

func equal(a, b Value) bool {
	a, b = plain(a), plain(b)
	switch x := a.(type) {
	case nil:
		return b == nil
	case Undefined:
		return isUndefined(b)
	case string:
		y, ok := b.(string)
		return ok && x == y
	case int64:
		if y, ok := b.(int64); ok {
			return x == y
		}
	case *List:
		y, ok := b.(*List)
		if !ok || x.generator || y.generator || len(x.Items) != len(y.Items) {
			return false
		}
		for i := range x.Items {
			if !equal(x.Items[i], y.Items[i]) {
				return false
			}
		}
		return true
	case *Dict:
		y, ok := b.(*Dict)
		if !ok || len(x.keys) != len(y.keys) {
			return false
		}
		for i, k := range x.keys {
			v, ok := y.get(k)
			if !ok || !equal(x.vals[i], v) {
				return false
			}
		}
		return true
	}
	fa, okA := number(a)
	fb, okB := number(b)
	if okA && okB {
		return fa == fb
	}
	if okA || okB {
		return false
	}
	return a == b
}

// less orders a and b as Python's < does, for numbers, strings and lists.
func less(a, b Value) (bool, error) {
	a, b = plain(a), plain(b)
	if x, ok := a.(string); ok {
		if y, ok := b.(string); ok {
			return x < y, nil
		}
	}
	if x, ok := a.(int64); ok {
		if y, ok := b.(int64); ok {
			return x < y, nil
		}
	}
	if fa, ok := number(a); ok {
		if fb, ok := number(b); ok {
			return fa < fb, nil
		}
	}
	if x, ok := a.(*List); ok {
		if y, ok := b.(*List); ok {
			for i := 0; i < len(x.Items) && i < len(y.Items); i++ {
				if !equal(x.Items[i], y.Items[i]) {
					return less(x.Items[i], y.Items[i])
				}
			}
			return len(x.Items) < len(y.Items), nil
		}
	}
	return false, errors("'<' not supported between instances of '" + typeName(a) + "' and '" + typeName(b) + "'")
}

// appendStr appends v as Python's str() prints it (Undefined as nothing).
func appendStr(dst []byte, v Value) []byte {
	switch x := v.(type) {
	case string:
		return append(dst, x...)
	case markup:
		return append(dst, x...)
	case Undefined:
		return dst
	}
	return appendRepr(dst, v)
}

func str(v Value) string {
	if s, ok := v.(string); ok {
		return s
	}
	return string(appendStr(nil, v))
}

// appendRepr appends v as Python's repr() prints it.
func appendRepr(dst []byte, v Value) []byte {
	switch x := v.(type) {
	case nil:
		return append(dst, "None"...)
	case Undefined:
		return dst
	case bool:
		if x {
			return append(dst, "True"...)
		}
		return append(dst, "False"...)
	case int64:
		return strconv.AppendInt(dst, x, 10)
	case bigInt:
		return append(dst, x...)
	case float64:
		return appendPyFloat(dst, x)
	case string:
		return appendPyRepr(dst, x)
	case *List:
		if x.generator {
			// Python prints an address; no engine's render can match it.
			return append(dst, "<generator object>"...)
		}
		open, close := byte('['), byte(']')
		if x.tuple {
			open, close = '(', ')'
		}
		dst = append(dst, open)
		for i, it := range x.Items {
			if i > 0 {
				dst = append(dst, ", "...)
			}
			dst = appendRepr(dst, it)
		}
		if x.tuple && len(x.Items) == 1 {
			dst = append(dst, ',')
		}
		return append(dst, close)
	case *Dict:
		dst = append(dst, '{')
		for i, k := range x.keys {
			if i > 0 {
				dst = append(dst, ", "...)
			}
			dst = appendRepr(dst, k)
			dst = append(dst, ": "...)
			dst = appendRepr(dst, x.vals[i])
		}
		return append(dst, '}')
	case *namespace:
		return append(dst, "<Namespace>"...)
	}
	return append(dst, "<function>"...)
}

// appendPyFloat appends f as Python's repr(float) prints it.
func appendPyFloat(dst []byte, f float64) []byte {
	switch {
	case math.IsNaN(f):
		return append(dst, "nan"...)
	case math.IsInf(f, 1):
		return append(dst, "inf"...)
	case math.IsInf(f, -1):
		return append(dst, "-inf"...)
	}
	return AppendFloat(dst, f)
}

// AppendFloat appends a finite f as Python's repr prints it: the shortest
// round-tripping digits, in positional form with at least one decimal when
// the decimal exponent is in [-4, 16), else in exponent form with a signed
// two-digit (or longer) exponent. json.dumps prints floats the same way.
func AppendFloat(dst []byte, f float64) []byte {
	var buf [32]byte
	e := strconv.AppendFloat(buf[:0], f, 'e', -1, 64)
	// e is [-]d[.ddd]e±XX
	exp := 0
	for i := len(e) - 1; i >= 0; i-- {
		if e[i] == 'e' {
			exp, _ = strconv.Atoi(string(e[i+1:]))
			break
		}
	}
	if exp < -4 || exp >= 16 {
		return append(dst, e...)
	}
	start := len(dst)
	dst = strconv.AppendFloat(dst, f, 'f', -1, 64)
	for _, c := range dst[start:] {
		if c == '.' {
			return dst
		}
	}
	return append(dst, ".0"...)
}

// appendPyRepr appends s quoted as Python's repr(str) quotes it.
func appendPyRepr(dst []byte, s string) []byte {
	q := byte('\'')
	hasSingle, hasDouble := false, false
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '\'':
			hasSingle = true
		case '"':
			hasDouble = true
		}
	}
	if hasSingle && !hasDouble {
		q = '"'
	}
	dst = append(dst, q)
	for _, r := range s {
		switch {
		case r == rune(q) || r == '\\':
			dst = append(dst, '\\', byte(r))
		case r == '\n':
			dst = append(dst, `\n`...)
		case r == '\r':
			dst = append(dst, `\r`...)
		case r == '\t':
			dst = append(dst, `\t`...)
		case r < 0x20 || r == 0x7f:
			dst = append(dst, `\x`...)
			dst = append(dst, "0123456789abcdef"[r>>4], "0123456789abcdef"[r&15])
		case r == utf8.RuneError:
			dst = append(dst, `\ufffd`...)
		default:
			dst = utf8.AppendRune(dst, r)
		}
	}
	return append(dst, q)
}
