package daemon

import (
	"slices"
	"testing"

	"github.com/kvroute/kvroute/cachesync/internal/scrape"
	"github.com/kvroute/kvroute/shared/blockhash"
	"github.com/kvroute/kvroute/shared/snapshot"
)

// TestEngineSlots checks that a slot's prompt is hashed as a gateway
// hashes a request for the engine's model, so that the two meet in the
// snapshot's slot rows.
func TestEngineSlots(t *testing.T) {
	cfg := blockhash.Config{BlockSize: 8}
	prompt := "You are a helpful assistant. Answer briefly. Question: what is 2+2?"
	gateway := blockhash.Append(nil, blockhash.Seed("gemma-3-270m", ""), []byte(prompt), cfg)
	st := scrape.State{Models: []string{"gemma-3-270m"}, Slots: []scrape.Slot{
		{ID: 0, Busy: true, Remaining: 9, Prompt: prompt},
		{ID: 1},
		{ID: snapshot.MaxEngineSlots, Prompt: prompt},
	}}
	var s engineSlots
	rows := s.update(&st, cfg)
	if len(rows) != 2 || rows[0].ID != 0 || !rows[0].Busy || rows[0].Remaining != 9 || !slices.Equal(rows[0].Hashes, gateway) {
		t.Fatalf("rows %+v: want slot 0 busy with 9 tokens left, holding the gateway's hashes of the prompt", rows)
	}
	if rows[1].ID != 1 || len(rows[1].Hashes) != 0 {
		t.Errorf("an empty slot: %+v", rows[1])
	}
	// An unchanged prompt keeps its hashes; a changed one is hashed again.
	first := &rows[0].Hashes[0]
	if rows = s.update(&st, cfg); &rows[0].Hashes[0] != first {
		t.Error("an unchanged prompt was hashed again")
	}
	st.Slots[0].Prompt = "Another prompt entirely, longer than a block."
	if rows = s.update(&st, cfg); slices.Equal(rows[0].Hashes, gateway) || len(rows[0].Hashes) != 5 {
		t.Errorf("a changed prompt kept %d hashes", len(rows[0].Hashes))
	}
	// A server of two models does not say whose prompt a slot holds.
	st.Models = []string{"a", "b"}
	if rows = s.update(&st, cfg); rows != nil {
		t.Errorf("two models: rows %+v, want none", rows)
	}
}
