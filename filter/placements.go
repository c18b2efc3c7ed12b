package main

import (
	"time"

	"github.com/kvroute/kvroute/filter/internal/placed"
)

// placedKey holds the prompts this Envoy recently sent to be prefilled,
// shared by its worker VMs (see package placed).
const placedKey = "kvroute/placed"

// placedLinger is how long past its predicted first token a placement is
// remembered: the engine's event, cachesync's build and the filter's fetch
// take a few sync intervals, and the prediction may be short.
const placedLinger = 2 * time.Second

// placements records where this gateway sent prompts to be prefilled and
// finds them again for the requests that follow, until the snapshot shows
// them (see package placed).
type placements struct {
	table  placed.Table
	stored casValue
}

// read loads the table as the workers last wrote it; false if shared data
// failed.
func (p *placements) read() bool { return p.stored.load(&p.table) }

// match calls fn with every endpoint a recent placement shares leading
// blocks of hashes with, as of the last read.
func (p *placements) match(hashes []uint64, fn func(endpoint uint64, blocks int)) {
	if len(hashes) >= placed.Stride {
		p.table.Match(hashes, time.Now().UnixMilli(), fn)
	}
}

// add records that hashes went to endpoint, bringing it blocks it did not
// hold (all of them: isNew), with its first token predicted after ttft.
func (p *placements) add(endpoint uint64, hashes []uint64, blocks int, isNew bool, ttft time.Duration) {
	if len(hashes) < placed.Stride {
		return
	}
	now := time.Now()
	ttft = min(ttft, time.Minute)
	expires := now.Add(2*ttft + placedLinger).UnixMilli()
	p.stored.update(&p.table, func() { p.table.Add(endpoint, hashes, blocks, isNew, ttft.Milliseconds(), now.UnixMilli(), expires) })
}
