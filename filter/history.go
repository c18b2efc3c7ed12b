package main

import (
	"cmp"
	"slices"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/kvroute/kvroute/filter/internal/inflight"
	"github.com/kvroute/kvroute/shared/snapshot"
)

// The snapshot's running and waiting counts of an engine are as of
// cachesync's last scrape of it, a few hundred milliseconds old or more;
// this gateway's own requests there it knows as of now. Taken at face
// value, a request of its own that finished since the scrape still counts
// as running, and a warm engine looks busy with a request that is gone. So
// every VM keeps, tick by tick, what the whole gateway had in flight per
// endpoint, and the policy subtracts what it had when the engine was
// scraped: the rest of the engine's load is the other gateways' (and
// clients'), to which it adds its own, as of now.

// historyLen ticks are kept: at the default 100 ms, 6.4 s, past the
// default 5 s at which a snapshot stops being trusted for load.
const historyLen = 64

// history is the gateway's requests in flight per endpoint at each of the
// last historyLen ticks.
type history struct {
	at     [historyLen]int64 // unix ms; 0 for a sample not taken
	counts [historyLen][]inflight.Entry
	next   int
	// atLoad is, per slot of the snapshot generation gen, this gateway's
	// requests in flight when the engine's load was read; -1 unknown.
	atLoad []int64
	gen    uint64
	addr   []byte // scratch for an endpoint's address
}

// record takes the tick's sample from the in-flight table t.
func (h *history) record(now time.Time, t *inflight.Table, ttl time.Duration) {
	i := h.next
	h.next = (h.next + 1) % historyLen
	h.at[i] = now.UnixMilli()
	c := h.counts[i][:0]
	t.Each(h.at[i], ttl.Milliseconds(), func(e inflight.Entry) {
		if e.Requests == 0 {
			return
		}
		for k := range c {
			if c[k].Endpoint == e.Endpoint {
				c[k].Requests += e.Requests
				return
			}
		}
		c = append(c, inflight.Entry{Endpoint: e.Endpoint, Counts: inflight.Counts{Requests: e.Requests}})
	})
	// Sorted, so that rebase finds an endpoint by binary search: a pool of
	// a thousand busy endpoints must not cost a million steps a tick.
	slices.SortFunc(c, func(a, b inflight.Entry) int { return cmp.Compare(a.Endpoint, b.Endpoint) })
	h.counts[i] = c
}

// rebase works out, for every endpoint of m, what this gateway had in
// flight when cachesync read the engine's load: the most of any sample
// within a tick of that moment, since a sample is a tick apart from it at
// worst. Unknown (-1) when the history does not reach back that far or m
// does not say when.
func (h *history) rebase(m *snapshot.Manifest, tick time.Duration) {
	n := m.NumEndpoints()
	if cap(h.atLoad) < n {
		h.atLoad = make([]int64, n)
	}
	h.atLoad = h.atLoad[:n]
	h.gen = m.Generation()
	oldest := int64(0)
	for _, at := range h.at {
		if at != 0 && (oldest == 0 || at < oldest) {
			oldest = at
		}
	}
	slack := tick.Milliseconds()
	for i := range n {
		h.atLoad[i] = -1
		e := m.Endpoint(i)
		if e.Vacant() {
			continue
		}
		loaded, ok := e.LoadAt()
		if !ok || oldest == 0 || loaded.UnixMilli() < oldest {
			continue
		}
		h.addr = e.AppendAddr(h.addr[:0])
		ms, hash := loaded.UnixMilli(), xxhash.Sum64(h.addr)
		most := int64(-1)
		for s, at := range h.at {
			if at == 0 || at < ms-slack || at > ms+slack {
				continue
			}
			count := int64(0)
			c := h.counts[s]
			if k, ok := slices.BinarySearchFunc(c, hash, func(e inflight.Entry, h uint64) int { return cmp.Compare(e.Endpoint, h) }); ok {
				count = c[k].Requests
			}
			most = max(most, count)
		}
		h.atLoad[i] = most
	}
}

// atLoadOf returns slot i's figure for the generation gen: -1 if the
// history was worked out for another one.
func (h *history) atLoadOf(gen uint64, i int) int64 {
	if h.gen != gen || i >= len(h.atLoad) {
		return -1
	}
	return h.atLoad[i]
}
