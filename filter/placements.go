package main

import (
	"errors"
	"time"

	"github.com/kvroute/kvroute/filter/internal/placed"
	"github.com/kvroute/kvroute/filter/proxywasm"
	"github.com/kvroute/kvroute/filter/proxywasm/types"
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
	table     placed.Table
	buf       []byte
	cas       uint32
	corrupted bool
}

// read decodes the stored table; false if shared data failed.
func (p *placements) read() bool {
	val, cas, err := proxywasm.GetSharedData(placedKey)
	if err != nil && !errors.Is(err, types.ErrorStatusNotFound) {
		proxywasm.LogError("kvroute: read recent placements: " + err.Error())
		return false
	}
	if err := p.table.Decode(val); err != nil && !p.corrupted {
		p.corrupted = true
		proxywasm.LogError("kvroute: recent placements table is corrupt; starting it afresh")
	}
	p.cas = max(cas, 1)
	return true
}

// match calls fn with every endpoint a recent placement shares leading
// blocks of hashes with.
func (p *placements) match(hashes []uint64, fn func(endpoint uint64, blocks int)) {
	if len(hashes) >= placed.Stride && p.read() {
		p.table.Match(hashes, time.Now().UnixMilli(), fn)
	}
}

// add records that hashes went to endpoint, whose first token is
// predicted after ttft.
func (p *placements) add(endpoint uint64, hashes []uint64, ttft time.Duration) {
	if len(hashes) < placed.Stride {
		return
	}
	now := time.Now()
	expires := now.Add(2*min(ttft, time.Minute) + placedLinger).UnixMilli()
	for range casAttempts {
		if !p.read() {
			return
		}
		p.table.Add(endpoint, hashes, now.UnixMilli(), expires)
		p.buf = p.table.Append(p.buf[:0])
		err := proxywasm.SetSharedData(placedKey, p.buf, p.cas)
		if err == nil {
			return
		}
		if !errors.Is(err, types.ErrorStatusCasMismatch) {
			proxywasm.LogError("kvroute: write recent placements: " + err.Error())
			return
		}
	}
	proxywasm.LogWarn("kvroute: a placement was lost to contention")
}
