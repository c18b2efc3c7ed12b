package jinja

import (
	"bytes"
	"encoding/json"
	"os"
	"testing"
	"time"
)

// cases is testdata/cases.json: templates, the variables each render got
// and what real Jinja2 rendered, written by testdata/render_cases.py.
type cases struct {
	Now       time.Time
	Templates map[string]string
	Cases     []struct {
		Template string
		Case     string
		Source   string
		Vars     json.RawMessage
		Text     *string
		Error    string
	}
}

func loadCases(t testing.TB) cases {
	t.Helper()
	path := "testdata/cases.json"
	if p := os.Getenv("JINJA_CASES"); p != "" {
		path = p // a wider set made with render_cases.py --dir
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var c cases
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	if len(c.Cases) == 0 {
		t.Fatal("no cases")
	}
	return c
}

// decode turns JSON into Values, keeping the order of keys as Python's
// dicts do and telling ints from floats as json.loads does.
func decode(t testing.TB, raw []byte) Value {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var value func() Value
	value = func() Value {
		tok, err := d.Token()
		if err != nil {
			t.Fatal(err)
		}
		switch x := tok.(type) {
		case json.Delim:
			if x == '[' {
				l := &List{}
				for d.More() {
					l.Items = append(l.Items, value())
				}
				d.Token()
				return l
			}
			m := NewDict(4)
			for d.More() {
				k, _ := d.Token()
				m.Set(k.(string), value())
			}
			d.Token()
			return m
		case json.Number:
			v, err := Number(x.String())
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
		return tok
	}
	return value()
}

func TestRenderMatchesJinja2(t *testing.T) {
	c := loadCases(t)
	parsed := map[string]*Template{}
	opts := &Options{Now: func() time.Time { return c.Now }}
	for _, tc := range c.Cases {
		t.Run(tc.Template+"/"+tc.Case, func(t *testing.T) {
			src := tc.Source
			if src == "" {
				src = c.Templates[tc.Template]
			}
			tmpl, ok := parsed[src]
			if !ok {
				var err error
				if tmpl, err = Parse(src); err != nil {
					if tc.Text == nil {
						return // Jinja2 refused it too (a filter or test it has not)
					}
					t.Fatalf("Parse: %v", err)
				}
				parsed[src] = tmpl
			}
			vars, _ := decode(t, tc.Vars).(*Dict)
			got, err := tmpl.Render(nil, vars, opts)
			if tc.Text == nil {
				if err == nil {
					t.Fatalf("rendered %q; Jinja2 raised %s", got, tc.Error)
				}
				return
			}
			if err != nil {
				t.Fatalf("Render: %v", err)
			}
			if string(got) != *tc.Text {
				i := firstDiff(string(got), *tc.Text)
				t.Errorf("differs at byte %d: got ...%q, want ...%q", i, tail(string(got), i), tail(*tc.Text, i))
			}
		})
	}
}

func firstDiff(a, b string) int {
	for i := 0; i < len(a) && i < len(b); i++ {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

func tail(s string, i int) string {
	lo := max(i-40, 0)
	return s[lo:min(len(s), i+60)]
}

// A template cannot run away with a worker: past its step budget, its
// output budget or the macro depth, a render fails.
func TestBudget(t *testing.T) {
	for _, src := range []string{
		"{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
		"{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}",
		"{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}",
	} {
		tmpl, err := Parse(src)
		if err != nil {
			t.Fatal(err)
		}
		if out, err := tmpl.Render(nil, nil, &Options{MaxSteps: 1_000_000, MaxOutput: 1 << 20}); err == nil {
			t.Errorf("%s rendered %d bytes", src, len(out))
		}
	}
}
