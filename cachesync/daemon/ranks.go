package daemon

import (
	"sync"

	"github.com/kvroute/kvroute/cachesync/internal/bridge"
	"github.com/kvroute/kvroute/shared/snapshot"
)

// ranks merges the bridges of a data-parallel engine's ranks into the one
// index endpoint they share: every rank has a prefix cache of its own, the
// endpoint holds a block while any rank does, and one rank's eviction or
// restart must not drop what another still holds.
type ranks struct {
	mu    sync.Mutex
	sink  bridge.Sink
	count map[rankKey]int
	held  []map[rankKey]struct{} // by rank
}

type rankKey struct {
	h    uint64
	tier snapshot.Tier
}

func newRanks(sink bridge.Sink, n int) *ranks {
	r := &ranks{sink: sink, count: map[rankKey]int{}, held: make([]map[rankKey]struct{}, n)}
	for i := range r.held {
		r.held[i] = map[rankKey]struct{}{}
	}
	return r
}

// rank returns the sink for rank i's bridge.
func (r *ranks) rank(i int) bridge.Sink { return rankSink{r, i} }

type rankSink struct {
	r *ranks
	i int
}

func (s rankSink) Add(h uint64, t snapshot.Tier) {
	r, k := s.r, rankKey{h, t}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.held[s.i][k]; ok {
		return
	}
	r.held[s.i][k] = struct{}{}
	if r.count[k]++; r.count[k] == 1 {
		r.sink.Add(h, t)
	}
}

func (s rankSink) Remove(h uint64, t snapshot.Tier) {
	r := s.r
	r.mu.Lock()
	defer r.mu.Unlock()
	r.drop(s.i, rankKey{h, t})
}

func (r *ranks) drop(i int, k rankKey) {
	if _, ok := r.held[i][k]; !ok {
		return
	}
	delete(r.held[i], k)
	if r.count[k]--; r.count[k] == 0 {
		delete(r.count, k)
		r.sink.Remove(k.h, k.tier)
	}
}

// Clear drops what this rank held, and only that.
func (s rankSink) Clear() {
	r := s.r
	r.mu.Lock()
	defer r.mu.Unlock()
	for k := range r.held[s.i] {
		r.drop(s.i, k)
	}
}
