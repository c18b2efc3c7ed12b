package main

import (
	"encoding/json"
	"testing"
)

func TestWithSlot(t *testing.T) {
	cases := []struct {
		body, want string
		ok         bool
	}{
		{`{"model":"m","prompt":"hi"}`, `{"model":"m","prompt":"hi","id_slot":3}`, true},
		{"  {\"prompt\":\"}\"}\n\n", "  {\"prompt\":\"}\",\"id_slot\":3}\n\n", true},
		{`{}`, `{"id_slot":3}`, true},
		{"{ \n }", "{ \n \"id_slot\":3}", true},
		// A client's own id_slot is overridden: the last of two keys wins.
		{`{"id_slot":0,"prompt":"x"}`, `{"id_slot":0,"prompt":"x","id_slot":3}`, true},
		{`[1,2]`, ``, false},
		{`{`, ``, false},
		{``, ``, false},
		{`"}"`, ``, false},
	}
	for _, c := range cases {
		got, ok := withSlot(nil, []byte(c.body), 3)
		if ok != c.ok || (ok && string(got) != c.want) {
			t.Errorf("withSlot(%q) = %q, %v; want %q, %v", c.body, got, ok, c.want, c.ok)
			continue
		}
		if !ok {
			continue
		}
		var v map[string]any
		if err := json.Unmarshal(got, &v); err != nil {
			t.Errorf("withSlot(%q) = %q, not JSON: %v", c.body, got, err)
		} else if v["id_slot"] != 3.0 {
			t.Errorf("withSlot(%q) decodes id_slot as %v", c.body, v["id_slot"])
		}
	}
}
