package prompt

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The harmony system message prints the engine's date in UTC, the day
// turning at midnight UTC whatever zone the clock reports in.
func TestHarmonyDate(t *testing.T) {
	body := []byte(`{"messages":[{"role":"user","content":"Hi"}]}`)
	tests := []struct {
		now  time.Time
		want string
	}{
		{time.Date(2026, 12, 31, 23, 59, 59, 0, time.UTC), "Current date: 2026-12-31\n"},
		{time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC), "Current date: 2027-01-01\n"},
		{time.Date(2027, 1, 1, 1, 0, 0, 0, time.FixedZone("EET", 2*3600)), "Current date: 2026-12-31\n"},
		{time.Date(2026, 3, 5, 12, 0, 0, 0, time.UTC), "Current date: 2026-03-05\n"},
	}
	for _, tc := range tests {
		r := Renderer{Now: func() time.Time { return tc.now }}
		p, err := r.Render(nil, body, Harmony)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(p.Text), tc.want) {
			t.Errorf("%v: %q lacks %q", tc.now, p.Text, tc.want)
		}
	}
}

func TestHarmonyReasoningEffort(t *testing.T) {
	tests := []struct {
		effort string
		want   string
		err    error
	}{
		{``, "Reasoning: medium", nil},
		{`,"reasoning_effort":null`, "Reasoning: medium", nil},
		{`,"reasoning_effort":"low"`, "Reasoning: low", nil},
		{`,"reasoning_effort":"high"`, "Reasoning: high", nil},
		{`,"reasoning_effort":"none"`, "", ErrTemplate},
		{`,"reasoning_effort":"max"`, "", ErrTemplate},
		{`,"reasoning_effort":5`, "", ErrMalformed},
	}
	for _, tc := range tests {
		body := `{"messages":[{"role":"user","content":"Hi"}]` + tc.effort + `}`
		p, err := Render(nil, []byte(body), Harmony)
		switch {
		case tc.err != nil && !errors.Is(err, tc.err):
			t.Errorf("%s: %v, want %v", body, err, tc.err)
		case tc.err == nil && (err != nil || !strings.Contains(string(p.Text), tc.want)):
			t.Errorf("%s: %q (%v), want %q", body, p.Text, err, tc.want)
		}
	}
}

func TestRustLines(t *testing.T) {
	tests := []struct {
		in   string
		want []string
	}{
		{"", nil},
		{"a", []string{"a"}},
		{"a\n", []string{"a"}},
		{"\n", []string{""}},
		{"a\r\nb\r\n", []string{"a", "b"}},
		{"a\n\nb\r", []string{"a", "", "b\r"}},
	}
	for _, tc := range tests {
		if got := rustLines(tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("rustLines(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// Each tool result is rendered from the function its tool_call_id names,
// the last call with that id, in a conversation of thousands of calls: the
// calls are walked once, not once per result.
func TestHarmonyToolResultNames(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"messages":[{"role":"user","content":"go"}`)
	const n = 5000
	for i := range n {
		id := strconv.Itoa(i % (n - 1)) // the last call reuses id 0
		fmt.Fprintf(&b, `,{"role":"assistant","tool_calls":[{"id":%q,"type":"function","function":{"name":"f%d","arguments":"{}"}}]}`, id, i)
		fmt.Fprintf(&b, `,{"role":"tool","tool_call_id":%q,"content":"r%d"}`, id, i)
	}
	b.WriteString(`,{"role":"tool","tool_call_id":"nobody","content":"orphan"}]}`)
	p, err := Render(nil, []byte(b.String()), Harmony)
	if err != nil {
		t.Fatal(err)
	}
	text := string(p.Text)
	for _, want := range []string{
		"<|start|>functions.f1 to=assistant<|channel|>commentary<|message|>r1<|end|>",
		"<|start|>functions.f4999 to=assistant<|channel|>commentary<|message|>r0<|end|>", // id 0's last call
		"<|start|>functions. to=assistant<|channel|>commentary<|message|>orphan<|end|>",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("render lacks %q", want)
		}
	}
	if strings.Contains(text, "functions.f0 to=assistant") {
		t.Error("a result of id 0 was named after its first call, not its last")
	}
}
