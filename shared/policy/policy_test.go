package policy

import (
	"errors"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/kvroute/kvroute/shared/snapshot"
)

const (
	model        = "qwen3-32b"
	promptBlocks = 2000
	promptTokens = promptBlocks * 16
)

// ep describes one endpoint of a test snapshot and how much of the test
// prompt it holds.
type ep struct {
	info        snapshot.EndpointInfo
	blocks, gpu int
}

func healthy(load int) snapshot.EndpointInfo {
	return snapshot.EndpointInfo{Models: []string{model}, Health: snapshot.HealthHealthy, PrefillTokens: load}
}

func warm(load, blocks int) ep { return ep{info: healthy(load), blocks: blocks, gpu: blocks} }
func cold(load int) ep         { return ep{info: healthy(load)} }

// fixture publishes a snapshot of eps through the real transport path and
// returns a view of it and the prompt's hashes.
func fixture(t testing.TB, eps []ep) (*snapshot.View, []uint64) {
	t.Helper()
	b, err := snapshot.NewBuilder(snapshot.BuilderConfig{ShardBits: 2})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(uint64(len(eps)), 1))
	hashes := make([]uint64, promptBlocks)
	for i := range hashes {
		hashes[i] = rng.Uint64()
	}
	for i, e := range eps {
		e.info.Addr = "10.0.0." + strconv.Itoa(i) + ":8000"
		slot, err := b.SetEndpoint(e.info)
		if err != nil || slot != i {
			t.Fatalf("SetEndpoint = %d, %v", slot, err)
		}
		for j := range e.blocks {
			tier := snapshot.TierCPU
			if j < e.gpu {
				tier = snapshot.TierGPU
			}
			b.Add(slot, hashes[j], tier)
		}
	}
	return view(t, b), hashes
}

func view(t testing.TB, b *snapshot.Builder) *snapshot.View {
	t.Helper()
	bd, err := snapshot.ParseBundle(b.Build(time.Unix(1_790_000_000, 0)).AppendBundle(nil, 0))
	if err != nil {
		t.Fatal(err)
	}
	keys := snapshot.NewKeys("t/")
	kv := map[string][]byte{}
	for _, p := range bd.Parts() {
		kv[keys.Part(p)] = p.Data
	}
	kv[keys.Head()] = bd.Manifest().AppendHead(nil)
	v := snapshot.NewView(keys)
	if _, err := v.Refresh(func(k string) ([]byte, error) {
		if b, ok := kv[k]; ok {
			return b, nil
		}
		return nil, errors.New("no " + k)
	}); err != nil {
		t.Fatal(err)
	}
	return v
}

func picker(t testing.TB, edit func(*Config)) *Picker {
	t.Helper()
	cfg := DefaultConfig()
	if edit != nil {
		edit(&cfg)
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// The default rate turns 15928 tokens into one second of prefill.
const second = 15928

func TestPick(t *testing.T) {
	tests := []struct {
		name   string
		cfg    func(*Config)
		eps    []ep
		req    Request
		want   []int // any of these
		reason Reason
		blocks int
	}{
		{
			name: "affinity to the warm endpoint",
			eps:  []ep{cold(0), warm(5*second, 1900), cold(0)},
			want: []int{1}, reason: ReasonAffinity, blocks: 1900,
		},
		{
			name: "longest match wins among warm endpoints",
			eps:  []ep{warm(0, 1700), warm(0, 1950), cold(0)},
			want: []int{1}, reason: ReasonAffinity, blocks: 1950,
		},
		{
			name: "below the affinity threshold balances by TTFT, counting the cache",
			eps:  []ep{warm(second, 1000), cold(0), cold(second / 2)},
			// 0: (1s + 16000 tok) = 2.0s; 1: 2.0s; 2: 2.5s. 0 and 1 tie.
			want: []int{0, 1}, reason: ReasonLeastLoad,
		},
		{
			name: "saturated warm endpoint is released to the least TTFT",
			eps:  []ep{warm(25*second, 1900), cold(3 * second), cold(second)},
			want: []int{2}, reason: ReasonSaturatedRelease,
		},
		{
			name: "a penalty within bounds keeps affinity",
			eps:  []ep{warm(17*second, 1900), cold(0)},
			want: []int{0}, reason: ReasonAffinity,
		},
		{
			name: "the absolute ceiling releases even without a cold endpoint",
			eps:  []ep{warm(70*second, 1900), warm(2*second, 1800)},
			want: []int{1}, reason: ReasonSaturatedRelease,
		},
		{
			name: "the calibrated token threshold releases",
			eps: []ep{
				{info: snapshot.EndpointInfo{Models: []string{model}, Health: snapshot.HealthHealthy, PrefillTokens: 100_000, Signal: snapshot.SignalPrefillTokens, Threshold: 50_000}, blocks: 1900, gpu: 1900},
				cold(0),
			},
			want: []int{1}, reason: ReasonSaturatedRelease,
		},
		{
			name: "cold start spreads over idle endpoints",
			eps:  []ep{cold(0), cold(0), cold(0)},
			want: []int{0, 1, 2}, reason: ReasonLeastLoad,
		},
		{
			name: "cold start picks the least loaded",
			eps:  []ep{cold(2 * second), cold(second), cold(3 * second)},
			want: []int{1}, reason: ReasonLeastLoad,
		},
		{
			name: "all saturated falls back to the least loaded",
			eps:  []ep{warm(100*second, 1900), cold(80 * second), cold(90 * second)},
			want: []int{1}, reason: ReasonFallback,
		},
		{
			name: "the endpoint's calibrated rate counts",
			eps: []ep{
				{info: snapshot.EndpointInfo{Models: []string{model}, Health: snapshot.HealthHealthy, PrefillTokens: 4 * second, PrefillRate: 4 * second}},
				cold(2 * second),
			},
			// 0: (4s + 2s of tokens at 4x the rate) = 1.5s; 1: 4s.
			want: []int{0}, reason: ReasonLeastLoad,
		},
		{
			name: "model filtering",
			eps: []ep{
				{info: snapshot.EndpointInfo{Models: []string{"llama"}, Health: snapshot.HealthHealthy}, blocks: 2000, gpu: 2000},
				cold(10 * second),
				{info: snapshot.EndpointInfo{Models: []string{"llama"}, Adapters: []string{model}, Health: snapshot.HealthHealthy, PrefillTokens: 20 * second}},
			},
			want: []int{1}, reason: ReasonLeastLoad,
		},
		{
			name: "an adapter is a model",
			eps: []ep{
				{info: snapshot.EndpointInfo{Models: []string{"llama"}, Adapters: []string{"sql"}, Health: snapshot.HealthHealthy}},
				{info: snapshot.EndpointInfo{Models: []string{"llama"}, Health: snapshot.HealthHealthy}},
			},
			req:  Request{Model: "sql"},
			want: []int{0}, reason: ReasonLeastLoad,
		},
		{
			name: "unhealthy and draining endpoints are skipped",
			eps: []ep{
				{info: snapshot.EndpointInfo{Models: []string{model}, Health: snapshot.HealthUnhealthy}, blocks: 2000, gpu: 2000},
				{info: snapshot.EndpointInfo{Models: []string{model}, Health: snapshot.HealthDraining}, blocks: 2000, gpu: 2000},
				{info: snapshot.EndpointInfo{Models: []string{model}, Health: snapshot.HealthUnknown}},
				cold(50 * second),
			},
			want: []int{3}, reason: ReasonLeastLoad,
		},
		{
			name: "CPU-tier hits count at a discount",
			// 1900 blocks on the CPU count as 1520: 76% of the prompt, not warm.
			eps:  []ep{{info: healthy(0), blocks: 1900, gpu: 0}, cold(0)},
			want: []int{0}, reason: ReasonLeastLoad, blocks: 1900,
		},
		{
			name: "GPU beats an equal CPU run",
			eps:  []ep{{info: healthy(0), blocks: 2000, gpu: 1000}, warm(0, 2000)},
			want: []int{1}, reason: ReasonAffinity,
		},
		{
			name: "no CPU discount makes offloaded blocks warm",
			cfg:  func(c *Config) { c.CPUDiscount = 1 },
			eps:  []ep{{info: healthy(0), blocks: 1900, gpu: 0}, cold(0)},
			want: []int{0}, reason: ReasonAffinity,
		},
		{
			name: "local in-flight tokens count",
			eps:  []ep{warm(0, 1900), cold(0)},
			req:  Request{Local: []Local{{PrefillTokens: 30 * second}}},
			want: []int{1}, reason: ReasonSaturatedRelease,
		},
		{
			name: "a stale snapshot's load is ignored",
			eps:  []ep{warm(30*second, 1900), cold(0)},
			req:  Request{Stale: true},
			want: []int{0}, reason: ReasonAffinity,
		},
		{
			name: "a stale snapshot still counts local load",
			eps:  []ep{cold(0), cold(10 * second)},
			req:  Request{Stale: true, Local: []Local{{PrefillTokens: 5 * second}}},
			want: []int{1}, reason: ReasonLeastLoad,
		},
		{
			name: "decode mode: warm endpoint under its cap",
			cfg:  func(c *Config) { c.Mode = ModeDecode },
			eps: []ep{
				{info: snapshot.EndpointInfo{Models: []string{model}, Health: snapshot.HealthHealthy, Running: 100, Waiting: 50}, blocks: 1900, gpu: 1900},
				cold(0),
			},
			want: []int{0}, reason: ReasonAffinity,
		},
		{
			name: "decode mode: the snapshot's cap releases",
			cfg:  func(c *Config) { c.Mode = ModeDecode },
			eps: []ep{
				{info: snapshot.EndpointInfo{Models: []string{model}, Health: snapshot.HealthHealthy, Running: 60, Waiting: 4, Signal: snapshot.SignalRequests, Threshold: 64}, blocks: 1900, gpu: 1900},
				{info: snapshot.EndpointInfo{Models: []string{model}, Health: snapshot.HealthHealthy, Running: 30}},
				{info: snapshot.EndpointInfo{Models: []string{model}, Health: snapshot.HealthHealthy, Running: 20}},
			},
			want: []int{2}, reason: ReasonSaturatedRelease,
		},
		{
			name: "decode mode: least active fraction, prefill tokens ignored",
			cfg:  func(c *Config) { c.Mode = ModeDecode },
			eps: []ep{
				{info: snapshot.EndpointInfo{Models: []string{model}, Health: snapshot.HealthHealthy, Running: 10, PrefillTokens: 90 * second}},
				{info: snapshot.EndpointInfo{Models: []string{model}, Health: snapshot.HealthHealthy, Running: 40}},
			},
			want: []int{0}, reason: ReasonLeastLoad,
		},
		{
			name: "decode mode: all at their caps falls back",
			cfg:  func(c *Config) { c.Mode = ModeDecode; c.DecodeCap = 8 },
			eps: []ep{
				{info: snapshot.EndpointInfo{Models: []string{model}, Health: snapshot.HealthHealthy, Running: 10}, blocks: 2000, gpu: 2000},
				{info: snapshot.EndpointInfo{Models: []string{model}, Health: snapshot.HealthHealthy, Running: 8}},
			},
			want: []int{1}, reason: ReasonFallback,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v, hashes := fixture(t, tc.eps)
			p := picker(t, tc.cfg)
			r := tc.req
			if r.Model == "" {
				r.Model = model
			}
			r.Hashes = hashes
			seen := map[int]bool{}
			for i := range 64 {
				r.Random = uint64(i) * 0x9e3779b97f4a7c15
				d := p.Pick(v, &r)
				ok := false
				for _, w := range tc.want {
					ok = ok || d.Endpoint == w
				}
				if !ok || d.Reason != tc.reason {
					t.Fatalf("Pick = endpoint %d (%v), want %v (%v); %+v", d.Endpoint, d.Reason, tc.want, tc.reason, d)
				}
				if tc.blocks > 0 && d.Blocks != tc.blocks {
					t.Errorf("Blocks = %d, want %d", d.Blocks, tc.blocks)
				}
				seen[d.Endpoint] = true
			}
			if len(seen) != len(tc.want) {
				t.Errorf("chose %v over 64 draws, want each of %v", seen, tc.want)
			}
		})
	}
}

func TestPickNone(t *testing.T) {
	p := picker(t, nil)
	if d := p.Pick(snapshot.NewView(snapshot.NewKeys("x/")), &Request{}); d.Endpoint != -1 || d.Reason != ReasonFallback {
		t.Errorf("empty view: %+v", d)
	}
	v, hashes := fixture(t, []ep{warm(0, 100)})
	if d := p.Pick(v, &Request{Model: "gpt-4", Hashes: hashes}); d.Endpoint != -1 {
		t.Errorf("unknown model: %+v", d)
	}
	v, _ = fixture(t, []ep{{info: snapshot.EndpointInfo{Models: []string{model}, Health: snapshot.HealthUnhealthy}}})
	if d := p.Pick(v, &Request{Model: model}); d.Endpoint != -1 || d.Eligible != 0 {
		t.Errorf("nothing healthy: %+v", d)
	}
	// No hashes: an empty prompt is nobody's cache hit.
	v, _ = fixture(t, []ep{cold(second), cold(0)})
	if d := p.Pick(v, &Request{Model: model}); d.Endpoint != 1 || d.Reason != ReasonLeastLoad {
		t.Errorf("empty prompt: %+v", d)
	}
}

// TestDecisionRecord checks the figures reported for the debug header.
func TestDecisionRecord(t *testing.T) {
	v, hashes := fixture(t, []ep{cold(0), {info: healthy(second), blocks: 1900, gpu: 1700}})
	d := picker(t, nil).Pick(v, &Request{Model: model, Hashes: hashes, PromptTokens: promptTokens + 10})
	// Effective blocks 1700 + 0.8*200 = 1860; uncached 32010 - 29760 = 2250.
	want := Decision{Endpoint: 1, Reason: ReasonAffinity, Blocks: 1900, GPUBlocks: 1700, UncachedTokens: 2250, Eligible: 2, Lookups: d.Lookups}
	ttft := float64(second+2250) / second
	want.TTFT = time.Duration(ttft * float64(time.Second))
	if d != want {
		t.Errorf("Pick = %+v\nwant   %+v", d, want)
	}
	if d.Lookups < 3 || d.Lookups > 40 {
		t.Errorf("%d lookups for two distinct runs", d.Lookups)
	}
}

// TestReleaseAndReturn drives the warm endpoint's own in-flight tokens up
// and down: it is released past the penalty, kept released inside the
// hysteresis band, and taken back once it drains below it.
func TestReleaseAndReturn(t *testing.T) {
	v, hashes := fixture(t, []ep{warm(0, 1900), cold(0), cold(0)})
	p := picker(t, nil)
	// Warm TTFT = (L + 1600) / rate; cold = 2.01 s. Release above
	// L = 20.01 s of tokens - 1600; return at 16.2 + 2.01 s - 1600.
	const release = 20.01*second - 1600
	const back = 18.21*second - 1600
	steps := []struct {
		load   float64
		want   Reason
		onWarm bool
	}{
		{0, ReasonAffinity, true},
		{release - 1000, ReasonAffinity, true},
		{release + 1000, ReasonSaturatedRelease, false},
		{release - 1000, ReasonSaturatedRelease, false}, // inside the band: stays released
		{back + 1000, ReasonSaturatedRelease, false},
		{back - 1000, ReasonAffinity, true}, // drained: affinity returns
		{release - 1000, ReasonAffinity, true},
		{release + 1000, ReasonSaturatedRelease, false},
	}
	for i, s := range steps {
		d := p.Pick(v, &Request{Model: model, Hashes: hashes, Local: []Local{{PrefillTokens: int64(s.load)}}, Random: uint64(i)})
		if d.Reason != s.want || (d.Endpoint == 0) != s.onWarm {
			t.Fatalf("step %d (load %.0f): endpoint %d %v, want %v", i, s.load, d.Endpoint, d.Reason, s.want)
		}
	}
}

// TestHysteresis checks that the state belongs to the endpoint: a new
// endpoint in the slot starts unsaturated, and a Picker without hysteresis
// flips at the limit.
func TestHysteresis(t *testing.T) {
	const release = 20.01*second - 1600
	run := func(p *Picker, v *snapshot.View, hashes []uint64, loads ...float64) []Reason {
		var out []Reason
		for _, l := range loads {
			out = append(out, p.Pick(v, &Request{Model: model, Hashes: hashes, Local: []Local{{PrefillTokens: int64(l)}}}).Reason)
		}
		return out
	}
	v, hashes := fixture(t, []ep{warm(0, 1900), cold(0)})
	edge := []float64{release + 100, release - 100, release + 100, release - 100}
	none := picker(t, func(c *Config) { c.Hysteresis = 0 })
	got := run(none, v, hashes, edge...)
	want := []Reason{ReasonSaturatedRelease, ReasonAffinity, ReasonSaturatedRelease, ReasonAffinity}
	if !equal(got, want) {
		t.Errorf("without hysteresis: %v, want %v", got, want)
	}
	p := picker(t, nil)
	got = run(p, v, hashes, edge...)
	want = []Reason{ReasonSaturatedRelease, ReasonSaturatedRelease, ReasonSaturatedRelease, ReasonSaturatedRelease}
	if !equal(got, want) {
		t.Errorf("with hysteresis: %v, want %v", got, want)
	}

	// Slot 0 changes hands: the new endpoint is judged afresh.
	b, _ := snapshot.NewBuilder(snapshot.BuilderConfig{ShardBits: 2})
	b.SetEndpoint(snapshot.EndpointInfo{Addr: "10.0.0.0:8000", Models: []string{model}, Health: snapshot.HealthHealthy})
	b.SetEndpoint(snapshot.EndpointInfo{Addr: "10.0.0.1:8000", Models: []string{model}, Health: snapshot.HealthHealthy})
	b.Build(time.Unix(0, 0))
	b.RemoveEndpoint("10.0.0.0:8000")
	if slot, _ := b.SetEndpoint(snapshot.EndpointInfo{Addr: "10.0.0.9:8000", Models: []string{model}, Health: snapshot.HealthHealthy}); slot != 0 {
		t.Fatalf("new endpoint in slot %d", slot)
	}
	for _, h := range hashes[:1900] {
		b.Add(0, h, snapshot.TierGPU)
	}
	v2 := view(t, b)
	if got := run(p, v2, hashes, release-100); got[0] != ReasonAffinity {
		t.Errorf("new endpoint in a released slot: %v", got[0])
	}
}

func equal(a, b []Reason) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestTies checks that near-ties are broken evenly by the caller's random
// value, and that a difference beyond the tolerance is not a tie.
func TestTies(t *testing.T) {
	tests := []struct {
		name string
		cfg  func(*Config)
		eps  []ep
		even []int // chosen evenly
	}{
		{"equal idle endpoints", nil, []ep{cold(0), cold(0), cold(0), cold(0)}, []int{0, 1, 2, 3}},
		{"within the tolerance", nil, []ep{cold(0), cold(second / 100), cold(second / 10)}, []int{0, 1}},
		{"no tolerance", func(c *Config) { c.TieTolerance = 0 }, []ep{cold(0), cold(1), cold(0)}, []int{0, 2}},
		{"equally warm replicas", nil, []ep{warm(0, 1900), warm(0, 1900), cold(0)}, []int{0, 1}},
		{"decode: a request apart", func(c *Config) { c.Mode = ModeDecode; c.DecodeCap = 100 }, []ep{
			{info: snapshot.EndpointInfo{Models: []string{model}, Health: snapshot.HealthHealthy, Running: 5}},
			{info: snapshot.EndpointInfo{Models: []string{model}, Health: snapshot.HealthHealthy, Running: 6}},
			{info: snapshot.EndpointInfo{Models: []string{model}, Health: snapshot.HealthHealthy, Running: 8}},
		}, []int{0, 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v, hashes := fixture(t, tc.eps)
			p := picker(t, tc.cfg)
			const draws = 4000
			count := map[int]int{}
			rng := rand.New(rand.NewPCG(1, 2))
			for range draws {
				count[p.Pick(v, &Request{Model: model, Hashes: hashes, Random: rng.Uint64()}).Endpoint]++
			}
			for _, e := range tc.even {
				if n := count[e]; n < draws/len(tc.even)*8/10 || n > draws/len(tc.even)*12/10 {
					t.Errorf("endpoint %d chosen %d of %d times: %v", e, n, draws, count)
				}
			}
			if len(count) != len(tc.even) {
				t.Errorf("chosen: %v, want only %v", count, tc.even)
			}
			r := Request{Model: model, Hashes: hashes, Random: 42}
			if a, b := p.Pick(v, &r), p.Pick(v, &r); a != b {
				t.Errorf("same random, different decisions: %+v %+v", a, b)
			}
		})
	}
}

func TestConfig(t *testing.T) {
	bad := []func(*Config){
		func(c *Config) { c.Mode = 9 },
		func(c *Config) { c.AffinityThreshold = 1.1 },
		func(c *Config) { c.MaxTTFT = 0 },
		func(c *Config) { c.MaxTTFTPenalty = -1 },
		func(c *Config) { c.PrefillRate = 0 },
		func(c *Config) { c.DecodeCap = 0 },
		func(c *Config) { c.CPUDiscount = -0.1 },
		func(c *Config) { c.Hysteresis = 1 },
		func(c *Config) { c.TieRequests = -1 },
		func(c *Config) { c.BlockBytes = 0 },
	}
	for i, edit := range bad {
		cfg := DefaultConfig()
		edit(&cfg)
		if _, err := New(cfg); err == nil {
			t.Errorf("bad config %d accepted", i)
		}
	}
	for _, s := range []string{"prefill", "decode"} {
		if m, err := ParseMode(s); err != nil || m.String() != s {
			t.Errorf("ParseMode(%q) = %v, %v", s, m, err)
		}
	}
	if _, err := ParseMode("both"); err == nil {
		t.Error(`ParseMode("both") accepted`)
	}
	for r, s := range map[Reason]string{ReasonAffinity: "affinity", ReasonSaturatedRelease: "saturated-release", ReasonLeastLoad: "least-load", ReasonFallback: "fallback"} {
		if r.String() != s {
			t.Errorf("%d.String() = %q, want %q", r, r.String(), s)
		}
	}
}

// TestPickNoAllocs holds a decision to zero allocations once the Picker's
// scratch space has grown.
func TestPickNoAllocs(t *testing.T) {
	v, hashes := fixture(t, []ep{warm(0, 1900), cold(0), warm(second, 1500), cold(2 * second)})
	p := picker(t, nil)
	r := Request{Model: model, Hashes: hashes, Local: make([]Local, 4)}
	p.Pick(v, &r)
	if n := testing.AllocsPerRun(100, func() { r.Random++; p.Pick(v, &r) }); n != 0 {
		t.Errorf("Pick: %v allocations", n)
	}
}
