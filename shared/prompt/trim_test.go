package prompt

import (
	"strings"
	"testing"
)

// TestRendererTrim: a request of 100k messages grows the Renderer's scratch space
// to megabytes; Trim lets it go, and the Renderer still knows the
// request's model and renders the next one.
func TestRendererTrim(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"model":"m","messages":[`)
	for i := range 100_000 {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"role":"user","content":[{"type":"text","text":"hi \u00e9"}]}`)
	}
	b.WriteString(`]}`)
	var r Renderer
	if _, err := r.Render(nil, []byte(b.String()), ChatML); err != nil {
		t.Fatal(err)
	}
	if cap(r.msgs) <= keepItems || cap(r.parts) <= keepItems {
		t.Fatalf("100k messages kept only %d messages' and %d parts' room: the test no longer grows them", cap(r.msgs), cap(r.parts))
	}
	r.Trim()
	if cap(r.msgs) > keepItems || cap(r.parts) > keepItems || cap(r.s.arena) > keepBytes || r.s.b != nil {
		t.Errorf("after Trim: room for %d messages, %d parts, %d arena bytes, body kept %v", cap(r.msgs), cap(r.parts),
			cap(r.s.arena), r.s.b != nil)
	}
	if r.Model() != "m" {
		t.Errorf("after Trim the model is %q, want m", r.Model())
	}
	p, err := r.Render(nil, []byte(`{"model":"n","messages":[{"role":"user","content":"hello"}]}`), ChatML)
	if err != nil || !strings.Contains(string(p.Text), "hello") || p.Model != "n" {
		t.Fatalf("the next request: %q, %q, %v", p.Text, p.Model, err)
	}
	// An ordinary request's room is kept: trimming it would allocate anew
	// on every request.
	msgs := cap(r.msgs)
	r.Trim()
	if cap(r.msgs) != msgs || msgs == 0 {
		t.Errorf("an ordinary request's room went: %d messages' before Trim, %d after", msgs, cap(r.msgs))
	}
}
