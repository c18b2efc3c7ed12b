package main

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/shared/blockhash"
	"github.com/kvroute/kvroute/shared/policy"
	"github.com/kvroute/kvroute/shared/prompt"
	"github.com/kvroute/kvroute/shared/report"
	"github.com/kvroute/kvroute/shared/snapshot"
)

// BenchmarkRoute is the filter's request-path compute for one body, as in
// local mode with three endpoints, one of which holds the prompt: the
// whole route (render, hash, pick) and each stage alone, and the report
// record it then encodes. The hostcalls around it are BenchmarkModuleCallbacks'
// (e2e). go test ./filter -run '^$' -bench Route
func BenchmarkRoute(b *testing.B) {
	cfg := chatMLConfig(b, "10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000")
	for _, size := range []int{2 << 10, 16 << 10, 128 << 10, 512 << 10} {
		body := benchBody(size)
		r, err := newRouter(cfg, 1)
		if err != nil {
			b.Fatal(err)
		}
		p, hashes := chain(b, cfg, body)
		view := testView(b, cfg.endpoints, hashes)
		locals := func(*snapshot.View, []uint64, uint64) []policy.Local { return nil }
		name := strconv.Itoa(size>>10) + "KiB"
		b.Run("route/"+name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if d := r.route(body, view, locals, routeOptions{modelAgnostic: true}); d.outcome != routed {
					b.Fatal(d.outcome)
				}
			}
		})
		// The usual shape: the pool holds the prompt's head (a system
		// prompt of 8 KiB), not what follows: only the head is hashed.
		head := testView(b, cfg.endpoints, hashes[:min(len(hashes), 128)])
		b.Run("route-head/"+name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if d := r.route(body, head, locals, routeOptions{modelAgnostic: true}); d.outcome != routed {
					b.Fatal(d.outcome)
				}
			}
		})
		// chat_template auto: the model read from the parse, its template
		// counted over the snapshot's endpoints.
		auto := cfg
		auto.template, auto.autoTemplate = prompt.Plain, true
		ra, err := newRouter(auto, 1)
		if err != nil {
			b.Fatal(err)
		}
		b.Run("route-auto/"+name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if d := ra.route(body, view, locals, routeOptions{modelAgnostic: true}); d.outcome != routed || d.template != prompt.ChatML {
					b.Fatal(d.outcome, d.template)
				}
			}
		})
		b.Run("render/"+name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			var rd prompt.Renderer
			var text []byte
			for b.Loop() {
				p, _ := rd.Render(text[:0], body, cfg.template)
				text = p.Text[:0]
			}
		})
		b.Run("hash/"+name, func(b *testing.B) {
			b.SetBytes(int64(len(p.Text)))
			var hs []uint64
			for b.Loop() {
				hs = blockhash.Append(hs[:0], 1, p.Text, cfg.hashing)
			}
		})
		b.Run("pick/"+name, func(b *testing.B) {
			pk, err := policy.New(cfg.policy)
			if err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				pk.Pick(view, &policy.Request{Hashes: hashes, PromptTokens: len(p.Text) / 4})
			}
		})
		b.Run("report/"+name, func(b *testing.B) {
			hs := hashes[:min(len(hashes), cfg.reportBlocks)]
			var rec []byte
			for b.Loop() {
				rec, _ = report.AppendRecord(rec[:0], &report.Record{Endpoint: cfg.endpoints[0], Model: "qwen", Hashes: hs})
			}
		})
	}
}

// chatMLConfig is the default configuration with a fixed ChatML template
// and endpoints eps.
func chatMLConfig(tb testing.TB, eps ...string) config {
	cfg := defaultConfig()
	cfg.template, cfg.autoTemplate = prompt.ChatML, false
	cfg.endpoints = eps
	if err := cfg.finish(); err != nil {
		tb.Fatal(err)
	}
	return cfg
}

// chain renders body's prompt under cfg and hashes all of it.
func chain(tb testing.TB, cfg config, body []byte) (prompt.Prompt, []uint64) {
	p, err := prompt.Render(nil, body, cfg.template)
	if err != nil {
		tb.Fatal(err)
	}
	return p, blockhash.Append(nil, blockhash.Seed(p.Model, ""), p.Text, cfg.hashing)
}

func benchBody(size int) []byte {
	system := strings.Repeat("You are a meticulous assistant for the billing team. ", 40)
	var user strings.Builder
	for user.Len()+len(system)+200 < size {
		user.WriteString("Tell me more about prefix caching and routing, please. ")
	}
	b, _ := json.Marshal(map[string]any{"model": "qwen", "messages": []map[string]string{
		{"role": "system", "content": system}, {"role": "user", "content": user.String()},
	}})
	return b
}

// testView is a snapshot in which the first endpoint holds hashes.
func testView(b testing.TB, eps []string, hashes []uint64) *snapshot.View {
	bl, err := snapshot.NewBuilder(snapshot.BuilderConfig{})
	if err != nil {
		b.Fatal(err)
	}
	for _, e := range eps {
		if _, err := bl.SetEndpoint(snapshot.EndpointInfo{Addr: e, Models: []string{"qwen"}, Health: snapshot.HealthHealthy, Template: prompt.ChatML}); err != nil {
			b.Fatal(err)
		}
	}
	for _, h := range hashes {
		if err := bl.Add(0, h, snapshot.TierGPU); err != nil {
			b.Fatal(err)
		}
	}
	keys := snapshot.NewKeys("b/")
	im := bl.Build(time.Now())
	bu, err := snapshot.ParseBundle(im.AppendBundle(nil, 0))
	if err != nil {
		b.Fatal(err)
	}
	store := map[string][]byte{}
	for _, p := range bu.Parts() {
		store[keys.Part(p)] = p.Data
	}
	store[keys.Head()] = bu.Manifest().AppendHead(nil)
	v := snapshot.NewView(keys)
	if _, err := v.Refresh(func(k string) ([]byte, error) { return store[k], nil }); err != nil {
		b.Fatal(err)
	}
	return v
}
