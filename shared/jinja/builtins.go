package jinja

import (
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// test is a Jinja test: "v is name(args)".
type test func(v Value, args []Value) (bool, error)

var (
	globals map[string]Value
	filters map[string]callable
	tests   map[string]test
)

func init() {
	globals = map[string]Value{
		"range":           callable(rangeFn),
		"namespace":       callable(namespaceFn),
		"dict":            callable(dictFn),
		"raise_exception": callable(raiseException),
		"strftime_now":    callable(strftimeNow),
	}
	filters = map[string]callable{
		"length": lengthFilter, "count": lengthFilter,
		"tojson": tojsonFilter,
		"trim":   trimFilter,
		"join":   joinFilter,
		"list":   listFilter,
		"first":  firstFilter, "last": lastFilter,
		"default": defaultFilter, "d": defaultFilter,
		"items":      itemsFilter,
		"string":     func(c *call) (Value, error) { return str(c.args[0]), nil },
		"safe":       func(c *call) (Value, error) { return markup(str(c.args[0])), nil },
		"upper":      strFilter(strings.ToUpper),
		"lower":      strFilter(strings.ToLower),
		"capitalize": strFilter(capitalize),
		"title":      strFilter(title),
		"replace":    replaceFilter,
		"format":     formatFilter,
		"selectattr": selectFilter(true, true), "rejectattr": selectFilter(true, false),
		"select": selectFilter(false, true), "reject": selectFilter(false, false),
		"map":     mapFilter,
		"reverse": reverseFilter,
		"int":     intFilter,
		"float":   floatFilter,
		"abs":     absFilter,
		"indent":  indentFilter,
		"sum":     sumFilter,
		"attr": func(c *call) (Value, error) {
			if err := c.want(2); err != nil {
				return nil, err
			}
			return getattr(c.args[0], str(c.args[1]))
		},
		"escape": escapeFilter, "e": escapeFilter,
		"unique":   uniqueFilter,
		"dictsort": dictsortFilter,
		"sort":     sortFilter,
		"min":      minMaxFilter(true), "max": minMaxFilter(false),
	}
	tests = map[string]test{
		"defined":   func(v Value, _ []Value) (bool, error) { return !isUndefined(v), nil },
		"undefined": func(v Value, _ []Value) (bool, error) { return isUndefined(v), nil },
		"none":      func(v Value, _ []Value) (bool, error) { return v == nil, nil },
		"boolean":   func(v Value, _ []Value) (bool, error) { _, ok := v.(bool); return ok, nil },
		"true":      func(v Value, _ []Value) (bool, error) { b, ok := v.(bool); return ok && b, nil },
		"false":     func(v Value, _ []Value) (bool, error) { b, ok := v.(bool); return ok && !b, nil },
		"integer": func(v Value, _ []Value) (bool, error) {
			switch v.(type) {
			case int64, bigInt:
				return true, nil
			}
			return false, nil
		},
		"float": func(v Value, _ []Value) (bool, error) { _, ok := v.(float64); return ok, nil },
		"number": func(v Value, _ []Value) (bool, error) {
			_, ok := number(v)
			_, big := v.(bigInt)
			return ok || big, nil
		},
		"string":   func(v Value, _ []Value) (bool, error) { _, ok := plain(v).(string); return ok, nil },
		"mapping":  func(v Value, _ []Value) (bool, error) { _, ok := v.(*Dict); return ok, nil },
		"iterable": func(v Value, _ []Value) (bool, error) { return isContainer(v) || isGenerator(v), nil },
		// Jinja2's holds wherever len() and [] do: Undefined has both, a
		// generator neither.
		"sequence": func(v Value, _ []Value) (bool, error) { return isContainer(v) && !isGenerator(v), nil },
		"callable": func(v Value, _ []Value) (bool, error) {
			switch v.(type) {
			case callable, *macro:
				return true, nil
			}
			return false, nil
		},
		"eq": cmpTest("=="), "equalto": cmpTest("=="), "==": cmpTest("=="),
		"ne": cmpTest("!="), "!=": cmpTest("!="),
		"lt": cmpTest("<"), "lessthan": cmpTest("<"), "<": cmpTest("<"),
		"le": cmpTest("<="), "<=": cmpTest("<="),
		"gt": cmpTest(">"), "greaterthan": cmpTest(">"), ">": cmpTest(">"),
		"ge": cmpTest(">="), ">=": cmpTest(">="),
		"in": cmpTest("in"),
		"sameas": func(v Value, args []Value) (bool, error) {
			if len(args) != 1 {
				return false, errors("sameas takes one argument")
			}
			switch v.(type) {
			case nil, bool:
				return v == args[0], nil
			}
			return equal(v, args[0]) && typeName(v) == typeName(args[0]), nil
		},
		"odd":         intTest(func(i int64) bool { return i%2 != 0 }),
		"even":        intTest(func(i int64) bool { return i%2 == 0 }),
		"divisibleby": divisibleBy,
		"lower": func(v Value, _ []Value) (bool, error) {
			s, ok := v.(string)
			return ok && strings.ToLower(s) == s, nil
		},
		"upper": func(v Value, _ []Value) (bool, error) {
			s, ok := v.(string)
			return ok && strings.ToUpper(s) == s, nil
		},
	}
}

// want checks a call has n positional arguments at least.
func (c *call) want(n int) error {
	if len(c.args) < n {
		return errors(c.name + " takes at least " + strconv.Itoa(n) + " arguments")
	}
	return nil
}

// arg returns the i-th positional argument or the keyword argument name,
// else def.
func (c *call) arg(i int, name string, def Value) Value {
	for _, k := range c.kw {
		if k.name == name {
			return k.v
		}
	}
	if i >= 0 && i < len(c.args) {
		return c.args[i]
	}
	return def
}

func isContainer(v Value) bool {
	switch plain(v).(type) {
	case string, *List, *Dict, Undefined:
		return true
	}
	return false
}

func cmpTest(op string) test {
	return func(v Value, args []Value) (bool, error) {
		if len(args) != 1 {
			return false, errors("test " + op + " takes one argument")
		}
		return compare(op, v, args[0])
	}
}

func intTest(f func(int64) bool) test {
	return func(v Value, _ []Value) (bool, error) {
		i, ok := toInt(v)
		if !ok {
			return false, errors("test needs an integer")
		}
		return f(i), nil
	}
}

func divisibleBy(v Value, args []Value) (bool, error) {
	if len(args) != 1 {
		return false, errors("divisibleby takes one argument")
	}
	m, err := arith("%", v, args[0])
	if err != nil {
		return false, err
	}
	return equal(m, int64(0)), nil
}

func rangeFn(c *call) (Value, error) {
	var b [3]int64
	b[2] = 1
	for i, a := range c.args {
		n, ok := toInt(a)
		if !ok || i > 2 {
			return nil, errors("range takes up to three integers")
		}
		b[i] = n
	}
	start, stop, step := b[0], b[1], b[2]
	if len(c.args) == 1 {
		start, stop = 0, b[0]
	}
	if step == 0 {
		return nil, errors("range() arg 3 must not be zero")
	}
	var items []Value
	for i := start; (step > 0 && i < stop) || (step < 0 && i > stop); i += step {
		if len(items) >= 100_000 {
			return nil, errors("range too big")
		}
		items = append(items, i)
	}
	return &List{Items: items}, nil
}

func namespaceFn(c *call) (Value, error) {
	ns := &namespace{}
	return ns, fill(&ns.Dict, c)
}

func dictFn(c *call) (Value, error) {
	d := NewDict(len(c.kw))
	return d, fill(d, c)
}

// fill sets d from a call's dict arguments, then its keyword arguments, as
// namespace() and dict() do.
func fill(d *Dict, c *call) error {
	for _, a := range c.args {
		src, ok := a.(*Dict)
		if !ok {
			return errors(c.name + " takes a dict or keyword arguments")
		}
		for i, k := range src.keys {
			d.set(k, src.vals[i])
		}
	}
	for _, k := range c.kw {
		d.Set(k.name, k.v)
	}
	return nil
}

func raiseException(c *call) (Value, error) {
	msg := "raise_exception"
	if len(c.args) > 0 {
		msg = str(c.args[0])
	}
	return nil, errors(msg)
}

func strftimeNow(c *call) (Value, error) {
	if err := c.want(1); err != nil {
		return nil, err
	}
	f, ok := c.args[0].(string)
	if !ok {
		return nil, errors("strftime_now takes a format string")
	}
	return strftime(f, c.r.clock())
}

func lengthFilter(c *call) (Value, error) {
	switch v := plain(c.args[0]).(type) {
	case string:
		return int64(utf8.RuneCountInString(v)), nil
	case *List:
		if !v.generator {
			return int64(len(v.Items)), nil
		}
	case *Dict:
		return int64(len(v.keys)), nil
	case Undefined:
		return int64(0), nil
	}
	return nil, errors("object of type '" + typeName(c.args[0]) + "' has no len()")
}

// tojsonFilter is transformers' tojson(x, ensure_ascii=False, indent=None,
// separators=None, sort_keys=False): json.dumps with those arguments, in
// that order.
func tojsonFilter(c *call) (Value, error) {
	indent := -1
	if v := c.arg(2, "indent", nil); v != nil {
		n, ok := toInt(v)
		if !ok {
			return nil, errors("tojson: indent must be an integer")
		}
		indent = int(n)
	}
	j := jsonWriter{itemSep: ", ", keySep: ": ", indent: indent}
	if indent >= 0 {
		j.itemSep = ","
	}
	if s := c.arg(3, "separators", nil); s != nil {
		l, ok := s.(*List)
		if !ok || len(l.Items) != 2 {
			return nil, errors("tojson: separators must be a pair")
		}
		j.itemSep, j.keySep = str(l.Items[0]), str(l.Items[1])
	}
	j.sortKeys = truthy(c.arg(4, "sort_keys", false))
	j.ascii = truthy(c.arg(1, "ensure_ascii", false))
	out, err := j.write(nil, c.args[0], 0)
	return string(out), err
}

func trimFilter(c *call) (Value, error) {
	return pyStrip(str(c.args[0]), c.arg(1, "chars", nil), true, true), nil
}

func joinFilter(c *call) (Value, error) {
	items, err := iterate(c.args[0])
	if err != nil {
		return nil, err
	}
	sep := str(c.arg(1, "d", ""))
	attr := c.arg(2, "attribute", nil)
	var b []byte
	for i, it := range items {
		if i > 0 {
			b = append(b, sep...)
		}
		if attr != nil {
			if it, err = getattrPath(it, str(attr)); err != nil {
				return nil, err
			}
		}
		b = appendStr(b, it)
	}
	return string(b), nil
}

func listFilter(c *call) (Value, error) {
	items, err := iterate(c.args[0])
	if err != nil {
		return nil, err
	}
	return &List{Items: append([]Value(nil), items...)}, nil
}

func firstFilter(c *call) (Value, error) {
	items, err := iterate(c.args[0])
	if err != nil || len(items) == 0 {
		return Undefined{"first"}, err
	}
	return items[0], nil
}

func lastFilter(c *call) (Value, error) {
	items, err := iterate(c.args[0])
	if err != nil || len(items) == 0 {
		return Undefined{"last"}, err
	}
	return items[len(items)-1], nil
}

func defaultFilter(c *call) (Value, error) {
	v := c.args[0]
	def := c.arg(1, "default_value", "")
	if isUndefined(v) || truthy(c.arg(2, "boolean", false)) && !truthy(v) {
		return def, nil
	}
	return v, nil
}

func itemsFilter(c *call) (Value, error) {
	switch d := c.args[0].(type) {
	case *Dict:
		return d.items(), nil
	case Undefined:
		return &List{}, nil
	}
	return nil, errors("items filter needs a mapping")
}

func (d *Dict) items() *List {
	out := &List{Items: make([]Value, len(d.keys))}
	for i, k := range d.keys {
		out.Items[i] = &List{Items: []Value{k, d.vals[i]}, tuple: true}
	}
	return out
}

func strFilter(f func(string) string) callable {
	return func(c *call) (Value, error) { return f(str(c.args[0])), nil }
}

func capitalize(s string) string {
	r, n := utf8.DecodeRuneInString(s)
	if n == 0 {
		return s
	}
	return string(unicode.ToUpper(r)) + strings.ToLower(s[n:])
}

func title(s string) string {
	b := make([]rune, 0, len(s))
	prevLetter := false
	for _, r := range s {
		if prevLetter {
			b = append(b, unicode.ToLower(r))
		} else {
			b = append(b, unicode.ToUpper(r))
		}
		prevLetter = unicode.IsLetter(r) || unicode.IsDigit(r) || r == '\''
	}
	return string(b)
}

func replaceFilter(c *call) (Value, error) {
	if err := c.want(3); err != nil {
		return nil, err
	}
	n := -1
	if v := c.arg(3, "count", nil); v != nil {
		i, _ := toInt(v)
		n = int(i)
	}
	return strings.Replace(str(c.args[0]), str(c.args[1]), str(c.args[2]), n), nil
}

// formatFilter is Jinja's format: the string %-formatted with the
// arguments, as Python's str % tuple. %s, %r, %d, %i and %% are
// supported; any other conversion, flags or width, or named arguments,
// are an error rather than a guess.
func formatFilter(c *call) (Value, error) {
	if len(c.args) == 0 {
		return nil, errors("format needs a string")
	}
	if len(c.kw) > 0 {
		return nil, errors("format with named arguments is not supported")
	}
	f, args := str(c.args[0]), c.args[1:]
	var out []byte
	n := 0
	for i := 0; i < len(f); i++ {
		if f[i] != '%' {
			out = append(out, f[i])
			continue
		}
		if i++; i == len(f) {
			return nil, errors("format: incomplete format")
		}
		if f[i] == '%' {
			out = append(out, '%')
			continue
		}
		if n == len(args) {
			return nil, errors("format: not enough arguments for format string")
		}
		switch a := args[n]; f[i] {
		case 's':
			out = appendStr(out, a)
		case 'r':
			out = appendRepr(out, a)
		case 'd', 'i':
			v, ok := toInt(a)
			if f, isFloat := a.(float64); isFloat && !math.IsInf(f, 0) && !math.IsNaN(f) {
				v, ok = int64(f), true // Python truncates
			}
			if !ok {
				return nil, errors("format: %" + string(f[i]) + " format: a real number is required, not " + typeName(a))
			}
			out = strconv.AppendInt(out, v, 10)
		default:
			return nil, errors("format: unsupported conversion %" + string(f[i]))
		}
		n++
	}
	if n < len(args) {
		return nil, errors("format: not all arguments converted during string formatting")
	}
	return string(out), nil
}

// selectFilter is select, reject, selectattr and rejectattr.
func selectFilter(byAttr, keep bool) callable {
	return func(c *call) (Value, error) {
		items, err := generatorInput(c.args[0])
		if err != nil {
			return nil, err
		}
		rest := c.args[1:]
		var attr string
		if byAttr {
			if len(rest) == 0 {
				return nil, errors(c.name + " needs an attribute")
			}
			attr, rest = str(rest[0]), rest[1:]
		}
		var t test
		if len(rest) > 0 {
			name := str(rest[0])
			var ok bool
			if t, ok = tests[name]; !ok {
				return nil, errors("no test named " + strconv.Quote(name))
			}
			rest = rest[1:]
		}
		out := &List{generator: true}
		for _, it := range items {
			v := it
			if byAttr {
				if v, err = getattrPath(it, attr); err != nil {
					return nil, err
				}
			}
			ok := truthy(v)
			if t != nil {
				if ok, err = t(v, rest); err != nil {
					return nil, err
				}
			}
			if ok == keep {
				out.Items = append(out.Items, it)
			}
		}
		return out, nil
	}
}

// getattrPath reads a dotted attribute path, as Jinja2's attribute
// arguments allow ("function.name").
func getattrPath(v Value, path string) (Value, error) {
	for {
		i := strings.IndexByte(path, '.')
		name := path
		if i >= 0 {
			name = path[:i]
		}
		var err error
		if n, convErr := strconv.Atoi(name); convErr == nil {
			v, err = getitem(v, int64(n))
		} else {
			v, err = getitem(v, name)
		}
		if err != nil || i < 0 {
			return v, err
		}
		path = path[i+1:]
	}
}

// generatorInput is what select, reject and map iterate: Jinja2's
// versions start with "if value:", so a false input (none) yields nothing.
func generatorInput(v Value) ([]Value, error) {
	if !truthy(v) {
		return nil, nil
	}
	return iterate(v)
}

func mapFilter(c *call) (Value, error) {
	items, err := generatorInput(c.args[0])
	if err != nil {
		return nil, err
	}
	out := &List{Items: make([]Value, 0, len(items)), generator: true}
	if attr := c.arg(-1, "attribute", nil); attr != nil {
		def := c.arg(-1, "default", nil)
		for _, it := range items {
			v, err := getattrPath(it, str(attr))
			if err != nil {
				return nil, err
			}
			if isUndefined(v) && def != nil {
				v = def
			}
			out.Items = append(out.Items, v)
		}
		return out, nil
	}
	if err := c.want(2); err != nil {
		return nil, err
	}
	name := str(c.args[1])
	f, ok := filters[name]
	if !ok {
		return nil, errors("no filter named " + strconv.Quote(name))
	}
	for _, it := range items {
		v, err := f(&call{r: c.r, name: name, args: append([]Value{it}, c.args[2:]...), kw: c.kw})
		if err != nil {
			return nil, err
		}
		out.Items = append(out.Items, v)
	}
	return out, nil
}

func reverseFilter(c *call) (Value, error) {
	if s, ok := c.args[0].(string); ok {
		r := []rune(s)
		for i, j := 0, len(r)-1; i < j; i, j = i+1, j-1 {
			r[i], r[j] = r[j], r[i]
		}
		return string(r), nil
	}
	items, err := iterate(c.args[0])
	if err != nil {
		return nil, err
	}
	// Python's reversed() is an iterator, like select's generators;
	// Jinja2 makes a list only of what reversed() refuses (a generator).
	out := &List{Items: make([]Value, len(items)), generator: !isGenerator(c.args[0])}
	for i, it := range items {
		out.Items[len(items)-1-i] = it
	}
	return out, nil
}

func isGenerator(v Value) bool {
	l, ok := v.(*List)
	return ok && l.generator
}

func intFilter(c *call) (Value, error) {
	def := c.arg(1, "default", int64(0))
	switch v := c.args[0].(type) {
	case int64:
		return v, nil
	case bool:
		i, _ := toInt(v)
		return i, nil
	case float64:
		return int64(v), nil
	case string:
		if i, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
			return i, nil
		}
		if f, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil {
			return int64(f), nil
		}
	}
	return def, nil
}

func floatFilter(c *call) (Value, error) {
	if f, ok := number(c.args[0]); ok {
		return f, nil
	}
	if s, ok := c.args[0].(string); ok {
		if f, err := strconv.ParseFloat(strings.TrimSpace(s), 64); err == nil {
			return f, nil
		}
	}
	return c.arg(1, "default", 0.0), nil
}

func absFilter(c *call) (Value, error) {
	switch v := c.args[0].(type) {
	case int64:
		if v < 0 {
			return -v, nil
		}
		return v, nil
	case float64:
		return math.Abs(v), nil
	}
	return nil, errors("bad operand type for abs()")
}

func indentFilter(c *call) (Value, error) {
	width := c.arg(1, "width", int64(4))
	var pad string
	if w, ok := toInt(width); ok {
		pad = strings.Repeat(" ", int(max(w, 0)))
	} else {
		pad = str(width)
	}
	first, blank := truthy(c.arg(2, "first", false)), truthy(c.arg(3, "blank", false))
	lines := strings.Split(str(c.args[0]), "\n")
	for i := range lines {
		if i == 0 && !first || !blank && strings.TrimSpace(lines[i]) == "" && i > 0 {
			continue
		}
		lines[i] = pad + lines[i]
	}
	return strings.Join(lines, "\n"), nil
}

func sumFilter(c *call) (Value, error) {
	items, err := iterate(c.args[0])
	if err != nil {
		return nil, err
	}
	total := c.arg(2, "start", int64(0))
	attr := c.arg(1, "attribute", nil)
	for _, it := range items {
		if attr != nil {
			if it, err = getattrPath(it, str(attr)); err != nil {
				return nil, err
			}
		}
		if total, err = arith("+", total, it); err != nil {
			return nil, err
		}
	}
	return total, nil
}

func escapeFilter(c *call) (Value, error) {
	if m, ok := c.args[0].(markup); ok {
		return m, nil
	}
	return markup(escapeHTML(str(c.args[0]))), nil
}

var htmlEscaper = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", "\"", "&#34;", "'", "&#39;")

func escapeHTML(s string) string { return htmlEscaper.Replace(s) }

func uniqueFilter(c *call) (Value, error) {
	items, err := iterate(c.args[0])
	if err != nil {
		return nil, err
	}
	out := &List{}
	for _, it := range items {
		seen := false
		for _, o := range out.Items {
			seen = seen || equal(o, it)
		}
		if !seen {
			out.Items = append(out.Items, it)
		}
	}
	return out, nil
}

func dictMethod(d *Dict, name string) Value {
	switch name {
	case "items":
		return callable(func(*call) (Value, error) { return d.items(), nil })
	case "keys":
		return callable(func(*call) (Value, error) { return &List{Items: append([]Value(nil), d.keys...)}, nil })
	case "values":
		return callable(func(*call) (Value, error) { return &List{Items: append([]Value(nil), d.vals...)}, nil })
	case "get":
		return callable(func(c *call) (Value, error) {
			if err := c.want(1); err != nil {
				return nil, err
			}
			if v, ok := d.get(c.args[0]); ok {
				return v, nil
			}
			return c.arg(1, "default", nil), nil
		})
	}
	return nil
}

func listMethod(l *List, name string) Value {
	switch name {
	case "index":
		return callable(func(c *call) (Value, error) {
			if err := c.want(1); err != nil {
				return nil, err
			}
			for i, it := range l.Items {
				if equal(it, c.args[0]) {
					return int64(i), nil
				}
			}
			return nil, errors("value is not in list")
		})
	case "count":
		return callable(func(c *call) (Value, error) {
			if err := c.want(1); err != nil {
				return nil, err
			}
			n := int64(0)
			for _, it := range l.Items {
				if equal(it, c.args[0]) {
					n++
				}
			}
			return n, nil
		})
	case "append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse":
		// transformers' sandbox is immutable: a template that mutates a
		// list fails on the engine too.
		return callable(func(*call) (Value, error) {
			return nil, errors("access to attribute '" + name + "' of 'list' object is unsafe")
		})
	}
	return nil
}

func stringMethod(s string, name string) Value {
	switch name {
	case "strip", "lstrip", "rstrip":
		return callable(func(c *call) (Value, error) {
			return pyStrip(s, c.arg(0, "chars", nil), name != "rstrip", name != "lstrip"), nil
		})
	case "split", "rsplit":
		return callable(func(c *call) (Value, error) {
			return pySplit(s, c.arg(0, "sep", nil), c.arg(1, "maxsplit", int64(-1)), name == "rsplit")
		})
	case "startswith", "endswith":
		return callable(func(c *call) (Value, error) {
			if err := c.want(1); err != nil {
				return nil, err
			}
			affixes := []Value{c.args[0]}
			if t, ok := c.args[0].(*List); ok {
				affixes = t.Items
			}
			for _, a := range affixes {
				x, ok := a.(string)
				if !ok {
					return nil, errors(name + " arg must be str or a tuple of str")
				}
				if name == "startswith" && strings.HasPrefix(s, x) || name == "endswith" && strings.HasSuffix(s, x) {
					return true, nil
				}
			}
			return false, nil
		})
	case "replace":
		return callable(func(c *call) (Value, error) {
			if err := c.want(2); err != nil {
				return nil, err
			}
			n := int64(-1)
			if v := c.arg(2, "count", nil); v != nil {
				n, _ = toInt(v)
			}
			return strings.Replace(s, str(c.args[0]), str(c.args[1]), int(n)), nil
		})
	case "upper":
		return callable(func(*call) (Value, error) { return strings.ToUpper(s), nil })
	case "lower":
		return callable(func(*call) (Value, error) { return strings.ToLower(s), nil })
	case "title":
		return callable(func(*call) (Value, error) { return title(s), nil })
	case "capitalize":
		return callable(func(*call) (Value, error) { return capitalize(s), nil })
	case "find", "rfind", "index", "count":
		return callable(func(c *call) (Value, error) {
			if err := c.want(1); err != nil {
				return nil, err
			}
			sub := str(c.args[0])
			var i int
			switch name {
			case "count":
				return int64(strings.Count(s, sub)), nil
			case "rfind":
				i = strings.LastIndex(s, sub)
			default:
				i = strings.Index(s, sub)
			}
			if i < 0 {
				if name == "index" {
					return nil, errors("substring not found")
				}
				return int64(-1), nil
			}
			return int64(utf8.RuneCountInString(s[:i])), nil
		})
	case "join":
		return callable(func(c *call) (Value, error) {
			if err := c.want(1); err != nil {
				return nil, err
			}
			items, err := iterate(c.args[0])
			if err != nil {
				return nil, err
			}
			var b []byte
			for i, it := range items {
				x, ok := it.(string)
				if !ok {
					return nil, errors("sequence item " + strconv.Itoa(i) + ": expected str instance")
				}
				if i > 0 {
					b = append(b, s...)
				}
				b = append(b, x...)
			}
			return string(b), nil
		})
	case "format":
		return callable(func(c *call) (Value, error) { return pyFormat(s, c) })
	case "splitlines":
		return callable(func(*call) (Value, error) {
			out := &List{}
			for _, l := range strings.SplitAfter(s, "\n") {
				if l != "" {
					out.Items = append(out.Items, strings.TrimSuffix(strings.TrimSuffix(l, "\n"), "\r"))
				}
			}
			return out, nil
		})
	case "isdigit", "isspace", "isalpha", "isalnum", "isupper", "islower":
		return callable(func(*call) (Value, error) { return strClass(s, name), nil })
	}
	return nil
}

func strClass(s, name string) bool {
	if s == "" {
		return false
	}
	cased := false
	for _, r := range s {
		var ok bool
		switch name {
		case "isdigit":
			ok = unicode.IsDigit(r)
		case "isspace":
			ok = isPySpace(r)
		case "isalpha":
			ok = unicode.IsLetter(r)
		case "isalnum":
			ok = unicode.IsLetter(r) || unicode.IsDigit(r)
		case "isupper":
			ok = !unicode.IsLower(r)
			cased = cased || unicode.IsUpper(r)
		case "islower":
			ok = !unicode.IsUpper(r)
			cased = cased || unicode.IsLower(r)
		}
		if !ok {
			return false
		}
	}
	return cased || name != "isupper" && name != "islower"
}

// isPySpace reports whether Python's str.isspace holds for r.
func isPySpace(r rune) bool {
	switch r {
	case ' ', '\t', '\n', '\v', '\f', '\r', 0x1c, 0x1d, 0x1e, 0x1f, 0x85:
		return true
	}
	return r > 0x7f && unicode.IsSpace(r)
}

// pyStrip is Python's str.strip (lstrip, rstrip): whitespace, or any of
// chars when chars is a string.
func pyStrip(s string, chars Value, left, right bool) string {
	cut := isPySpace
	if cs, ok := chars.(string); ok {
		cut = func(r rune) bool { return strings.ContainsRune(cs, r) }
	}
	if left {
		s = strings.TrimLeftFunc(s, cut)
	}
	if right {
		s = strings.TrimRightFunc(s, cut)
	}
	return s
}

func pySplit(s string, sep, maxsplit Value, fromRight bool) (Value, error) {
	n, _ := toInt(maxsplit)
	out := &List{}
	if sep == nil {
		fields := strings.FieldsFunc(s, isPySpace)
		if n >= 0 && int64(len(fields)) > n+1 {
			// Python keeps the rest of the string, whitespace and all, in
			// the last field.
			if fromRight {
				return nil, errors("rsplit with maxsplit and no separator is not supported")
			}
			rest := s
			fields = fields[:0]
			for i := int64(0); i < n; i++ {
				rest = strings.TrimLeftFunc(rest, isPySpace)
				j := strings.IndexFunc(rest, isPySpace)
				fields = append(fields, rest[:j])
				rest = rest[j:]
			}
			fields = append(fields, strings.TrimLeftFunc(rest, isPySpace))
		}
		for _, f := range fields {
			out.Items = append(out.Items, f)
		}
		return out, nil
	}
	sp, ok := sep.(string)
	if !ok || sp == "" {
		return nil, errors("split: bad separator")
	}
	var parts []string
	switch {
	case n < 0:
		parts = strings.Split(s, sp)
	case fromRight:
		parts = strings.Split(s, sp)
		if int64(len(parts)) > n+1 {
			k := len(parts) - int(n)
			parts = append([]string{strings.Join(parts[:k], sp)}, parts[k:]...)
		}
	default:
		parts = strings.SplitN(s, sp, int(n)+1)
	}
	for _, p := range parts {
		out.Items = append(out.Items, p)
	}
	return out, nil
}

func dictsortFilter(c *call) (Value, error) {
	d, ok := c.args[0].(*Dict)
	if !ok {
		return nil, errors("dictsort needs a mapping")
	}
	caseSensitive := truthy(c.arg(1, "case_sensitive", false))
	by := 0
	if str(c.arg(2, "by", "key")) == "value" {
		by = 1
	}
	pairs := d.items().Items
	keys := make([]Value, len(pairs))
	for i, p := range pairs {
		keys[i] = foldCase(p.(*List).Items[by], caseSensitive)
	}
	return sorted(pairs, keys, truthy(c.arg(3, "reverse", false)))
}

func sortFilter(c *call) (Value, error) {
	items, err := iterate(c.args[0])
	if err != nil {
		return nil, err
	}
	keys, err := sortKeys(items, c.arg(3, "attribute", nil), truthy(c.arg(2, "case_sensitive", false)))
	if err != nil {
		return nil, err
	}
	return sorted(items, keys, truthy(c.arg(1, "reverse", false)))
}

func minMaxFilter(isMin bool) callable {
	return func(c *call) (Value, error) {
		items, err := iterate(c.args[0])
		if err != nil {
			return nil, err
		}
		keys, err := sortKeys(items, c.arg(2, "attribute", nil), truthy(c.arg(1, "case_sensitive", false)))
		if err != nil {
			return nil, err
		}
		if len(items) == 0 {
			return Undefined{c.name}, nil
		}
		best := 0
		for i := 1; i < len(items); i++ {
			x, y := keys[i], keys[best]
			if !isMin {
				x, y = y, x
			}
			l, err := less(x, y)
			if err != nil {
				return nil, err
			}
			if l {
				best = i
			}
		}
		return items[best], nil
	}
}

// sortKeys are what sort, min and max compare items by: each item, or its
// attribute when one is named, strings lower-cased unless case sensitive.
func sortKeys(items []Value, attr Value, caseSensitive bool) ([]Value, error) {
	keys := make([]Value, len(items))
	for i, it := range items {
		k := it
		if attr != nil {
			var err error
			if k, err = getattrPath(it, str(attr)); err != nil {
				return nil, err
			}
		}
		keys[i] = foldCase(k, caseSensitive)
	}
	return keys, nil
}

func foldCase(k Value, caseSensitive bool) Value {
	if s, ok := plain(k).(string); ok && !caseSensitive {
		return strings.ToLower(s)
	}
	return k
}

// sorted returns items in the order of their keys, stably, as Python's
// sorted does (reverse keeps equal items in their order too).
func sorted(items, keys []Value, reverse bool) (*List, error) {
	order := make([]int, len(items))
	for i := range order {
		order[i] = i
	}
	var sortErr error
	sort.SliceStable(order, func(i, j int) bool {
		x, y := keys[order[i]], keys[order[j]]
		if reverse {
			x, y = y, x
		}
		l, err := less(x, y)
		if err != nil {
			sortErr = err
		}
		return l
	})
	out := &List{Items: make([]Value, len(items))}
	for i, j := range order {
		out.Items[i] = items[j]
	}
	return out, sortErr
}

// pyFormat is str.format for plain fields: "{}", "{0}", "{name}", "{{"
// and "}}"; a conversion or format spec is refused.
func pyFormat(s string, c *call) (Value, error) {
	var b []byte
	next := 0
	for i := 0; i < len(s); i++ {
		ch := s[i]
		if ch == '}' {
			if i+1 < len(s) && s[i+1] == '}' {
				i++
			}
			b = append(b, '}')
			continue
		}
		if ch != '{' {
			b = append(b, ch)
			continue
		}
		if i+1 < len(s) && s[i+1] == '{' {
			b = append(b, '{')
			i++
			continue
		}
		j := strings.IndexByte(s[i:], '}')
		if j < 0 {
			return nil, errors("format: single '{' encountered")
		}
		field := s[i+1 : i+j]
		i += j
		var v Value
		switch n, err := strconv.Atoi(field); {
		case field == "":
			if next >= len(c.args) {
				return nil, errors("format: not enough arguments")
			}
			v = c.args[next]
			next++
		case err == nil:
			if n >= len(c.args) {
				return nil, errors("format: not enough arguments")
			}
			v = c.args[n]
		case strings.ContainsAny(field, "!:.["):
			return nil, errors("format: only plain fields are supported")
		default:
			v = c.arg(-1, field, Undefined{field})
			if isUndefined(v) {
				return nil, errors("format: no argument " + strconv.Quote(field))
			}
		}
		b = appendStr(b, v)
	}
	return string(b), nil
}
