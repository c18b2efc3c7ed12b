package bridge

import (
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/kvroute/kvroute/cachesync/internal/kvevents"
	"github.com/kvroute/kvroute/shared/snapshot"
)

// countSink counts what it is told and keeps nothing, so that measurements
// see the bridge alone.
type countSink struct{ adds, removes int }

func (c *countSink) Add(uint64, snapshot.Tier)    { c.adds++ }
func (c *countSink) Remove(uint64, snapshot.Tier) { c.removes++ }
func (c *countSink) Clear()                       {}

var (
	streamOnce sync.Once
	stream     []uint32
)

// tokenStream returns 200k cl100k tokens of English-like text.
func tokenStream(t testing.TB) []uint32 {
	_, tik := loadSimVocab(t)
	streamOnce.Do(func() {
		words := strings.Fields("the a of to and in is it that for on with as was at by an be this from or " +
			"cache prefix request engine token block routing replica latency throughput model prompt user system " +
			"assistant answer question Rotterdam warehouse pallets customers routes lanes volumes week data " +
			"function return value error file, line. code: (x) [y] {z} 1234 56.7 — naïve café")
		r := rand.New(rand.NewPCG(9, 9))
		var b strings.Builder
		for b.Len() < 900_000 {
			b.WriteString(words[r.IntN(len(words))])
			if r.IntN(12) == 0 {
				b.WriteString(".\n")
			} else {
				b.WriteByte(' ')
			}
		}
		for _, id := range tik.EncodeOrdinary(b.String()) {
			stream = append(stream, uint32(id))
		}
	})
	return stream
}

// feeder plays an engine storing 32-block prompts of 16-token blocks, in
// events of 8 blocks, at random places in the token stream, and evicting
// its oldest blocks beyond a capacity (0: never).
type feeder struct {
	toks     []uint32
	r        *rand.Rand
	next     uint64
	capacity int
	held     []uint64
	hashes   []uint64
	batch    kvevents.Batch
}

func newFeeder(t testing.TB, capacity int) *feeder {
	return &feeder{toks: tokenStream(t), r: rand.New(rand.NewPCG(1, 1)), capacity: capacity}
}

// prompt stores one 32-block prompt.
func (f *feeder) prompt(e *Engine) {
	start := f.r.IntN(len(f.toks) - 32*16)
	var parent uint64
	for ev := range 4 {
		f.batch.Events = f.batch.Events[:0]
		stored := kvevents.Event{Kind: kvevents.BlockStored, BlockSize: 16, Medium: "GPU", Parent: parent, HasParent: ev > 0,
			Tokens: f.toks[start+ev*128 : start+(ev+1)*128]}
		f.hashes = f.hashes[:0]
		for range 8 {
			f.next++
			f.hashes = append(f.hashes, f.next)
			f.held = append(f.held, f.next)
		}
		stored.Hashes = f.hashes
		parent = f.next
		f.batch.Events = append(f.batch.Events, stored)
		if f.capacity > 0 && len(f.held) > f.capacity {
			n := len(f.held) - f.capacity
			f.batch.Events = append(f.batch.Events, kvevents.Event{Kind: kvevents.BlockRemoved, Hashes: f.held[:n:n], Medium: "GPU"})
			f.held = f.held[n:]
		}
		e.Batch(&f.batch)
	}
}

// BenchmarkStore measures engine blocks indexed per second by an engine at
// its capacity of 100k blocks (each store comes with an eviction).
func BenchmarkStore(b *testing.B) {
	v, _ := loadSimVocab(b)
	e := newEngine(b, Config{Model: "m", Vocab: v, Capacity: 100_000}, &countSink{})
	f := newFeeder(b, 100_000)
	for range 100_000 / 32 {
		f.prompt(e)
	}
	b.ReportAllocs()
	b.ResetTimer()
	n := 0
	for n < b.N {
		f.prompt(e)
		n += 32
	}
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "blocks/s")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n), "ns/block")
}

// heapPerBlock stores n engine blocks and returns the heap they take per
// block, and the bridge's own account of it.
func heapPerBlock(t testing.TB, n int) (heap, own float64) {
	v, _ := loadSimVocab(t)
	f := newFeeder(t, 0)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	e := newEngine(t, Config{Model: "m", Vocab: v, Capacity: n}, &countSink{})
	for range n / 32 {
		f.prompt(e)
	}
	f.batch, f.held = kvevents.Batch{}, nil
	runtime.GC()
	runtime.ReadMemStats(&after)
	st := e.Stats()
	runtime.KeepAlive(e)
	if st.Blocks != n/32*32 || st.Evicted != 0 {
		t.Fatalf("stats %+v", st)
	}
	return float64(after.HeapAlloc-before.HeapAlloc) / float64(st.Blocks), float64(st.Bytes) / float64(st.Blocks)
}

// TestMemoryPerBlock keeps the state per engine block small and the
// bridge's own account of it true: measured at 140-150 bytes a block, of
// 16 tokens of English text.
func TestMemoryPerBlock(t *testing.T) {
	heap, own := heapPerBlock(t, 100_000)
	t.Logf("%.0f heap bytes per engine block (the bridge counts %.0f)", heap, own)
	if heap > 180 || own > 180 || own < heap*0.9 {
		t.Fatalf("%.0f heap bytes per engine block (the bridge counts %.0f), want at most 180", heap, own)
	}
}

// BenchmarkMemory reports the heap per engine block and per million engine
// blocks, for one million blocks (run with -benchtime=1x).
func BenchmarkMemory(b *testing.B) {
	for range b.N {
		heap, own := heapPerBlock(b, 1<<20)
		b.ReportMetric(heap, "B/block")
		b.ReportMetric(own, "counted-B/block")
		b.ReportMetric(heap*1e6/(1<<20), "MiB/1M-blocks")
	}
}
