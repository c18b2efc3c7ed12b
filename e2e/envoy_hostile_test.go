package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// hostileCase is one body of the hostile-input corpus and what the filter
// must make of it. Whatever it is, the body reaches an engine unchanged
// and the client gets the engine's answer.
type hostileCase struct {
	name    string
	body    func() []byte
	outcome string // the kvroute.requests.* counter it moves
}

// hostileCorpus is the committed corpus: bodies that break naive parsers
// and bodies that are merely odd. The large ones are generated, so that the
// repository does not carry 50 MB of them.
func hostileCorpus() []hostileCase {
	lit := func(s string) func() []byte { return func() []byte { return []byte(s) } }
	return []hostileCase{
		{"nesting 100k deep", func() []byte {
			return []byte(user(strings.Repeat("[", 100_000) + strings.Repeat("]", 100_000)))
		}, "invalid_body"},
		{"object nesting 100k deep", func() []byte {
			return []byte(user(`"x"}],"x":` + strings.Repeat(`{"a":`, 100_000) + "1" + strings.Repeat("}", 100_000) + `,"y":[{"z":"`))
		}, "invalid_body"},
		{"million-element array", func() []byte {
			return []byte(`{"model":"qwen","extra":[` + strings.TrimSuffix(strings.Repeat("0,", 1_000_000), ",") + `],"messages":[{"role":"user","content":"hi"}]}`)
		}, "routed"},
		// Routed, as encoding/json.Valid accepts it (the engine's Python
		// answers 400): the filter's parser takes what Go's JSON takes.
		{"invalid UTF-8 in a string", lit(user("\"caf\xc3\x28 \xff\xfe\"")), "routed"},
		{"raw NUL in a string", lit(user("\"a\x00b\"")), "invalid_body"},
		{"escaped NUL", lit(user(`"a\u0000b"`)), "routed"},
		{"NUL after the body", lit(user(`"hi"`) + "\x00"), "invalid_body"},
		{"lone surrogates", lit(user(`"\ud800 and \udfff and \ud83d"`)), "routed"},
		{"bad escape", lit(user(`"\x41\q"`)), "invalid_body"},
		{"duplicate keys", lit(`{"model":"other","messages":[{"role":"user","content":"a"}],"model":"qwen","messages":[{"role":"user","content":"b","role":"system"}]}`), "routed"},
		{"huge numbers", lit(`{"model":"qwen","max_tokens":1e400,"temperature":-123456789012345678901234567890e-99999,"messages":[{"role":"user","content":"hi"}]}`), "routed"},
		{"100k messages", func() []byte {
			var b bytes.Buffer
			b.WriteString(`{"model":"qwen","messages":[`)
			for i := range 100_000 {
				if i > 0 {
					b.WriteByte(',')
				}
				role := "user"
				if i%2 == 1 {
					role = "assistant"
				}
				b.WriteString(`{"role":"` + role + `","content":"turn ` + strconv.Itoa(i) + `"}`)
			}
			b.WriteString(`]}`)
			return b.Bytes()
		}, "routed"},
		{"unknown content part types", lit(user(`[{"type":"hologram","hologram":{"url":"x"}},{"type":"text","text":"hi"}]`)), "invalid_body"},
		{"content of the wrong type", lit(user(`{"text":"hi"}`)), "invalid_body"},
		{"messages not an array", lit(`{"model":"qwen","messages":"hi"}`), "invalid_body"},
		{"empty messages", lit(`{"model":"qwen","messages":[]}`), "no_prompt"},
		{"empty body", lit(``), "no_prompt"},
		{"JSON array body", lit(`[{"model":"qwen"}]`), "invalid_body"},
		{"model of the wrong type", lit(`{"model":["qwen"],"messages":[{"role":"user","content":"hi"}]}`), "routed"},
		{"BOM before the body", lit("\xef\xbb\xbf" + user(`"hi"`)), "invalid_body"},
		{"50 MB body", func() []byte { return []byte(user(`"` + strings.Repeat("z", 50<<20) + `"`)) }, "body_too_large"},
	}
}

// TestEnvoyHostileInput sends the corpus through the shipped envoy.yaml in
// real Envoy, three times over, over HTTP/1.1 and HTTP/2, plus a body
// trickled a byte at a time. Every request is answered by an engine with
// its body intact, every one moves the counter its case names, no VM fails,
// and the VM's live heap does not grow after the first round.
func TestEnvoyHostileInput(t *testing.T) {
	skipUnderRace(t)
	ups := startUpstreams(t, 3)
	members := addrs(ups)
	// One worker: the heap measured is one VM's, which meets every body
	// in the first round (other tests run two workers).
	g := startGateway(t, gatewayConfig(t, members, nil), 1)
	corpus := hostileCorpus()
	bodies := make([][]byte, len(corpus))
	for i, c := range corpus {
		bodies[i] = c.body()
	}
	h2 := &http.Client{Transport: &http.Transport{Protocols: unencryptedHTTP2(), TLSClientConfig: &tls.Config{}}, Timeout: time.Minute}
	statsBefore, err := g.envoy.Stats(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var heaps []int64
	sent := 0
	for round := range 3 {
		for _, proto := range []struct {
			name   string
			client *http.Client
		}{{"HTTP/1.1", g.client}, {"HTTP/2.0", h2}} {
			for i, c := range corpus {
				before := g.counters(t)
				r, status, gotProto, err := postRaw(proto.client, g.url+"/v1/chat/completions", bodies[i])
				sent++
				switch {
				case err != nil:
					t.Errorf("%s over %s: %v", c.name, proto.name, err)
					continue
				case status != http.StatusOK || !contains(members, r.Server):
					t.Errorf("%s over %s: status %d from %q, want the engine's 200", c.name, proto.name, status, r.Server)
				case r.BodySHA256 != sha(bodies[i]):
					t.Errorf("%s over %s: %d of %d body bytes arrived, or they changed", c.name, proto.name, r.BodyBytes, len(bodies[i]))
				case gotProto != proto.name:
					t.Errorf("%s: sent over %s, went over %s", c.name, proto.name, gotProto)
				}
				if moved := movedCounters(before, g.counters(t)); moved != c.outcome+" +1" {
					t.Errorf("%s over %s: kvroute.requests moved %q, want %s +1", c.name, proto.name, moved, c.outcome)
				}
			}
		}
		// The VM publishes its heap every 64 streams: small requests
		// make it publish after the round.
		for range 160 {
			g.do(t, http.MethodGet, "/v1/models", nil, http.Header{"Connection": {"close"}})
		}
		stats, err := g.envoy.Stats(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		heaps = append(heaps, stats["wasmcustom.kvroute.vm.heap_bytes"])
		if round == 0 {
			t.Logf("round 1: %d requests, live heap of the VM %.1f MiB", sent, float64(heaps[0])/(1<<20))
		}
	}

	// One body a byte per 100 ms, 10 s in all, past hold_timeout_ms (5 s,
	// which frees a request whose body never begins): routed once it is
	// all there, and sent on exactly once. (Resuming the stream mid-body
	// made Envoy send the bytes buffered so far twice.)
	before := g.counters(t)
	slow := []byte(user(`"` + strings.Repeat("s", 40) + `"`))
	pr, pw := io.Pipe()
	go func() {
		for i := range slow {
			if _, err := pw.Write(slow[i : i+1]); err != nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		pw.Close()
	}()
	req, _ := http.NewRequest(http.MethodPost, g.url+"/v1/chat/completions", pr)
	req.ContentLength = -1
	if resp, err := g.client.Do(req); err != nil {
		t.Errorf("trickled body: %v", err)
	} else {
		var r reply
		if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || resp.StatusCode != http.StatusOK || r.BodySHA256 != sha(slow) || r.Destination == "" {
			t.Errorf("trickled body: status %d, %d of %d bytes arrived, destination %q, decode %v", resp.StatusCode, r.BodyBytes, len(slow), r.Destination, err)
		}
		resp.Body.Close()
	}
	if moved := movedCounters(before, g.counters(t)); moved != "routed +1" {
		t.Errorf("trickled body: kvroute.requests moved %q, want routed +1", moved)
	}

	stats, err := g.envoy.Stats(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"wasm.kvroute.vm_reload", "wasm.kvroute.vm_reload_failure", "wasm.envoy.wasm.runtime.v8.created"} {
		if d := stats[name] - statsBefore[name]; d != 0 {
			t.Errorf("%s rose by %d", name, d)
		}
	}
	if f := g.envoy.WasmFailures(); len(f) > 0 {
		t.Errorf("Envoy logged Wasm failures:\n%s", strings.Join(f, "\n"))
	}
	// After the first round the VM holds the buffers the largest bodies
	// grew; later rounds must leave its heap where they found it: within
	// 10%, and a few MiB of garbage the GC has not swept yet.
	t.Logf("%d corpus requests; live heap of the VM after each round: %.1f, %.1f, %.1f MiB", sent,
		float64(heaps[0])/(1<<20), float64(heaps[1])/(1<<20), float64(heaps[2])/(1<<20))
	for i := 1; i < len(heaps); i++ {
		if heaps[i] > heaps[0]+heaps[0]/10+(4<<20) {
			t.Errorf("the VM's live heap grew from %d bytes after round 1 to %d after round %d", heaps[0], heaps[i], i+1)
		}
	}
}

// movedCounters describes which kvroute.requests.* counters changed.
func movedCounters(before, after map[string]int64) string {
	var out []string
	for k, v := range after {
		if d := v - before[k]; d != 0 {
			out = append(out, k+" +"+strconv.FormatInt(d, 10))
		}
	}
	slices.Sort(out)
	return strings.Join(out, ", ")
}

// user is a chat body with one user message of the given JSON content.
func user(content string) string {
	return `{"model":"qwen","messages":[{"role":"user","content":` + content + `}]}`
}

// unencryptedHTTP2 makes a Transport speak HTTP/2 with prior knowledge over
// plain TCP, as Envoy's listener accepts it.
func unencryptedHTTP2() *http.Protocols {
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	return &p
}

// postRaw posts body and decodes the upstream's reply.
func postRaw(c *http.Client, url string, body []byte) (reply, int, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return reply{}, 0, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return reply{}, 0, "", err
	}
	defer resp.Body.Close()
	var r reply
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return r, resp.StatusCode, resp.Proto, err
	}
	if err := json.Unmarshal(data, &r); err != nil {
		return r, resp.StatusCode, resp.Proto, fmt.Errorf("reply %q: %w", data[:min(len(data), 200)], err)
	}
	return r, resp.StatusCode, resp.Proto, nil
}
