package daemon

import (
	"github.com/kvroute/kvroute/cachesync/internal/scrape"
	"github.com/kvroute/kvroute/shared/blockhash"
	"github.com/kvroute/kvroute/shared/snapshot"
)

// engineSlots keeps a llama.cpp engine's slots as the snapshot lists them,
// each slot's prompt hashed again only when it changes: the engine is
// scraped every second, and its slots mostly keep their prompts.
type engineSlots struct {
	model   string
	prompts map[int]string
	hashes  map[int][]uint64
	rows    []snapshot.EngineSlot
}

// update returns st's slots with the block hashes of their prompts as a
// gateway hashes a request for the engine's model: nil unless the engine
// serves exactly one model (a slot holds one model's prompt, and a server
// swapping several does not say whose).
func (s *engineSlots) update(st *scrape.State, cfg blockhash.Config) []snapshot.EngineSlot {
	if len(st.Slots) == 0 || len(st.Models) != 1 {
		s.rows = s.rows[:0]
		return nil
	}
	if s.model != st.Models[0] || s.prompts == nil {
		s.model, s.prompts, s.hashes = st.Models[0], map[int]string{}, map[int][]uint64{}
	}
	seed := blockhash.Seed(s.model, "")
	s.rows = s.rows[:0]
	for _, sl := range st.Slots {
		if sl.ID >= snapshot.MaxEngineSlots {
			continue // beyond what a snapshot lists; requests there are routed without a slot
		}
		if p, ok := s.prompts[sl.ID]; !ok || p != sl.Prompt {
			s.prompts[sl.ID] = sl.Prompt
			s.hashes[sl.ID] = blockhash.Append(nil, seed, []byte(sl.Prompt), cfg)
		}
		s.rows = append(s.rows, snapshot.EngineSlot{ID: sl.ID, Busy: sl.Busy, Remaining: sl.Remaining, Hashes: s.hashes[sl.ID]})
	}
	return s.rows
}
