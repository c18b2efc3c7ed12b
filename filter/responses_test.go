package main

import "testing"

func TestResponseID(t *testing.T) {
	for _, tc := range []struct {
		head, want string
		ok         bool
	}{
		{`{"id":"resp_abc","object":"response"}`, "resp_abc", true},
		{`{ "id" : "resp_1" }`, "resp_1", true},
		{"event: response.created\ndata: {\"response\":{\"id\":\"resp_x\",\"created_at\":1},\"type\":\"response.created\"}", "resp_x", true},
		{`{"item_id":"msg_1","id":"resp_2"}`, "resp_2", true},
		{`{"text":"the \"id\" is","id":"resp_3"}`, "resp_3", true},
		{`{"id":"resp_trunc`, "", false},
		{`{"id":12}`, "", false},
		{`{"id":"a\"b"}`, "", false},
		{`{"id":""}`, "", false},
		{`{"object":"response"}`, "", false},
		{``, "", false},
	} {
		got, ok := responseID([]byte(tc.head))
		if ok != tc.ok || string(got) != tc.want {
			t.Errorf("responseID(%q) = %q, %v; want %q, %v", tc.head, got, ok, tc.want, tc.ok)
		}
	}
}
