package policy

import "github.com/kvroute/kvroute/shared/snapshot"

// Slot returns the engine slot to name for request r on the endpoint d
// chose, or -1 to let the engine pick, for an engine whose cache is a
// prompt per slot (llama.cpp's: snapshot.EngineSlot). Such an engine gives
// a request that names no slot an idle one, and when the slot holding the
// request's prefix is busy, that is another slot: the request prefills in
// full and evicts whatever that slot held. Named, the request waits for
// its slot instead. So the slot holding the most of the prompt is named
// when it is idle, or when its request's remaining tokens, at the
// endpoint's predicted inter-token latency, take less time than
// prefilling what the slot holds of the prompt.
//
// The busy flag is as of cachesync's last read of the engine (a scrape
// interval or less), so a request named to a slot that has since taken a
// long answer waits for it. It does not allocate.
func (p *Picker) Slot(v *snapshot.View, d *Decision, r *Request) int {
	if d.Endpoint < 0 || v == nil || !v.Loaded() {
		return -1
	}
	m := v.Manifest()
	s, ok := m.SlotHolding(d.Endpoint, r.Hashes)
	if !ok {
		return -1
	}
	if !s.Busy {
		return s.ID
	}
	rate := m.Endpoint(d.Endpoint).PrefillRate()
	if rate <= 0 {
		rate = p.cfg.PrefillRate
	}
	saved := float64(s.Blocks) * float64(p.cfg.BlockBytes) / BytesPerToken(m) / rate
	wait := float64(s.Remaining) * d.Chosen.ITL.Seconds()
	if wait < saved {
		return s.ID
	}
	return -1
}
