package policy

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/kvroute/kvroute/shared/predict"
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
	other       int // blocks of other prompts it holds
	prefixes    int // the prefixes cachesync counts for it
}

func healthy(load int) snapshot.EndpointInfo {
	return snapshot.EndpointInfo{Models: []string{model}, Health: snapshot.HealthHealthy, PrefillTokens: load, PrefillRate: second}
}

// warm holds blocks of the prompt, and so draws its traffic: one prefix.
func warm(load, blocks int) ep {
	return ep{info: healthy(load), blocks: blocks, gpu: blocks, prefixes: 1}
}
func cold(load int) ep { return ep{info: healthy(load)} }

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
		for j := range e.other {
			b.Add(slot, uint64(i)<<40|uint64(j), snapshot.TierGPU)
		}
		b.SetPrefixes(slot, e.prefixes)
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

// second is the test endpoints' prefill rate: that many tokens take a
// second.
const second = 16000

// A prompt of promptBlocks 64-byte blocks is 32,000 tokens at 4 bytes per
// token (the default): two seconds of cold prefill at the test rate.

func TestPick(t *testing.T) {
	tests := []struct {
		name   string
		cfg    func(*Config)
		eps    []ep
		req    Request
		want   []int // any of these
		reason Reason
	}{
		{
			name: "the warm endpoint", eps: []ep{cold(0), warm(0, promptBlocks), cold(0)},
			want: []int{1}, reason: ReasonAffinity,
		},
		{
			name: "warm despite some backlog: queueing 1 s there beats 2 s of cold prefill",
			eps:  []ep{cold(0), warm(second, promptBlocks), cold(0)},
			want: []int{1}, reason: ReasonAffinity,
		},
		{
			name: "released when its backlog costs more than a cold prefill",
			eps:  []ep{cold(0), warm(3*second, promptBlocks), cold(second / 2)},
			want: []int{0}, reason: ReasonSaturatedRelease,
		},
		{
			// The cold endpoint is 5% cheaper, within the model's
			// error; the copy would draw the prefix's traffic from then
			// on.
			name: "kept while a copy would save less than the model's error",
			eps:  []ep{cold(0), warm(second*22/10, promptBlocks)},
			want: []int{1}, reason: ReasonAffinity,
		},
		{
			name: "a copy of a few blocks needs no margin: it follows the load",
			eps:  []ep{cold(0), warm(second/4, 20)},
			want: []int{0}, reason: ReasonSaturatedRelease,
		},
		{
			name: "no cliff: a third of the prompt cached still pulls",
			eps:  []ep{cold(0), warm(0, promptBlocks/3), cold(0)},
			want: []int{1}, reason: ReasonAffinity,
		},
		{
			name: "a third cached is not worth two seconds of queue",
			eps:  []ep{cold(0), warm(2*second, promptBlocks/3), cold(0)},
			want: []int{0, 2}, reason: ReasonSaturatedRelease,
		},
		{
			name: "nothing cached: the least backlog", eps: []ep{cold(900), cold(100), cold(500)},
			want: []int{1}, reason: ReasonLeastLoad,
		},
		{
			name: "the longer match wins over a shorter one",
			eps:  []ep{warm(0, 500), warm(0, 1900), warm(0, 1000)},
			want: []int{1}, reason: ReasonAffinity,
		},
		{
			name: "CPU-tier blocks count, discounted",
			eps:  []ep{{info: healthy(0), blocks: promptBlocks, gpu: 0}, warm(0, promptBlocks/2)},
			want: []int{0}, reason: ReasonAffinity,
		},
		{
			name: "decode load: the same cache, fewer running requests",
			eps:  []ep{{info: withRunning(healthy(0), 40), blocks: promptBlocks, gpu: promptBlocks}, {info: withRunning(healthy(0), 2), blocks: promptBlocks, gpu: promptBlocks}},
			want: []int{1}, reason: ReasonAffinity,
		},
		{
			// Priced for its whole 2,000 tokens, the answer's decoding in a
			// batch of 30 rather than 20 outweighed re-prefilling the
			// prompt; the load it would flee lasts only until the next
			// placements even it out. (1.19 times the ITL: not saturated.)
			name: "a long answer keeps its cached prefix over a somewhat lighter batch",
			eps:  []ep{{info: withRunning(healthy(0), 30), blocks: promptBlocks, gpu: promptBlocks}, {info: withRunning(healthy(0), 20)}},
			req:  Request{OutputTokens: 2000},
			want: []int{0}, reason: ReasonAffinity,
		},
		{
			// Its own latency alone would send it to the cold endpoint (its
			// batch is smaller, so it decodes faster), but the cold prefill
			// would stall the 25 requests there for longer than the warm
			// endpoint's 40 wait for the rest of the prompt.
			name: "a crowded warm batch keeps the request: a cold prefill stalls everyone there",
			eps:  []ep{{info: withRunning(healthy(0), 40), blocks: promptBlocks * 4 / 5, gpu: promptBlocks * 4 / 5}, {info: withRunning(healthy(0), 25)}},
			want: []int{0}, reason: ReasonAffinity,
		},
		{
			// 22.8 ms a token against 15: the holder is saturated by its
			// decode load, whatever the copy's prefill costs the 15.
			name: "until its batch decodes more than 1.3 times slower than another's",
			eps:  []ep{{info: withRunning(healthy(0), 40), blocks: promptBlocks * 4 / 5, gpu: promptBlocks * 4 / 5}, {info: withRunning(healthy(0), 15)}},
			want: []int{1}, reason: ReasonSaturatedRelease,
		},
		{
			// The default model's step time is the bar's absolute part:
			// 13.1 ms a token against an idle engine's 10.3 (1.27).
			name: "nine requests more than an idle engine do not saturate a holder of the whole prompt",
			eps:  []ep{{info: withRunning(healthy(0), 9), blocks: promptBlocks, gpu: promptBlocks}, {info: healthy(0)}},
			want: []int{0}, reason: ReasonAffinity,
		},
		{
			// 13.8 ms against 10.3 (1.33): released to a cold prefill
			// its price alone would not pay.
			name: "eleven do",
			eps:  []ep{{info: withRunning(healthy(0), 11), blocks: promptBlocks, gpu: promptBlocks}, {info: healthy(0)}},
			want: []int{1}, reason: ReasonSaturatedRelease,
		},
		{
			name: "a stated SLO the holder meets keeps it, however slow its batch against another's",
			cfg:  func(c *Config) { c.SLOTTFT = 10 * time.Second },
			eps:  []ep{{info: withRunning(healthy(0), 40), blocks: promptBlocks * 4 / 5, gpu: promptBlocks * 4 / 5}, {info: withRunning(healthy(0), 15)}},
			want: []int{0}, reason: ReasonAffinity,
		},
		{
			name: "decode saturation is auto's: prefill mode keeps the holder",
			cfg:  func(c *Config) { c.Mode = ModePrefill },
			eps:  []ep{{info: withRunning(healthy(0), 40), blocks: promptBlocks * 4 / 5, gpu: promptBlocks * 4 / 5}, {info: withRunning(healthy(0), 15)}},
			want: []int{0}, reason: ReasonAffinity,
		},
		{
			// In decode mode, where the whole answer is priced: in auto
			// a batch 1.3 times faster would take it whatever the weight
			// (decodeSaturation).
			name: "priced selfishly (others weight 0), it leaves for a smaller batch the cold prefill would stall",
			cfg:  func(c *Config) { c.OthersWeight, c.Mode = 0, ModeDecode },
			eps:  []ep{{info: withRunning(healthy(0), 40), blocks: promptBlocks * 4 / 5, gpu: promptBlocks * 4 / 5, prefixes: 1}, {info: withRunning(healthy(0), 25)}},
			want: []int{1}, reason: ReasonSaturatedRelease,
		},
		{
			name: "prefill mode ignores decode load",
			cfg:  func(c *Config) { c.Mode = ModePrefill },
			eps:  []ep{{info: withRunning(healthy(0), 200), blocks: promptBlocks, gpu: promptBlocks}, cold(0)},
			want: []int{0}, reason: ReasonAffinity,
		},
		{
			name: "auto mode: a long output on a crowded batch outweighs the cache",
			eps:  []ep{{info: withRunning(healthy(0), 300), blocks: promptBlocks, gpu: promptBlocks}, cold(0)},
			req:  Request{OutputTokens: 4000},
			want: []int{1}, reason: ReasonSaturatedRelease,
		},
		{
			name: "the same batch, as scraped, were this gateway's requests and have finished: the cache wins",
			eps:  []ep{{info: withRunning(healthy(0), 300), blocks: promptBlocks, gpu: promptBlocks}, cold(0)},
			req:  Request{OutputTokens: 4000, Local: []Local{{AtLoad: 300, AtLoadKnown: true}}},
			want: []int{0}, reason: ReasonAffinity,
		},
		{
			name: "other gateways' share of a scraped batch still counts, and this gateway's own as of now",
			eps:  []ep{{info: withRunning(healthy(0), 300), blocks: promptBlocks, gpu: promptBlocks}, cold(0)},
			req:  Request{OutputTokens: 4000, Local: []Local{{AtLoad: 150, AtLoadKnown: true, Requests: 150}}},
			want: []int{1}, reason: ReasonSaturatedRelease,
		},
		{
			// Fitted, the model prices each queued request at half a
			// second; the scrape saw 4 running and 20 queued, all this
			// gateway's, which still has them: the queue still counts.
			name: "this gateway's own requests queued behind a full batch still queue",
			eps: []ep{{info: withModel(withQueue(healthy(0), 4, 20)), blocks: promptBlocks, gpu: promptBlocks},
				{info: withModel(healthy(0))}},
			req:  Request{OutputTokens: 16, Local: []Local{{AtLoad: 24, AtLoadKnown: true, Requests: 24}, {AtLoadKnown: true}}},
			want: []int{1}, reason: ReasonSaturatedRelease,
		},
		{
			// The endpoint drawing the fewest prefixes decodes 1.6 times
			// slower than the other: the prefixes it draws bring more
			// than their share of the load.
			name: "a new prefix goes to the fewest prefixes not saturated by their decode load",
			eps: []ep{{info: withCapacity(withRunning(healthy(0), 60), 100000)},
				{info: withCapacity(withRunning(healthy(0), 20), 100000), prefixes: 1}},
			want: []int{1}, reason: ReasonLeastLoad,
		},
		{
			name: "a new prefix goes to room even where requests run: the stall its prefill causes them is paid once",
			eps:  []ep{{info: withCapacity(healthy(0), 20000), other: 6000}, {info: withCapacity(withRunning(healthy(0), 2), 20000), other: 2000}},
			want: []int{1}, reason: ReasonLeastLoad,
		},
		{
			name: "placement by cache room when nothing else differs",
			eps:  []ep{{info: withCapacity(healthy(0), 10000), other: 9000}, {info: withCapacity(healthy(0), 10000), other: 1000}, {info: withCapacity(healthy(0), 10000), other: 5000}},
			want: []int{1}, reason: ReasonLeastLoad,
		},
		{
			name: "a new prefix goes to cache room, not to whoever is idle this moment",
			eps:  []ep{{info: withCapacity(healthy(0), 20000), other: 6000}, {info: withCapacity(healthy(second/2), 20000), other: 2000}},
			want: []int{1}, reason: ReasonLeastLoad,
		},
		{
			// Three prefixes whose unique suffixes fill as many blocks
			// as four with few: the traffic follows the prefixes.
			name: "a new prefix goes to the fewest prefixes, though their blocks fill as much",
			eps: []ep{{info: withCapacity(healthy(0), 40000), other: 8200, prefixes: 4},
				{info: withCapacity(withRunning(healthy(0), 2), 40000), other: 8400, prefixes: 3},
				{info: withCapacity(healthy(0), 40000), other: 8000, prefixes: 4}},
			want: []int{1}, reason: ReasonLeastLoad,
		},
		{
			name: "prefixes this gateway placed since the snapshot count",
			eps: []ep{{info: withCapacity(healthy(0), 40000), other: 8000, prefixes: 3},
				{info: withCapacity(healthy(0), 40000), other: 8000, prefixes: 3}},
			req:  Request{Local: []Local{{PendingPrefixes: 1}}},
			want: []int{1}, reason: ReasonLeastLoad,
		},
		{
			name: "but not to room behind a queue longer than a cold prefill",
			eps:  []ep{{info: withCapacity(healthy(5*second), 100000)}, {info: withCapacity(healthy(0), 100000), other: 30000}},
			want: []int{1}, reason: ReasonLeastLoad,
		},
		{
			name: "a copy of a held prefix costs its room: queueing 1.5 s at the holder is cheaper",
			eps:  []ep{{info: withCapacity(healthy(3*second/2), 100000), blocks: promptBlocks * 6 / 10, gpu: promptBlocks * 6 / 10}, {info: withCapacity(healthy(0), 100000)}},
			want: []int{0}, reason: ReasonAffinity,
		},
		{
			name: "a copy is made when the holder's queue outprices the room too",
			eps:  []ep{{info: withCapacity(healthy(3*second), 100000), blocks: promptBlocks * 6 / 10, gpu: promptBlocks * 6 / 10, prefixes: 1}, {info: withCapacity(healthy(0), 100000)}},
			want: []int{1}, reason: ReasonSaturatedRelease,
		},
		{
			// The copy would draw a share of the prefix's traffic to an
			// endpoint that draws as much as the holder already: it
			// must save this request more than its own prefill.
			name: "not to an endpoint drawing as many prefixes, while the holder's queue costs less than a copy",
			eps: []ep{{info: withCapacity(healthy(3*second), 100000), blocks: promptBlocks * 6 / 10, gpu: promptBlocks * 6 / 10, prefixes: 4},
				{info: withCapacity(healthy(0), 100000), prefixes: 4}},
			want: []int{0}, reason: ReasonAffinity,
		},
		{
			// Priced 2 s above the copier, past the copy's 1.2 s
			// prefill; but the copy would relieve the holder of one
			// prefix's share of that load, of the four it draws.
			name: "nor while it costs less than a copy for each prefix the holder draws",
			eps: []ep{{info: withCapacity(healthy(5*second), 100000), blocks: promptBlocks * 6 / 10, gpu: promptBlocks * 6 / 10, prefixes: 4},
				{info: withCapacity(healthy(0), 100000), prefixes: 4}},
			want: []int{0}, reason: ReasonAffinity,
		},
		{
			name: "to an endpoint drawing as many prefixes once the holder's queue costs more",
			eps: []ep{{info: withCapacity(healthy(9*second), 100000), blocks: promptBlocks * 6 / 10, gpu: promptBlocks * 6 / 10, prefixes: 4},
				{info: withCapacity(healthy(0), 100000), prefixes: 4}},
			want: []int{1}, reason: ReasonSaturatedRelease,
		},
		{
			// A hot prefix: its holder's load is the prefix's own.
			name: "a holder drawing one prefix spills past one copy's prefill",
			eps: []ep{{info: withCapacity(healthy(5*second), 100000), blocks: promptBlocks * 6 / 10, gpu: promptBlocks * 6 / 10, prefixes: 1},
				{info: withCapacity(healthy(0), 100000), prefixes: 1}},
			want: []int{1}, reason: ReasonSaturatedRelease,
		},
		{
			// Queues price the holder 2.4 s above the copier: past one
			// copy's prefill (1.2 s), and a tenth of the copier's price
			// (1.5 s) is more than that prefill, but the copy is of 60%
			// of the prompt, not of a few blocks.
			name: "a copy of most of the prompt is no copy of a few blocks however dear the load makes the price",
			eps: []ep{{info: withCapacity(healthy(14*second), 100000), blocks: promptBlocks * 6 / 10, gpu: promptBlocks * 6 / 10, prefixes: 4},
				{info: withCapacity(healthy(8*second), 100000), prefixes: 4}},
			want: []int{0}, reason: ReasonAffinity,
		},
		{
			name: "to an endpoint drawing as many prefixes when the holder misses the SLO and it meets it",
			cfg:  func(c *Config) { c.SLOTTFT = 2500 * time.Millisecond },
			eps: []ep{{info: withCapacity(healthy(3*second), 100000), blocks: promptBlocks * 6 / 10, gpu: promptBlocks * 6 / 10, prefixes: 4},
				{info: withCapacity(healthy(0), 100000), prefixes: 4}},
			want: []int{1}, reason: ReasonSaturatedRelease,
		},
		{
			// With a share of the prefix it would draw as much as the
			// holder: the copy evens nothing out, and in a warm-up the
			// prefix it is short is the room for a group not seen yet.
			name: "not to an endpoint drawing one prefix fewer, while the holder's queue costs less than a second copy",
			eps: []ep{{info: withCapacity(healthy(3*second), 100000), blocks: promptBlocks * 6 / 10, gpu: promptBlocks * 6 / 10, prefixes: 4},
				{info: withCapacity(healthy(0), 100000), prefixes: 3}},
			want: []int{0}, reason: ReasonAffinity,
		},
		{
			name: "to an endpoint drawing two prefixes fewer, as soon as the price says so",
			eps: []ep{{info: withCapacity(healthy(3*second), 100000), blocks: promptBlocks * 6 / 10, gpu: promptBlocks * 6 / 10, prefixes: 4},
				{info: withCapacity(healthy(0), 100000), prefixes: 2}},
			want: []int{1}, reason: ReasonSaturatedRelease,
		},
		{
			name: "a copy is made while the running requests leave its blocks room",
			eps: []ep{{info: withCapacity(withRunning(healthy(6*second), 2), 100000), blocks: promptBlocks * 6 / 10, gpu: promptBlocks * 6 / 10, prefixes: 1},
				{info: withUsage(withCapacity(withRunning(healthy(0), 2), 100000), 0.5)}},
			want: []int{1}, reason: ReasonSaturatedRelease,
		},
		{
			// A 32,000-token prompt in the last 0.1% of 1.6 M tokens of KV:
			// nearly all of it is prefilled again for a preempted request,
			// stalling the others there.
			name: "but not into a KV cache the running requests fill: what it preempts is prefilled again",
			eps: []ep{{info: withCapacity(withRunning(healthy(6*second), 2), 100000), blocks: promptBlocks * 6 / 10, gpu: promptBlocks * 6 / 10},
				{info: withUsage(withCapacity(withRunning(healthy(0), 2), 100000), 0.999)}},
			want: []int{0}, reason: ReasonAffinity,
		},
		{
			name: "a stale snapshot's KV usage is not read",
			eps: []ep{{info: withCapacity(healthy(0), 100000), blocks: promptBlocks, gpu: promptBlocks, prefixes: 1},
				{info: withUsage(withCapacity(healthy(0), 100000), 1)}},
			req:  Request{Stale: true, Local: []Local{{PrefillTokens: 20 * second}, {Requests: 6}}},
			want: []int{1}, reason: ReasonSaturatedRelease,
		},
		{
			name: "this gateway's own in-flight load counts",
			eps:  []ep{cold(0), cold(0)},
			req:  Request{Local: []Local{{PrefillTokens: 2 * second, Requests: 3}}},
			want: []int{1}, reason: ReasonLeastLoad,
		},
		{
			name: "a prefix this gateway just sent to be prefilled counts as held before the index shows it",
			eps:  []ep{cold(0), cold(0), cold(0)},
			req:  Request{Local: []Local{{}, {PrefillTokens: promptTokens / 2, Requests: 1, Blocks: promptBlocks * 9 / 10}}},
			want: []int{1}, reason: ReasonAffinity,
		},
		{
			name: "a stale snapshot's load is ignored, its cache is not",
			eps:  []ep{warm(50*second, promptBlocks), cold(0)},
			req:  Request{Stale: true},
			want: []int{0}, reason: ReasonAffinity,
		},
		{
			name: "SLO: the best cached that meets it",
			cfg:  func(c *Config) { c.SLOTTFT = 3 * time.Second },
			eps:  []ep{cold(0), warm(2*second, promptBlocks), warm(0, promptBlocks/2)},
			want: []int{1}, reason: ReasonAffinity,
		},
		{
			name: "SLO: none meets it, the cheapest",
			cfg:  func(c *Config) { c.SLOTTFT = 100 * time.Millisecond },
			eps:  []ep{cold(0), warm(3*second, promptBlocks)},
			want: []int{0}, reason: ReasonSaturatedRelease,
		},
		{
			// 60.3 ms at the holder; 44.7 ms at the other, whose batch
			// its 2 s prefill would slow by 7.8 ms a token.
			name: "TPOT SLO: not met where the request's prefill pushes the batch over it",
			cfg:  func(c *Config) { c.SLOTPOT = 50 * time.Millisecond },
			eps:  []ep{{info: withRunning(healthy(0), 160), blocks: promptBlocks, gpu: promptBlocks}, {info: withRunning(healthy(0), 110)}},
			want: []int{0}, reason: ReasonAffinity,
		},
		{
			// 41.6 + 7.8 ms: within 50, but not by the 10% a copy must
			// spare.
			name: "TPOT SLO: a copy must meet it with room to spare",
			cfg:  func(c *Config) { c.SLOTPOT = 50 * time.Millisecond },
			eps:  []ep{{info: withRunning(healthy(0), 160), blocks: promptBlocks, gpu: promptBlocks}, {info: withRunning(healthy(0), 100)}},
			want: []int{0}, reason: ReasonAffinity,
		},
		{
			name: "TPOT SLO: met by a batch with room for the prefill",
			cfg:  func(c *Config) { c.SLOTPOT = 50 * time.Millisecond },
			eps:  []ep{{info: withRunning(healthy(0), 160), blocks: promptBlocks, gpu: promptBlocks}, {info: withRunning(healthy(0), 10)}},
			want: []int{1}, reason: ReasonSaturatedRelease,
		},
		{
			name: "a request's own SLO overrides",
			eps:  []ep{cold(0), warm(2*second, promptBlocks)},
			req:  Request{SLOTTFT: 10 * time.Second},
			want: []int{1}, reason: ReasonAffinity,
		},
		{
			name: "a subset named by a trusted filter: the best within it",
			eps:  []ep{warm(0, promptBlocks), cold(0), cold(second)},
			req:  Request{Allowed: []bool{false, false, true}},
			want: []int{2}, reason: ReasonLeastLoad,
		},
		{
			name: "unhealthy and other models are not eligible",
			eps: []ep{
				{info: snapshot.EndpointInfo{Models: []string{model}, Health: snapshot.HealthUnhealthy}, blocks: promptBlocks, gpu: promptBlocks},
				{info: snapshot.EndpointInfo{Models: []string{"other"}, Health: snapshot.HealthHealthy}, blocks: promptBlocks, gpu: promptBlocks},
				cold(5 * second),
			},
			want: []int{2}, reason: ReasonLeastLoad,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, hashes := fixture(t, tt.eps)
			p := picker(t, tt.cfg)
			r := tt.req
			r.Model, r.Hashes = model, hashes
			for seed := range uint64(8) {
				r.Random = seed * 0x9e3779b97f4a7c15
				d := p.Pick(v, &r)
				if !slices.Contains(tt.want, d.Endpoint) || d.Reason != tt.reason {
					t.Fatalf("chose %d (%v), want one of %v (%v); chosen %+v, runner-up %+v",
						d.Endpoint, d.Reason, tt.want, tt.reason, d.Chosen, d.RunnerUp)
				}
			}
		})
	}
}

func withRunning(e snapshot.EndpointInfo, n int) snapshot.EndpointInfo {
	e.Running = n
	return e
}

func withUsage(e snapshot.EndpointInfo, usage float64) snapshot.EndpointInfo {
	e.KVCacheUsage = usage
	return e
}

func withQueue(e snapshot.EndpointInfo, running, waiting int) snapshot.EndpointInfo {
	e.Running, e.Waiting = running, waiting
	return e
}

// withModel gives the endpoint a fitted latency model in which a queued
// request costs half a second of TTFT.
func withModel(e snapshot.EndpointInfo) snapshot.EndpointInfo {
	e.Model = predict.Default(second)
	e.Model.TTFTCoef[2], e.Model.TTFTCoef[3] = 0.001, 0.5
	e.Model.TTFTSamples, e.Model.ITLSamples = predict.MinSamples, predict.MinSamples
	return e
}

func withCapacity(e snapshot.EndpointInfo, capacity int) snapshot.EndpointInfo {
	e.IndexCapacity = capacity
	return e
}

func TestPickNone(t *testing.T) {
	p := picker(t, nil)
	if d := p.Pick(nil, &Request{}); d.Endpoint != -1 {
		t.Errorf("no snapshot: %+v", d)
	}
	v, hashes := fixture(t, []ep{{info: snapshot.EndpointInfo{Models: []string{model}, Health: snapshot.HealthDraining}}})
	if d := p.Pick(v, &Request{Model: model, Hashes: hashes}); d.Endpoint != -1 || d.Reason != ReasonFallback || d.Eligible != 0 {
		t.Errorf("nothing eligible: %+v", d)
	}
	if d := p.Pick(v, &Request{Model: "unknown", Hashes: hashes}); d.Endpoint != -1 {
		t.Errorf("unknown model: %+v", d)
	}
}

// TestDecisionExplains: the decision carries the chosen endpoint's and the
// runner-up's terms, which add up to their prices.
func TestDecisionExplains(t *testing.T) {
	v, hashes := fixture(t, []ep{warm(second/2, promptBlocks), cold(0)})
	d := picker(t, nil).Pick(v, &Request{Model: model, Hashes: hashes, OutputTokens: 100, Local: []Local{{Requests: 3}}})
	c, r := d.Chosen, d.RunnerUp
	if d.Endpoint != 0 || c.Endpoint != 0 || r.Endpoint != 1 {
		t.Fatalf("decision %+v", d)
	}
	if c.CachedTokens != promptTokens || c.UncachedTokens != 0 || c.Backlog != second/2 || c.Running != 3 || r.UncachedTokens != promptTokens {
		t.Errorf("terms: chosen %+v, runner-up %+v", c, r)
	}
	for _, x := range []Terms{c, r} {
		if got := x.TTFT + 100*x.ITL + x.Others + x.Eviction + x.CopyMargin; absDur(got-x.Price) > time.Millisecond {
			t.Errorf("terms %+v do not add up to the price", x)
		}
	}
	if !(c.Price < r.Price) {
		t.Errorf("the chosen price %v is not below the runner-up's %v", c.Price, r.Price)
	}
	if c.CopyMargin != 0 || r.CopyMargin <= 0 {
		t.Errorf("copy margins %v at the holder and %v at the cold endpoint, want none and some", c.CopyMargin, r.CopyMargin)
	}
}

func absDur(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}

// TestHotPrefixSpreads: a prefix hotter than one endpoint can serve keeps
// its endpoint until the queue there outprices a cold prefill, spills to a
// second, which then holds it too, and stays on those two: each request
// leaves a tenth of the prompt to prefill, ten are in flight at a time, and
// one endpoint with all ten queues as long as a cold prefill takes.
func TestHotPrefixSpreads(t *testing.T) {
	p := picker(t, nil)
	holds := []bool{true, false, false}
	var inFlight []int
	counts := make([]int, 3)
	for i := range 200 {
		eps := make([]ep, 3)
		for e := range eps {
			eps[e] = cold(0)
			if holds[e] {
				eps[e] = warm(0, promptBlocks)
			}
		}
		v, hashes := fixture(t, eps)
		local := make([]Local, 3)
		for _, e := range inFlight {
			local[e].PrefillTokens += promptTokens / 10
			local[e].Requests++
		}
		d := p.Pick(v, &Request{Model: model, Hashes: hashes, PromptTokens: promptTokens, Local: local, Random: uint64(i) * 0x9e3779b97f4a7c15})
		holds[d.Endpoint] = true
		counts[d.Endpoint]++
		if inFlight = append(inFlight, d.Endpoint); len(inFlight) > 10 {
			inFlight = inFlight[1:]
		}
	}
	warmCopies := 0
	for _, h := range holds {
		if h {
			warmCopies++
		}
	}
	if warmCopies != 2 || counts[0] < 80 {
		t.Errorf("requests per endpoint %v, %d warm copies: want the prefix on two endpoints sharing it", counts, warmCopies)
	}
}

// TestPlacementEven: sixteen new prefixes arriving one by one, each while
// the endpoints' queues are whatever they happen to be, end up four to an
// endpoint: where a prefix lands follows the room in the caches, not the
// momentary idleness that the next arrival reshuffles.
func TestPlacementEven(t *testing.T) {
	p := picker(t, nil)
	rng := rand.New(rand.NewPCG(7, 7))
	for trial := range 20 {
		groups := make([]int, 4)
		for i := range 16 {
			eps := make([]ep, 4)
			for e := range eps {
				eps[e] = ep{info: withCapacity(healthy(rng.IntN(second/2)), 40000), other: groups[e] * promptBlocks}
			}
			v, hashes := fixture(t, eps)
			d := p.Pick(v, &Request{Model: model, Hashes: hashes, Random: rng.Uint64()})
			if d.Reason != ReasonLeastLoad {
				t.Fatalf("prefix %d: %v", i, d.Reason)
			}
			groups[d.Endpoint]++
		}
		if slices.Min(groups) != 4 {
			t.Fatalf("trial %d: prefixes per endpoint %v, want 4 each", trial, groups)
		}
	}
}

// TestPlacementEvenByPrefixes: the same, when the blocks say little: each
// placed prefix brings its unique questions too, up to as many blocks as
// its shared part, so an endpoint of three prefixes may hold as many
// blocks as one of four. The prefix count cachesync publishes keeps the
// placement even.
func TestPlacementEvenByPrefixes(t *testing.T) {
	p := picker(t, nil)
	rng := rand.New(rand.NewPCG(8, 8))
	for trial := range 10 {
		groups := make([]int, 4)
		blocks := make([]int, 4)
		for i := range 16 {
			eps := make([]ep, 4)
			for e := range eps {
				eps[e] = ep{info: withCapacity(withRunning(healthy(0), rng.IntN(4)), 40000), other: blocks[e], prefixes: groups[e]}
			}
			v, hashes := fixture(t, eps)
			d := p.Pick(v, &Request{Model: model, Hashes: hashes, Random: rng.Uint64()})
			if d.Reason != ReasonLeastLoad {
				t.Fatalf("prefix %d: %v", i, d.Reason)
			}
			groups[d.Endpoint]++
			blocks[d.Endpoint] += promptBlocks / 2
			for e := range blocks { // questions asked of the prefixes already placed
				blocks[e] += rng.IntN(groups[e]*promptBlocks/8 + 1)
			}
		}
		if slices.Min(groups) != 4 {
			t.Fatalf("trial %d: prefixes per endpoint %v (blocks %v), want 4 each", trial, groups, blocks)
		}
	}
}

// TestTiesKeepTheCache: a copier priced within the tie tolerance of a
// holder never wins the toss (it would split the prefix's traffic for
// good); holders of as much of the prompt (within a block) still share it.
func TestTiesKeepTheCache(t *testing.T) {
	const tol, block = 0.005, 16
	cands := []cand{
		{sel: true, price: 2.721, cached: 9000},
		{sel: true, price: 2.723, cached: 0},
		{sel: true, price: 2.7215, cached: 8990},
		{sel: true, price: 2.9, cached: 9000},
	}
	seen := map[int]int{}
	for i := range 300 {
		seen[least(cands, tol, block, uint64(i)*0x9e3779b97f4a7c15)]++
	}
	if seen[1] != 0 || seen[3] != 0 || seen[0] < 60 || seen[2] < 60 {
		t.Errorf("choices %v: want the two holders within the tolerance, about evenly, never the copier or the dear holder", seen)
	}
}

// TestTies: equal prices are spread at random, different ones never.
func TestTies(t *testing.T) {
	v, hashes := fixture(t, []ep{cold(0), cold(0), cold(0), cold(second)})
	p := picker(t, nil)
	seen := map[int]int{}
	for i := range 300 {
		d := p.Pick(v, &Request{Model: model, Hashes: hashes, Random: uint64(i) * 0x9e3779b97f4a7c15})
		seen[d.Endpoint]++
	}
	if len(seen) != 3 || seen[3] != 0 {
		t.Errorf("choices %v: want the three idle endpoints, never the loaded one", seen)
	}
	for e, n := range seen {
		if n < 60 {
			t.Errorf("endpoint %d chosen %d of 300 times", e, n)
		}
	}
}

func TestConfig(t *testing.T) {
	for _, edit := range []func(*Config){
		func(c *Config) { c.Mode = 9 },
		func(c *Config) { c.PrefillRate = 0 },
		func(c *Config) { c.CPUDiscount = 1.5 },
		func(c *Config) { c.EvictionWeight = -1 },
		func(c *Config) { c.OthersWeight = 11 },
		func(c *Config) { c.TieTolerance = -1 },
		func(c *Config) { c.SLOTTFT = -1 },
		func(c *Config) { c.DefaultOutputTokens = 0 },
		func(c *Config) { c.BlockBytes = 0 },
	} {
		cfg := DefaultConfig()
		edit(&cfg)
		if _, err := New(cfg); err == nil {
			t.Errorf("accepted %+v", cfg)
		}
	}
	for _, s := range []string{"auto", "prefill", "decode"} {
		if m, err := ParseMode(s); err != nil || m.String() != s {
			t.Errorf("ParseMode(%q) = %v, %v", s, m, err)
		}
	}
	if _, err := ParseMode("fast"); err == nil {
		t.Error("ParseMode accepted fast")
	}
}

func TestPickNoAllocs(t *testing.T) {
	v, hashes := fixture(t, []ep{warm(0, promptBlocks), cold(0), warm(second, 100)})
	p := picker(t, func(c *Config) { c.SLOTTFT = time.Second })
	r := Request{Model: model, Hashes: hashes, Local: make([]Local, 3)}
	p.Pick(v, &r)
	if n := testing.AllocsPerRun(100, func() { p.Pick(v, &r) }); n != 0 {
		t.Errorf("Pick allocates %v times", n)
	}
}

// TestFallbacks: the endpoints a retry should try next, cheapest first,
// never the choice and never an ineligible one.
func TestFallbacks(t *testing.T) {
	v, hashes := fixture(t, []ep{cold(3 * second), warm(0, promptBlocks), cold(second), {info: snapshot.EndpointInfo{Models: []string{model}, Health: snapshot.HealthUnhealthy}}, cold(2 * second)})
	p := picker(t, nil)
	d := p.Pick(v, &Request{Model: model, Hashes: hashes})
	if d.Endpoint != 1 {
		t.Fatalf("chose %d", d.Endpoint)
	}
	for _, tc := range []struct {
		n    int
		want []int
	}{{0, nil}, {1, []int{2}}, {2, []int{2, 4}}, {8, []int{2, 4, 0}}} {
		if got := p.Fallbacks(nil, &d, tc.n); !slices.Equal(got, tc.want) {
			t.Errorf("Fallbacks(%d) = %v, want %v", tc.n, got, tc.want)
		}
	}
	if got := p.Fallbacks(nil, &Decision{Endpoint: -1}, 3); got != nil {
		t.Errorf("no choice: fallbacks %v", got)
	}
	dst := make([]int, 0, 8)
	if n := testing.AllocsPerRun(100, func() { dst = p.Fallbacks(dst[:0], &d, 3) }); n != 0 {
		t.Errorf("Fallbacks allocates %v times", n)
	}
}

// TestStepWait: of two endpoints alike but for where their engines are in
// a step, the one about to end its step serves the request a step sooner,
// and the terms say what each step had left; an engine the gateway does
// not stream from is put at half a step.
func TestStepWait(t *testing.T) {
	v, hashes := fixture(t, []ep{warm(0, promptBlocks), warm(0, promptBlocks)})
	local := []Local{{Requests: 4, StepAge: 0.001, StepLength: 0.050}, {Requests: 4, StepAge: 0.046, StepLength: 0.050}}
	d := picker(t, nil).Pick(v, &Request{Model: model, Hashes: hashes, OutputTokens: 100, Local: local})
	if d.Endpoint != 1 || absDur(d.Chosen.Wait-4*time.Millisecond) > 10*time.Microsecond || absDur(d.RunnerUp.Wait-49*time.Millisecond) > 10*time.Microsecond {
		t.Fatalf("chose %d with waits %v (runner-up %v); want 1, 4 ms against 49 ms", d.Endpoint, d.Chosen.Wait, d.RunnerUp.Wait)
	}
	if gap := d.RunnerUp.TTFT - d.Chosen.TTFT; absDur(gap-45*time.Millisecond) > time.Millisecond {
		t.Errorf("predicted TTFTs differ by %v, want the 45 ms of step between them", gap)
	}
	for _, c := range []struct {
		local Local
		want  float64
	}{
		{Local{Requests: 4}, -1}, // half of the predicted ITL
		{Local{}, 0},             // idle: the engine starts a step for it at once
		{Local{Requests: 4, StepAge: 0.2, StepLength: 0.05}, 0},
		// Less left than the lead: the request misses the step's end and
		// waits out the next step too.
		{Local{Requests: 4, StepAge: 0.048, StepLength: 0.05, StepLead: 0.003}, 0.052},
		{Local{Requests: 4, StepAge: 0.046, StepLength: 0.05, StepLead: 0.003}, 0.004},
		{Local{Requests: 4, StepAge: 0.2, StepLength: 0.05, StepLead: 0.003}, 0.05},
	} {
		v, hashes := fixture(t, []ep{warm(0, promptBlocks)})
		d := picker(t, nil).Pick(v, &Request{Model: model, Hashes: hashes, OutputTokens: 100, Local: []Local{c.local}})
		got := d.Chosen.Wait.Seconds()
		if c.want < 0 {
			// Half a step of the batch as it is; the ITL predicted is
			// with the request in it, a little longer.
			if half := d.Chosen.ITL.Seconds() / 2; !(got > 0.9*half && got < half) {
				t.Errorf("local %+v: wait %.6f s, want just under half the ITL, %.6f", c.local, got, half)
			}
		} else if math.Abs(got-c.want) > 1e-6 {
			t.Errorf("local %+v: wait %.6f s, want %.6f", c.local, got, c.want)
		}
	}
}

// TestMeetsSLO: a decision says whether any endpoint is predicted within
// the SLOs, which is what shedding asks, whichever endpoint it chose.
func TestMeetsSLO(t *testing.T) {
	holder := ep{info: withRunning(healthy(0), 160), blocks: promptBlocks, gpu: promptBlocks} // 60.3 ms a token
	tests := []struct {
		name   string
		slo    func(*Config)
		eps    []ep
		chosen int
		meets  bool
	}{
		{"no SLO", nil, []ep{holder, {info: withRunning(healthy(0), 130)}}, 0, true},
		// 1.35 times the ITL: saturated, which is no SLO missed.
		{"no SLO, the holder saturated", nil, []ep{holder, {info: withRunning(healthy(0), 110)}}, 1, true},
		{"TTFT: none within it", func(c *Config) { c.SLOTTFT = 100 * time.Millisecond }, []ep{cold(0), warm(3*second, promptBlocks)}, 0, false},
		{"TPOT: none within it once the prefill is counted", func(c *Config) { c.SLOTPOT = 50 * time.Millisecond },
			[]ep{holder, {info: withRunning(healthy(0), 110)}}, 0, false},
		// 49.4 ms: kept at the holder for want of room to spare, but
		// servable in time.
		{"TPOT: within it elsewhere, without room to spare", func(c *Config) { c.SLOTPOT = 50 * time.Millisecond },
			[]ep{holder, {info: withRunning(healthy(0), 100)}}, 0, true},
		{"TPOT: within it with room", func(c *Config) { c.SLOTPOT = 50 * time.Millisecond },
			[]ep{holder, {info: withRunning(healthy(0), 10)}}, 1, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, hashes := fixture(t, tt.eps)
			r := Request{Model: model, Hashes: hashes}
			d := picker(t, tt.slo).Pick(v, &r)
			if d.Endpoint != tt.chosen || d.MeetsSLO != tt.meets {
				t.Errorf("chose %d, MeetsSLO %v; want %d, %v", d.Endpoint, d.MeetsSLO, tt.chosen, tt.meets)
			}
		})
	}
}
