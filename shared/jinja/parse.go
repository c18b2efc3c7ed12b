package jinja

import (
	"strconv"
)

// Statements.
type (
	node interface{}

	textNode   struct{ s string }
	outputNode struct {
		x    expr
		line int
	}
	ifNode struct {
		conds  []expr
		bodies [][]node
		els    []node
		line   int
	}
	forNode struct {
		targets []string
		iter    expr
		cond    expr
		body    []node
		els     []node
		line    int
	}
	setNode struct {
		targets []string // one name, or several to unpack into
		attr    string   // set targets[0].attr (a namespace's)
		x       expr
		body    []node // {% set x %}...{% endset %}, when x is nil
		line    int
	}
	filterNode struct {
		x    expr // the filters, reading the body's output as filterInput
		body []node
		line int
	}
	macroNode struct {
		name     string
		params   []string
		defaults []expr // aligned with params; nil where none
		body     []node
	}
	loopControl struct{ brk bool }
)

// Expressions.
type (
	expr interface{}

	literal  struct{ v Value }
	nameRef  struct{ name string }
	attrExpr struct {
		x    expr
		name string
	}
	itemExpr  struct{ x, key expr }
	sliceExpr struct{ x, lo, hi, step expr }
	callExpr  struct {
		fn   expr
		args []expr
		kw   []kwarg
	}
	filterExpr struct {
		x    expr
		name string
		f    callable // resolved when parsed, as Jinja2 does; nil: unknown
		args []expr
		kw   []kwarg
	}
	testExpr struct {
		x      expr
		name   string
		t      test // resolved when parsed; nil: unknown
		args   []expr
		negate bool
	}
	binExpr struct {
		op   string
		l, r expr
	}
	notExpr struct{ x expr }
	negExpr struct{ x expr }
	andExpr struct{ l, r expr }
	orExpr  struct{ l, r expr }
	cmpExpr struct {
		first expr
		ops   []string
		rest  []expr
	}
	condExpr struct{ cond, yes, no expr }
	listExpr struct {
		items []expr
		tuple bool
	}
	dictExpr struct{ keys, vals []expr }
)

type kwarg struct {
	name string
	x    expr
}

type parser struct {
	toks []token
	i    int
	// inIf counts the if statements being parsed. Inside one, Jinja2
	// defers an unknown filter or test to when it is reached (templates
	// guard filters other engines add), so the parser does too.
	inIf int
}

func (p *parser) peek() token { return p.toks[p.i] }

func (p *parser) next() token {
	t := p.toks[p.i]
	if t.kind != tEOF {
		p.i++
	}
	return t
}

func (p *parser) isOp(op string) bool {
	t := p.peek()
	return t.kind == tOp && t.s == op
}

func (p *parser) isName(name string) bool {
	t := p.peek()
	return t.kind == tName && t.s == name
}

func (p *parser) accept(op string) bool {
	if p.isOp(op) {
		p.i++
		return true
	}
	return false
}

func (p *parser) expect(op string) error {
	if !p.accept(op) {
		return p.fail("expected " + strconv.Quote(op))
	}
	return nil
}

func (p *parser) fail(msg string) error {
	t := p.peek()
	got := t.s
	switch t.kind {
	case tEnd:
		got = "end of tag"
	case tEOF:
		got = "end of template"
	}
	return errAt(t.line, msg+", got "+strconv.Quote(got))
}

func (p *parser) ident() (string, error) {
	t := p.peek()
	if t.kind != tName {
		return "", p.fail("expected a name")
	}
	p.i++
	return t.s, nil
}

func (p *parser) end() error {
	if p.peek().kind != tEnd {
		return p.fail("expected end of tag")
	}
	p.i++
	return nil
}

// body parses nodes up to a block tag whose keyword is one of stops,
// consumes that keyword and returns it.
func (p *parser) body(stops ...string) ([]node, string, error) {
	var out []node
	for {
		t := p.next()
		switch t.kind {
		case tData:
			out = append(out, &textNode{t.s})
		case tVar:
			x, err := p.expr()
			if err != nil {
				return nil, "", err
			}
			if err := p.end(); err != nil {
				return nil, "", err
			}
			out = append(out, &outputNode{x, t.line})
		case tBlock:
			kw, err := p.ident()
			if err != nil {
				return nil, "", err
			}
			for _, s := range stops {
				if kw == s {
					return out, kw, nil
				}
			}
			n, err := p.statement(kw, t.line)
			if err != nil {
				return nil, "", err
			}
			if n != nil {
				out = append(out, n)
			}
		case tEOF:
			if len(stops) == 0 {
				return out, "", nil
			}
			return nil, "", errAt(t.line, "missing {% "+stops[len(stops)-1]+" %}")
		default:
			return nil, "", errAt(t.line, "unexpected token")
		}
	}
}

func (p *parser) statement(kw string, line int) (node, error) {
	switch kw {
	case "if":
		return p.ifStmt(line)
	case "for":
		return p.forStmt(line)
	case "set":
		return p.setStmt(line)
	case "filter":
		return p.filterStmt(line)
	case "macro":
		return p.macroStmt()
	case "break", "continue":
		return &loopControl{brk: kw == "break"}, p.end()
	case "generation":
		// transformers' AssistantTracker marks assistant text; it prints
		// its body unchanged.
		if err := p.end(); err != nil {
			return nil, err
		}
		body, _, err := p.body("endgeneration")
		if err != nil {
			return nil, err
		}
		return &ifNode{conds: []expr{&literal{true}}, bodies: [][]node{body}}, p.end()
	}
	return nil, errAt(line, "unsupported tag "+strconv.Quote(kw))
}

func (p *parser) ifStmt(line int) (node, error) {
	p.inIf++
	defer func() { p.inIf-- }()
	n := &ifNode{line: line}
	for {
		cond, err := p.expr()
		if err != nil {
			return nil, err
		}
		if err := p.end(); err != nil {
			return nil, err
		}
		body, kw, err := p.body("elif", "else", "endif")
		if err != nil {
			return nil, err
		}
		n.conds = append(n.conds, cond)
		n.bodies = append(n.bodies, body)
		switch kw {
		case "else":
			if err := p.end(); err != nil {
				return nil, err
			}
			n.els, _, err = p.body("endif")
			if err != nil {
				return nil, err
			}
			return n, p.end()
		case "endif":
			return n, p.end()
		}
	}
}

func (p *parser) forStmt(line int) (node, error) {
	n := &forNode{line: line}
	for {
		name, err := p.ident()
		if err != nil {
			return nil, err
		}
		n.targets = append(n.targets, name)
		if !p.accept(",") {
			break
		}
	}
	if !p.isName("in") {
		return nil, p.fail("expected \"in\"")
	}
	p.i++
	var err error
	// The iterable and the filter take no conditional expression.
	if n.iter, err = p.or(); err != nil {
		return nil, err
	}
	if p.isName("if") {
		p.i++
		if n.cond, err = p.or(); err != nil {
			return nil, err
		}
	}
	if p.isName("recursive") {
		return nil, p.fail("recursive loops are not supported")
	}
	if err := p.end(); err != nil {
		return nil, err
	}
	body, kw, err := p.body("else", "endfor")
	if err != nil {
		return nil, err
	}
	n.body = body
	if kw == "else" {
		if err := p.end(); err != nil {
			return nil, err
		}
		if n.els, _, err = p.body("endfor"); err != nil {
			return nil, err
		}
	}
	return n, p.end()
}

func (p *parser) setStmt(line int) (node, error) {
	n := &setNode{line: line}
	name, err := p.ident()
	if err != nil {
		return nil, err
	}
	n.targets = []string{name}
	if p.accept(".") {
		if n.attr, err = p.ident(); err != nil {
			return nil, err
		}
	} else {
		for p.accept(",") {
			name, err := p.ident()
			if err != nil {
				return nil, err
			}
			n.targets = append(n.targets, name)
		}
	}
	if p.peek().kind == tEnd && len(n.targets) == 1 {
		p.i++
		if n.body, _, err = p.body("endset"); err != nil {
			return nil, err
		}
		return n, p.end()
	}
	if err := p.expect("="); err != nil {
		return nil, err
	}
	if n.x, err = p.tuple(); err != nil {
		return nil, err
	}
	return n, p.end()
}

// filterStmt parses {% filter name(args)|more %}...{% endfilter %}: the
// filters apply to the body's output, which they read as filterInput.
func (p *parser) filterStmt(line int) (node, error) {
	f, err := p.filter(&nameRef{filterInput})
	if err != nil {
		return nil, err
	}
	x, err := p.filters(f)
	if err != nil {
		return nil, err
	}
	if err := p.end(); err != nil {
		return nil, err
	}
	body, _, err := p.body("endfilter")
	if err != nil {
		return nil, err
	}
	return &filterNode{x: x, body: body, line: line}, p.end()
}

// filterInput names the output of a filter block's body; no template's
// name can clash with it, as names cannot hold a space.
const filterInput = "filter input"

func (p *parser) macroStmt() (node, error) {
	n := &macroNode{}
	var err error
	if n.name, err = p.ident(); err != nil {
		return nil, err
	}
	if err := p.expect("("); err != nil {
		return nil, err
	}
	for !p.accept(")") {
		if len(n.params) > 0 {
			if err := p.expect(","); err != nil {
				return nil, err
			}
			if p.accept(")") {
				break
			}
		}
		name, err := p.ident()
		if err != nil {
			return nil, err
		}
		var def expr
		if p.accept("=") {
			if def, err = p.expr(); err != nil {
				return nil, err
			}
		}
		n.params = append(n.params, name)
		n.defaults = append(n.defaults, def)
	}
	if err := p.end(); err != nil {
		return nil, err
	}
	if n.body, _, err = p.body("endmacro"); err != nil {
		return nil, err
	}
	if p.peek().kind == tName {
		p.i++ // {% endmacro name %}
	}
	return n, p.end()
}

// tuple parses an expression, or several separated by commas as a tuple
// (the right side of a set).
func (p *parser) tuple() (expr, error) {
	x, err := p.expr()
	if err != nil || !p.isOp(",") {
		return x, err
	}
	t := &listExpr{items: []expr{x}, tuple: true}
	for p.accept(",") {
		if p.peek().kind == tEnd {
			break
		}
		x, err := p.expr()
		if err != nil {
			return nil, err
		}
		t.items = append(t.items, x)
	}
	return t, nil
}

func (p *parser) expr() (expr, error) {
	x, err := p.or()
	if err != nil || !p.isName("if") {
		return x, err
	}
	p.i++
	cond, err := p.or()
	if err != nil {
		return nil, err
	}
	c := &condExpr{cond: cond, yes: x}
	if p.isName("else") {
		p.i++
		if c.no, err = p.expr(); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func (p *parser) or() (expr, error) {
	l, err := p.and()
	for err == nil && p.isName("or") {
		p.i++
		var r expr
		if r, err = p.and(); err == nil {
			l = &orExpr{l, r}
		}
	}
	return l, err
}

func (p *parser) and() (expr, error) {
	l, err := p.not()
	for err == nil && p.isName("and") {
		p.i++
		var r expr
		if r, err = p.not(); err == nil {
			l = &andExpr{l, r}
		}
	}
	return l, err
}

func (p *parser) not() (expr, error) {
	if p.isName("not") {
		p.i++
		x, err := p.not()
		return &notExpr{x}, err
	}
	return p.compare()
}

func (p *parser) compare() (expr, error) {
	x, err := p.math1()
	if err != nil {
		return nil, err
	}
	c := &cmpExpr{first: x}
	for {
		t := p.peek()
		var op string
		switch {
		case t.kind == tOp && (t.s == "==" || t.s == "!=" || t.s == "<" || t.s == "<=" || t.s == ">" || t.s == ">="):
			op = t.s
			p.i++
		case t.kind == tName && t.s == "in":
			op = "in"
			p.i++
		case t.kind == tName && t.s == "not" && p.toks[p.i+1].kind == tName && p.toks[p.i+1].s == "in":
			op = "not in"
			p.i += 2
		default:
			if len(c.ops) == 0 {
				return x, nil
			}
			return c, nil
		}
		r, err := p.math1()
		if err != nil {
			return nil, err
		}
		c.ops = append(c.ops, op)
		c.rest = append(c.rest, r)
	}
}

func (p *parser) math1() (expr, error) {
	l, err := p.concat()
	for err == nil && (p.isOp("+") || p.isOp("-")) {
		op := p.next().s
		var r expr
		if r, err = p.concat(); err == nil {
			l = &binExpr{op, l, r}
		}
	}
	return l, err
}

func (p *parser) concat() (expr, error) {
	l, err := p.math2()
	for err == nil && p.isOp("~") {
		p.i++
		var r expr
		if r, err = p.math2(); err == nil {
			l = &binExpr{"~", l, r}
		}
	}
	return l, err
}

func (p *parser) math2() (expr, error) {
	l, err := p.pow()
	for err == nil && (p.isOp("*") || p.isOp("/") || p.isOp("//") || p.isOp("%")) {
		op := p.next().s
		var r expr
		if r, err = p.pow(); err == nil {
			l = &binExpr{op, l, r}
		}
	}
	return l, err
}

func (p *parser) pow() (expr, error) {
	l, err := p.unary(true)
	for err == nil && p.isOp("**") {
		p.i++
		var r expr
		if r, err = p.unary(true); err == nil {
			l = &binExpr{"**", l, r}
		}
	}
	return l, err
}

func (p *parser) unary(withFilter bool) (expr, error) {
	var x expr
	var err error
	switch {
	case p.isOp("-"):
		p.i++
		var y expr
		if y, err = p.unary(false); err == nil {
			x = &negExpr{y}
		}
	case p.isOp("+"):
		p.i++
		x, err = p.unary(false)
	default:
		if x, err = p.primary(); err == nil {
			x, err = p.postfix(x)
		}
	}
	if err != nil || !withFilter {
		return x, err
	}
	return p.filters(x)
}

func (p *parser) primary() (expr, error) {
	t := p.next()
	switch t.kind {
	case tName:
		switch t.s {
		case "true", "True":
			return &literal{true}, nil
		case "false", "False":
			return &literal{false}, nil
		case "none", "None":
			return &literal{nil}, nil
		}
		return &nameRef{t.s}, nil
	case tString:
		s := t.s
		for p.peek().kind == tString {
			s += p.next().s
		}
		return &literal{s}, nil
	case tInt:
		v, err := strconv.ParseInt(t.s, 10, 64)
		if err != nil {
			return nil, errAt(t.line, "integer literal out of range")
		}
		return &literal{v}, nil
	case tFloat:
		v, err := strconv.ParseFloat(t.s, 64)
		if err != nil {
			return nil, errAt(t.line, "bad float literal")
		}
		return &literal{v}, nil
	case tOp:
		switch t.s {
		case "(":
			if p.accept(")") {
				return &listExpr{tuple: true}, nil
			}
			x, err := p.expr()
			if err != nil {
				return nil, err
			}
			if p.isOp(",") {
				l := &listExpr{items: []expr{x}, tuple: true}
				for p.accept(",") && !p.isOp(")") {
					y, err := p.expr()
					if err != nil {
						return nil, err
					}
					l.items = append(l.items, y)
				}
				x = l
			}
			return x, p.expect(")")
		case "[":
			l := &listExpr{}
			for !p.accept("]") {
				if len(l.items) > 0 {
					if err := p.expect(","); err != nil {
						return nil, err
					}
					if p.accept("]") {
						break
					}
				}
				x, err := p.expr()
				if err != nil {
					return nil, err
				}
				l.items = append(l.items, x)
			}
			return l, nil
		case "{":
			d := &dictExpr{}
			for !p.accept("}") {
				if len(d.keys) > 0 {
					if err := p.expect(","); err != nil {
						return nil, err
					}
					if p.accept("}") {
						break
					}
				}
				k, err := p.expr()
				if err != nil {
					return nil, err
				}
				if err := p.expect(":"); err != nil {
					return nil, err
				}
				v, err := p.expr()
				if err != nil {
					return nil, err
				}
				d.keys = append(d.keys, k)
				d.vals = append(d.vals, v)
			}
			return d, nil
		}
	}
	p.i--
	return nil, p.fail("unexpected token")
}

func (p *parser) postfix(x expr) (expr, error) {
	for {
		switch {
		case p.accept("."):
			t := p.next()
			switch t.kind {
			case tName:
				x = &attrExpr{x, t.s}
			case tInt:
				v, _ := strconv.ParseInt(t.s, 10, 64)
				x = &itemExpr{x, &literal{v}}
			default:
				p.i--
				return nil, p.fail("expected an attribute name")
			}
		case p.accept("["):
			var parts [3]expr
			n, colons := 0, 0
			for !p.accept("]") {
				switch {
				case p.accept(":"):
					colons++
					n++
					if n > 2 {
						return nil, p.fail("bad slice")
					}
				default:
					y, err := p.expr()
					if err != nil {
						return nil, err
					}
					parts[n] = y
				}
			}
			if colons == 0 {
				if parts[0] == nil {
					return nil, p.fail("empty subscript")
				}
				x = &itemExpr{x, parts[0]}
			} else {
				x = &sliceExpr{x, parts[0], parts[1], parts[2]}
			}
		case p.isOp("("):
			args, kw, err := p.args()
			if err != nil {
				return nil, err
			}
			x = &callExpr{x, args, kw}
		default:
			return x, nil
		}
	}
}

// args parses a parenthesised argument list.
func (p *parser) args() ([]expr, []kwarg, error) {
	if err := p.expect("("); err != nil {
		return nil, nil, err
	}
	var args []expr
	var kw []kwarg
	for !p.accept(")") {
		if len(args)+len(kw) > 0 {
			if err := p.expect(","); err != nil {
				return nil, nil, err
			}
			if p.accept(")") {
				break
			}
		}
		if t := p.peek(); t.kind == tName && p.toks[p.i+1].kind == tOp && p.toks[p.i+1].s == "=" {
			p.i += 2
			x, err := p.expr()
			if err != nil {
				return nil, nil, err
			}
			kw = append(kw, kwarg{t.s, x})
			continue
		}
		x, err := p.expr()
		if err != nil {
			return nil, nil, err
		}
		args = append(args, x)
	}
	return args, kw, nil
}

func (p *parser) filters(x expr) (expr, error) {
	for {
		switch {
		case p.accept("|"):
			f, err := p.filter(x)
			if err != nil {
				return nil, err
			}
			x = f
		case p.isName("is"):
			p.i++
			t := &testExpr{x: x}
			if p.isName("not") {
				p.i++
				t.negate = true
			}
			line := p.peek().line
			name, err := p.dottedName()
			if err != nil {
				return nil, err
			}
			t.name = name
			if t.t = tests[name]; t.t == nil && p.inIf == 0 {
				return nil, errAt(line, "no test named "+strconv.Quote(name))
			}
			switch nt := p.peek(); {
			case p.isOp("("):
				var kw []kwarg
				if t.args, kw, err = p.args(); err != nil {
					return nil, err
				}
				if len(kw) > 0 {
					return nil, p.fail("keyword arguments to a test")
				}
			case nt.kind == tString || nt.kind == tInt || nt.kind == tFloat || nt.kind == tOp && (nt.s == "[" || nt.s == "{") ||
				nt.kind == tName && nt.s != "else" && nt.s != "or" && nt.s != "and" && nt.s != "if" && nt.s != "is" && nt.s != "in" && nt.s != "not":
				// A test's single argument without parentheses:
				// "x is divisibleby 3", "x is sameas none".
				y, err := p.unary(false)
				if err != nil {
					return nil, err
				}
				t.args = []expr{y}
			}
			x = t
		default:
			return x, nil
		}
	}
}

// filter parses a filter's name and arguments, applied to x.
func (p *parser) filter(x expr) (*filterExpr, error) {
	line := p.peek().line
	name, err := p.dottedName()
	if err != nil {
		return nil, err
	}
	f := &filterExpr{x: x, name: name, f: filters[name]}
	if f.f == nil && p.inIf == 0 {
		return nil, errAt(line, "no filter named "+strconv.Quote(name))
	}
	if p.isOp("(") {
		if f.args, f.kw, err = p.args(); err != nil {
			return nil, err
		}
	}
	return f, nil
}

func (p *parser) dottedName() (string, error) {
	name, err := p.ident()
	for err == nil && p.isOp(".") {
		p.i++
		var more string
		if more, err = p.ident(); err == nil {
			name += "." + more
		}
	}
	return name, err
}
