package jinja

import (
	"math"
	"strconv"
	"strings"
)

type scope struct {
	names  []string
	vals   []Value
	parent *scope
}

func (s *scope) lookup(name string) (Value, bool) {
	for ; s != nil; s = s.parent {
		for i := len(s.names) - 1; i >= 0; i-- {
			if s.names[i] == name {
				return s.vals[i], true
			}
		}
	}
	return nil, false
}

func (s *scope) set(name string, v Value) {
	for i, n := range s.names {
		if n == name {
			s.vals[i] = v
			return
		}
	}
	s.names = append(s.names, name)
	s.vals = append(s.vals, v)
}

type macro struct {
	n *macroNode
}

// loop is a for loop's "loop" variable.
type loop struct {
	items []Value
	i     int
}

type renderer struct {
	root  *scope
	out   []byte
	steps int
	depth int
	line  int // of the statement being run, for errors
	opts  *Options
}

const (
	ctlNone = iota
	ctlBreak
	ctlContinue
)

func (r *renderer) step() error {
	r.steps++
	if r.steps > r.opts.maxSteps() || len(r.out) > r.opts.maxOutput() {
		return errors("template exceeds its evaluation budget")
	}
	return nil
}

func (r *renderer) exec(nodes []node, sc *scope) (int, error) {
	for _, n := range nodes {
		if err := r.step(); err != nil {
			return 0, err
		}
		switch n := n.(type) {
		case *textNode:
			r.out = append(r.out, n.s...)
		case *outputNode:
			r.line = n.line
			v, err := r.eval(n.x, sc)
			if err != nil {
				return 0, err
			}
			r.out = appendStr(r.out, v)
		case *ifNode:
			r.line = n.line
			body := n.els
			for i, c := range n.conds {
				v, err := r.eval(c, sc)
				if err != nil {
					return 0, err
				}
				if truthy(v) {
					body = n.bodies[i]
					break
				}
			}
			if ctl, err := r.exec(body, sc); ctl != ctlNone || err != nil {
				return ctl, err
			}
		case *forNode:
			r.line = n.line
			if err := r.forLoop(n, sc); err != nil {
				return 0, err
			}
		case *setNode:
			r.line = n.line
			if err := r.assign(n, sc); err != nil {
				return 0, err
			}
		case *filterNode:
			saved := r.out
			r.out = nil
			if _, err := r.exec(n.body, sc); err != nil {
				return 0, err
			}
			body := string(r.out)
			r.out = saved
			r.line = n.line
			inner := &scope{names: []string{filterInput}, vals: []Value{body}, parent: sc}
			v, err := r.eval(n.x, inner)
			if err != nil {
				return 0, err
			}
			r.out = appendStr(r.out, v)
		case *macroNode:
			sc.set(n.name, &macro{n})
		case *loopControl:
			if n.brk {
				return ctlBreak, nil
			}
			return ctlContinue, nil
		}
	}
	return ctlNone, nil
}

func (r *renderer) forLoop(n *forNode, sc *scope) error {
	seq, err := r.eval(n.iter, sc)
	if err != nil {
		return err
	}
	items, err := iterate(seq)
	if err != nil {
		return err
	}
	body := &scope{parent: sc}
	if n.cond != nil {
		// The filter sees each item, and loop counts only those it keeps.
		kept := make([]Value, 0, len(items))
		for _, it := range items {
			if err := r.step(); err != nil {
				return err
			}
			if err := bind(body, n.targets, it); err != nil {
				return err
			}
			v, err := r.eval(n.cond, body)
			if err != nil {
				return err
			}
			if truthy(v) {
				kept = append(kept, it)
			}
		}
		items = kept
	}
	if len(items) == 0 {
		_, err := r.exec(n.els, sc)
		return err
	}
	lp := &loop{items: items}
	for i, it := range items {
		if err := r.step(); err != nil {
			return err
		}
		lp.i = i
		// Each pass starts afresh: what a pass sets is gone by the next,
		// as in Jinja2.
		body = &scope{parent: sc}
		if err := bind(body, n.targets, it); err != nil {
			return err
		}
		body.set("loop", lp)
		ctl, err := r.exec(n.body, body)
		if err != nil {
			return err
		}
		if ctl == ctlBreak {
			break
		}
	}
	return nil
}

// bind assigns v to one name, or unpacks it into several.
func bind(sc *scope, targets []string, v Value) error {
	if len(targets) == 1 {
		sc.set(targets[0], v)
		return nil
	}
	items, err := iterate(v)
	if err != nil {
		return err
	}
	if len(items) != len(targets) {
		return errors("cannot unpack " + strconv.Itoa(len(items)) + " values into " + strconv.Itoa(len(targets)))
	}
	for i, t := range targets {
		sc.set(t, items[i])
	}
	return nil
}

func (r *renderer) assign(n *setNode, sc *scope) error {
	var v Value
	if n.x == nil {
		saved := r.out
		r.out = nil
		if _, err := r.exec(n.body, sc); err != nil {
			return err
		}
		v = string(r.out)
		r.out = saved
	} else {
		var err error
		if v, err = r.eval(n.x, sc); err != nil {
			return err
		}
	}
	if n.attr != "" {
		target, _ := sc.lookup(n.targets[0])
		ns, ok := target.(*namespace)
		if !ok {
			return errors("cannot assign attribute on non-namespace object")
		}
		ns.Set(n.attr, v)
		return nil
	}
	return bind(sc, n.targets, v)
}

func (r *renderer) eval(x expr, sc *scope) (Value, error) {
	switch x := x.(type) {
	case *literal:
		return x.v, nil
	case *nameRef:
		if v, ok := sc.lookup(x.name); ok {
			return v, nil
		}
		if f, ok := globals[x.name]; ok {
			return f, nil
		}
		return Undefined{x.name}, nil
	case *attrExpr:
		v, err := r.eval(x.x, sc)
		if err != nil {
			return nil, err
		}
		return getattr(v, x.name)
	case *itemExpr:
		v, err := r.eval(x.x, sc)
		if err != nil {
			return nil, err
		}
		k, err := r.eval(x.key, sc)
		if err != nil {
			return nil, err
		}
		return getitem(v, k)
	case *sliceExpr:
		return r.slice(x, sc)
	case *callExpr:
		fn, err := r.eval(x.fn, sc)
		if err != nil {
			return nil, err
		}
		c, err := r.callArgs(x.args, x.kw, sc)
		if err != nil {
			return nil, err
		}
		if n, ok := x.fn.(*nameRef); ok {
			c.name = n.name
		}
		return r.call(fn, c)
	case *filterExpr:
		if x.f == nil {
			return nil, errors("no filter named " + strconv.Quote(x.name))
		}
		v, err := r.eval(x.x, sc)
		if err != nil {
			return nil, err
		}
		c, err := r.callArgs(x.args, x.kw, sc, v)
		if err != nil {
			return nil, err
		}
		c.name = x.name
		return x.f(c)
	case *testExpr:
		if x.t == nil {
			return nil, errors("no test named " + strconv.Quote(x.name))
		}
		v, err := r.eval(x.x, sc)
		if err != nil {
			return nil, err
		}
		args := make([]Value, len(x.args))
		for i, a := range x.args {
			if args[i], err = r.eval(a, sc); err != nil {
				return nil, err
			}
		}
		ok, err := x.t(v, args)
		if err != nil {
			return nil, err
		}
		return ok != x.negate, nil
	case *binExpr:
		l, err := r.eval(x.l, sc)
		if err != nil {
			return nil, err
		}
		rv, err := r.eval(x.r, sc)
		if err != nil {
			return nil, err
		}
		return arith(x.op, l, rv)
	case *notExpr:
		v, err := r.eval(x.x, sc)
		return !truthy(v), err
	case *negExpr:
		v, err := r.eval(x.x, sc)
		if err != nil {
			return nil, err
		}
		return arith("-", int64(0), v)
	case *andExpr:
		l, err := r.eval(x.l, sc)
		if err != nil || !truthy(l) {
			return l, err
		}
		return r.eval(x.r, sc)
	case *orExpr:
		l, err := r.eval(x.l, sc)
		if err != nil || truthy(l) {
			return l, err
		}
		return r.eval(x.r, sc)
	case *cmpExpr:
		l, err := r.eval(x.first, sc)
		if err != nil {
			return nil, err
		}
		for i, op := range x.ops {
			rv, err := r.eval(x.rest[i], sc)
			if err != nil {
				return nil, err
			}
			ok, err := compare(op, l, rv)
			if err != nil || !ok {
				return false, err
			}
			l = rv
		}
		return true, nil
	case *condExpr:
		c, err := r.eval(x.cond, sc)
		if err != nil {
			return nil, err
		}
		if truthy(c) {
			return r.eval(x.yes, sc)
		}
		if x.no == nil {
			return Undefined{"else"}, nil
		}
		return r.eval(x.no, sc)
	case *listExpr:
		l := &List{Items: make([]Value, len(x.items)), tuple: x.tuple}
		for i, it := range x.items {
			v, err := r.eval(it, sc)
			if err != nil {
				return nil, err
			}
			l.Items[i] = v
		}
		return l, nil
	case *dictExpr:
		d := NewDict(len(x.keys))
		for i := range x.keys {
			k, err := r.eval(x.keys[i], sc)
			if err != nil {
				return nil, err
			}
			switch k.(type) {
			case string, int64, float64, bool, nil:
			default:
				return nil, errors("unhashable type: '" + typeName(k) + "'")
			}
			v, err := r.eval(x.vals[i], sc)
			if err != nil {
				return nil, err
			}
			d.set(k, v)
		}
		return d, nil
	}
	return nil, errors("unknown expression")
}

// callArgs evaluates a call's arguments; a filter's input, when it has
// one, goes first.
func (r *renderer) callArgs(args []expr, kw []kwarg, sc *scope, input ...Value) (*call, error) {
	c := &call{r: r, args: make([]Value, len(input), len(input)+len(args))}
	copy(c.args, input)
	for _, a := range args {
		v, err := r.eval(a, sc)
		if err != nil {
			return nil, err
		}
		c.args = append(c.args, v)
	}
	for _, k := range kw {
		v, err := r.eval(k.x, sc)
		if err != nil {
			return nil, err
		}
		c.kw = append(c.kw, kwValue{k.name, v})
	}
	return c, nil
}

func (r *renderer) call(fn Value, c *call) (Value, error) {
	switch f := fn.(type) {
	case callable:
		return f(c)
	case *macro:
		return r.callMacro(f, c)
	case Undefined:
		return nil, errors("'" + f.name + "' is undefined")
	}
	return nil, errors("'" + typeName(fn) + "' object is not callable")
}

func (r *renderer) callMacro(m *macro, c *call) (Value, error) {
	if r.depth++; r.depth > 64 {
		return nil, errors("macros nest too deeply")
	}
	defer func() { r.depth-- }()
	n := m.n
	if len(c.args) > len(n.params) {
		return nil, errors("macro '" + n.name + "' takes not more than " + strconv.Itoa(len(n.params)) + " arguments")
	}
	sc := &scope{parent: r.root}
	for i, p := range n.params {
		var v Value = Undefined{p}
		switch {
		case i < len(c.args):
			v = c.args[i]
		case n.defaults[i] != nil:
			var err error
			if v, err = r.eval(n.defaults[i], sc); err != nil {
				return nil, err
			}
		}
		sc.set(p, v)
	}
	for _, k := range c.kw {
		found := false
		for _, p := range n.params {
			found = found || p == k.name
		}
		if !found {
			return nil, errors("macro '" + n.name + "' takes no keyword argument '" + k.name + "'")
		}
		sc.set(k.name, k.v)
	}
	saved := r.out
	r.out = nil
	_, err := r.exec(n.body, sc)
	out := string(r.out)
	r.out = saved
	return out, err
}

func (r *renderer) slice(x *sliceExpr, sc *scope) (Value, error) {
	v, err := r.eval(x.x, sc)
	if err != nil {
		return nil, err
	}
	var bounds [3]Value
	for i, b := range []expr{x.lo, x.hi, x.step} {
		if b == nil {
			continue
		}
		if bounds[i], err = r.eval(b, sc); err != nil {
			return nil, err
		}
	}
	var items []Value
	var runes []rune
	switch s := v.(type) {
	case *List:
		items = s.Items
	case string:
		runes = []rune(s)
		items = make([]Value, len(runes))
	case Undefined:
		return nil, errors("'" + s.name + "' is undefined")
	default:
		return nil, errors("'" + typeName(v) + "' object is not subscriptable")
	}
	idx, err := sliceIndexes(len(items), bounds)
	if err != nil {
		return nil, err
	}
	if runes != nil {
		out := make([]rune, len(idx))
		for i, j := range idx {
			out[i] = runes[j]
		}
		return string(out), nil
	}
	out := &List{Items: make([]Value, len(idx))}
	for i, j := range idx {
		out.Items[i] = items[j]
	}
	return out, nil
}

// sliceIndexes returns the indexes Python's s[lo:hi:step] takes from a
// sequence of n.
func sliceIndexes(n int, b [3]Value) ([]int, error) {
	step := 1
	if b[2] != nil {
		s, ok := b[2].(int64)
		if !ok || s == 0 {
			return nil, errors("slice step must be a non-zero integer")
		}
		step = int(s)
	}
	bound := func(v Value, def int) (int, error) {
		if v == nil {
			return def, nil
		}
		i, ok := v.(int64)
		if !ok {
			return 0, errors("slice indices must be integers or None")
		}
		x := int(i)
		if x < 0 {
			x += n
		}
		lo, hi := 0, n
		if step < 0 {
			lo, hi = -1, n-1
		}
		return min(max(x, lo), hi), nil
	}
	var lo, hi int
	var err error
	if step > 0 {
		lo, err = bound(b[0], 0)
		if err == nil {
			hi, err = bound(b[1], n)
		}
	} else {
		lo, err = bound(b[0], n-1)
		if err == nil {
			hi, err = bound(b[1], -1)
		}
	}
	if err != nil {
		return nil, err
	}
	var idx []int
	for i := lo; (step > 0 && i < hi) || (step < 0 && i > hi); i += step {
		idx = append(idx, i)
	}
	return idx, nil
}

func compare(op string, a, b Value) (bool, error) {
	switch op {
	case "==":
		return equal(a, b), nil
	case "!=":
		return !equal(a, b), nil
	case "<":
		return less(a, b)
	case ">":
		return less(b, a)
	case "<=":
		l, err := less(b, a)
		return !l, err
	case ">=":
		l, err := less(a, b)
		return !l, err
	case "in", "not in":
		ok, err := contains(b, a)
		return ok == (op == "in"), err
	}
	return false, errors("unknown comparison " + op)
}

func contains(container, v Value) (bool, error) {
	container, v = plain(container), plain(v)
	switch c := container.(type) {
	case string:
		s, ok := v.(string)
		if !ok {
			return false, errors("'in <string>' requires string as left operand, not " + typeName(v))
		}
		return strings.Contains(c, s), nil
	case *List:
		for _, it := range c.Items {
			if equal(it, v) {
				return true, nil
			}
		}
		return false, nil
	case *Dict:
		_, ok := c.get(v)
		return ok, nil
	case *namespace:
		s, _ := v.(string)
		_, ok := c.Get(s)
		return ok, nil
	case Undefined:
		return false, nil
	}
	return false, errors("argument of type '" + typeName(container) + "' is not iterable")
}

// iterate returns what a for loop over v visits.
func iterate(v Value) ([]Value, error) {
	switch x := plain(v).(type) {
	case *List:
		items := x.Items
		if x.generator {
			x.Items = nil // spent, as a Python generator is
		}
		return items, nil
	case *Dict:
		return append([]Value(nil), x.keys...), nil
	case string:
		out := make([]Value, 0, len(x))
		for _, r := range x {
			out = append(out, string(r))
		}
		return out, nil
	case Undefined:
		return nil, nil
	}
	return nil, errors("'" + typeName(v) + "' object is not iterable")
}

func arith(op string, a, b Value) (Value, error) {
	if op == "~" {
		return str(a) + str(b), nil
	}
	_, ma := a.(markup)
	_, mb := b.(markup)
	if op == "+" && (ma || mb) {
		x, okA := plain(a).(string)
		y, okB := plain(b).(string)
		if okA && okB {
			if !ma {
				x = escapeHTML(x)
			}
			if !mb {
				y = escapeHTML(y)
			}
			return markup(x + y), nil
		}
	}
	a, b = plain(a), plain(b)
	if op == "+" {
		if x, ok := a.(string); ok {
			if y, ok := b.(string); ok {
				return x + y, nil
			}
		}
		if x, ok := a.(*List); ok {
			if y, ok := b.(*List); ok {
				items := make([]Value, 0, len(x.Items)+len(y.Items))
				return &List{Items: append(append(items, x.Items...), y.Items...), tuple: x.tuple}, nil
			}
		}
	}
	if op == "*" {
		if s, ok := a.(string); ok {
			if n, ok := b.(int64); ok {
				if n <= 0 {
					return "", nil
				}
				if int64(len(s))*n > 1<<24 {
					return nil, errors("string repetition too large")
				}
				out := make([]byte, 0, int64(len(s))*n)
				for ; n > 0; n-- {
					out = append(out, s...)
				}
				return string(out), nil
			}
		}
	}
	if isUndefined(a) || isUndefined(b) {
		return nil, errors("unsupported operand: undefined")
	}
	x, okA := toInt(a)
	y, okB := toInt(b)
	if okA && okB && op != "/" {
		switch op {
		case "+":
			return x + y, nil
		case "-":
			return x - y, nil
		case "*":
			return x * y, nil
		case "//", "%":
			if y == 0 {
				return nil, errors("integer division or modulo by zero")
			}
			q, m := x/y, x%y
			if m != 0 && (m < 0) != (y < 0) {
				q--
				m += y
			}
			if op == "//" {
				return q, nil
			}
			return m, nil
		case "**":
			if y < 0 {
				return math.Pow(float64(x), float64(y)), nil
			}
			p := int64(1)
			for ; y > 0; y-- {
				p *= x
			}
			return p, nil
		}
	}
	fa, okA := number(a)
	fb, okB := number(b)
	if !okA || !okB {
		return nil, errors("unsupported operand type(s) for " + op + ": '" + typeName(a) + "' and '" + typeName(b) + "'")
	}
	switch op {
	case "+":
		return fa + fb, nil
	case "-":
		return fa - fb, nil
	case "*":
		return fa * fb, nil
	case "/":
		if fb == 0 {
			return nil, errors("division by zero")
		}
		return fa / fb, nil
	case "//":
		if fb == 0 {
			return nil, errors("float floor division by zero")
		}
		return math.Floor(fa / fb), nil
	case "%":
		if fb == 0 {
			return nil, errors("float modulo")
		}
		m := math.Mod(fa, fb)
		if m != 0 && (m < 0) != (fb < 0) {
			m += fb
		}
		return m, nil
	case "**":
		return math.Pow(fa, fb), nil
	}
	return nil, errors("unknown operator " + op)
}

// toInt returns v as an int when it is a Python int (or bool).
func toInt(v Value) (int64, bool) {
	switch x := v.(type) {
	case int64:
		return x, true
	case bool:
		if x {
			return 1, true
		}
		return 0, true
	}
	return 0, false
}

func getattr(v Value, name string) (Value, error) {
	switch x := plain(v).(type) {
	case Undefined:
		return nil, errors("'" + x.name + "' is undefined (reading ." + name + ")")
	case *Dict:
		if m := dictMethod(x, name); m != nil {
			return m, nil
		}
		if val, ok := x.Get(name); ok {
			return val, nil
		}
	case *namespace:
		if val, ok := x.Get(name); ok {
			return val, nil
		}
	case string:
		if m := stringMethod(x, name); m != nil {
			return m, nil
		}
	case *List:
		if m := listMethod(x, name); m != nil {
			return m, nil
		}
	case *loop:
		return x.attr(name)
	}
	return Undefined{name}, nil
}

func getitem(v Value, k Value) (Value, error) {
	v = plain(v)
	switch x := v.(type) {
	case Undefined:
		return nil, errors("'" + x.name + "' is undefined (reading an item)")
	case *Dict:
		if val, ok := x.get(k); ok {
			return val, nil
		}
	case *List:
		if i, ok := toInt(k); ok {
			if i < 0 {
				i += int64(len(x.Items))
			}
			if i >= 0 && i < int64(len(x.Items)) {
				return x.Items[i], nil
			}
			return Undefined{"index"}, nil
		}
	case string:
		if i, ok := toInt(k); ok {
			runes := []rune(x)
			if i < 0 {
				i += int64(len(runes))
			}
			if i >= 0 && i < int64(len(runes)) {
				return string(runes[i]), nil
			}
			return Undefined{"index"}, nil
		}
	}
	if s, ok := k.(string); ok {
		return getattr(v, s)
	}
	return Undefined{"item"}, nil
}

func (l *loop) attr(name string) (Value, error) {
	n := int64(len(l.items))
	i := int64(l.i)
	switch name {
	case "index":
		return i + 1, nil
	case "index0":
		return i, nil
	case "revindex":
		return n - i, nil
	case "revindex0":
		return n - i - 1, nil
	case "first":
		return i == 0, nil
	case "last":
		return i == n-1, nil
	case "length":
		return n, nil
	case "depth":
		return int64(1), nil
	case "depth0":
		return int64(0), nil
	case "previtem":
		if i > 0 {
			return l.items[i-1], nil
		}
	case "nextitem":
		if i+1 < n {
			return l.items[i+1], nil
		}
	case "cycle":
		return callable(func(c *call) (Value, error) {
			if len(c.args) == 0 {
				return nil, errors("no items for cycling given")
			}
			return c.args[l.i%len(c.args)], nil
		}), nil
	}
	return Undefined{"loop." + name}, nil
}
