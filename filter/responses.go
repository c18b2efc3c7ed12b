package main

import (
	"bytes"

	"github.com/cespare/xxhash/v2"
)

// A Responses API request that names a previous_response_id continues a
// conversation only the engine that served that response holds (vLLM
// keeps responses in its own memory and answers 404 elsewhere), so the
// filter learns which engine served each response, from the response's
// id, and pins the next request there. The pins share the sessions' table
// and expiry (session_ttl_ms).

// reasonResponse marks a request routed to the engine holding its
// previous response.
const reasonResponse = "response"

// responseHead bounds how much of a response's body is searched for its
// id: it is the body's first member, or its first event's.
const responseHead = 4096

// responseKey names a response id in the sessions table; the constant
// keeps it apart from the session header's values.
func responseKey(id string) uint64 { return xxhash.Sum64String(id) ^ 0x5e59_0a5e_1d00_0000 | 1 }

// responseID returns the value of the first "id" member in head (a JSON
// body, or server-sent events of JSON), if it is complete there.
func responseID(head []byte) ([]byte, bool) {
	for rest := head; ; {
		i := bytes.Index(rest, []byte(`"id"`))
		if i < 0 {
			return nil, false
		}
		rest = rest[i+4:]
		v := bytes.TrimLeft(rest, " \t\r\n")
		if len(v) == 0 || v[0] != ':' {
			continue
		}
		v = bytes.TrimLeft(v[1:], " \t\r\n")
		if len(v) == 0 || v[0] != '"' {
			return nil, false
		}
		end := bytes.IndexAny(v[1:], "\"\\")
		if end <= 0 || end > 256 || v[1+end] != '"' {
			return nil, false
		}
		return v[1 : 1+end], true
	}
}
