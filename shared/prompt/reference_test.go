package prompt

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
	"time"
)

// reference is testdata/reference.json: request bodies and what the real
// chat templates (e2e/vllmsim/templates) render for them under real Jinja2,
// written by testdata/render_reference.py.
type reference struct {
	// Now is the clock strftime_now read.
	Now   time.Time
	Cases []struct {
		Name string
		Body string
		Want map[string]struct {
			Text  *string
			Error string
		}
	}
}

func loadReference(t testing.TB) reference {
	t.Helper()
	return loadRenders(t, "testdata/reference.json")
}

// loadRenders reads a file of reference renders: reference.json, or
// harmony.json, written by testdata/render_harmony.py with the real
// openai-harmony encoder for the harmony template.
func loadRenders(t testing.TB, path string) reference {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var ref reference
	if err := json.Unmarshal(b, &ref); err != nil {
		t.Fatal(err)
	}
	if len(ref.Cases) == 0 {
		t.Fatal("no reference cases")
	}
	return ref
}

func TestRenderMatchesJinja(t *testing.T) {
	matchRenders(t, loadReference(t))
}

// TestRenderMatchesHarmony: what vLLM renders for gpt-oss, through
// openai-harmony.
func TestRenderMatchesHarmony(t *testing.T) {
	matchRenders(t, loadRenders(t, "testdata/harmony.json"))
}

func matchRenders(t *testing.T, ref reference) {
	for _, c := range ref.Cases {
		for family, want := range c.Want {
			t.Run(c.Name+"/"+family, func(t *testing.T) {
				tmpl, err := ParseTemplate(family)
				if err != nil {
					t.Fatal(err)
				}
				r := Renderer{Now: func() time.Time { return ref.Now }}
				p, err := r.Render(nil, []byte(c.Body), tmpl)
				if want.Text == nil {
					if !errors.Is(err, ErrTemplate) && !errors.Is(err, ErrMalformed) {
						t.Fatalf("Render = %q, %v; Jinja raised %s", p.Text, err, want.Error)
					}
					return
				}
				if err != nil {
					t.Fatalf("Render: %v", err)
				}
				if got := string(p.Text); got != *want.Text {
					t.Errorf("mismatch at byte %d\n got: %q\nwant: %q", firstDiff(got, *want.Text), got, *want.Text)
				}
			})
		}
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

// The same bodies, reindented, render the same text: rendering depends on
// the request, not its layout.
func TestRenderIgnoresLayout(t *testing.T) {
	for _, c := range loadReference(t).Cases {
		var buf bytes.Buffer
		if err := json.Indent(&buf, []byte(c.Body), " ", "\t"); err != nil {
			t.Fatal(err)
		}
		indented := buf.Bytes()
		for _, tmpl := range Templates() {
			a, errA := Render(nil, []byte(c.Body), tmpl)
			b, errB := Render(nil, indented, tmpl)
			if (errA == nil) != (errB == nil) || string(a.Text) != string(b.Text) {
				t.Errorf("%s/%s: layout changes the result: %v / %v", c.Name, tmpl, errA, errB)
			}
		}
	}
}

// A template given as source renders as the same template embedded: the
// general path is one path, whichever way the template arrives.
func TestCustomMatchesEmbedded(t *testing.T) {
	ref := loadReference(t)
	names := map[string]bool{}
	for tmpl, g := range generals {
		src, err := templateFS.ReadFile("templates/" + g.file)
		if err != nil {
			t.Fatal(err)
		}
		j, err := ParseJinja(string(src), g.special)
		if err != nil {
			t.Fatal(err)
		}
		if names[j.Name()] {
			t.Errorf("%v: name %s taken by another template", tmpl, j.Name())
		}
		names[j.Name()] = true
		for _, c := range ref.Cases {
			r := Renderer{Now: func() time.Time { return ref.Now }, Custom: j}
			got, errGot := r.Render(nil, []byte(c.Body), Custom)
			named := Renderer{Now: r.Now}
			want, errWant := named.Render(nil, []byte(c.Body), tmpl)
			if string(got.Text) != string(want.Text) || (errGot == nil) != (errWant == nil) {
				t.Errorf("%v/%s: custom %q (%v), embedded %q (%v)", tmpl, c.Name, got.Text, errGot, want.Text, errWant)
			}
		}
	}
	if j, _ := ParseJinja("{{ bos_token }}", map[string]string{"bos_token": "<s>"}); names[j.Name()] || len(j.Name()) != len(CustomPrefix)+16 {
		t.Errorf("name %q", j.Name())
	}
	if _, err := Render(nil, []byte(`{"messages":[{"role":"user","content":"x"}]}`), Custom); !errors.Is(err, ErrUnsupported) {
		t.Errorf("Custom without a source: %v, want ErrUnsupported", err)
	}
}

// A body of tens of thousands of empty messages runs out of the general
// path's budget and is refused, rather than holding the worker; a long
// real conversation does not.
func TestGeneralPathBudget(t *testing.T) {
	hostile := `{"messages":[` + strings.Repeat(`{"role":"user","content":""},`, 200_000) + `{"role":"user","content":"x"}]}`
	if _, err := Render(nil, []byte(hostile), DeepSeekV31); !errors.Is(err, ErrTemplate) || !strings.Contains(err.Error(), "budget") {
		t.Errorf("200,000 empty messages: %v, want ErrTemplate for the budget", err)
	}
	long := chatBody(8<<20, true) // 8,000 turns of 1 KiB
	if _, err := Render(nil, long, DeepSeekV31); err != nil {
		t.Errorf("8 MiB of real turns: %v", err)
	}
}
