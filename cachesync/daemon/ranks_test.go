package daemon

import (
	"testing"

	"github.com/kvroute/kvroute/shared/snapshot"
)

type setSink map[rankKey]bool

func (s setSink) Add(h uint64, t snapshot.Tier)    { s[rankKey{h, t}] = true }
func (s setSink) Remove(h uint64, t snapshot.Tier) { delete(s, rankKey{h, t}) }
func (s setSink) Clear()                           { clear(s) }

func TestRanksHoldWhileAnyRankHolds(t *testing.T) {
	idx := setSink{}
	r := newRanks(idx, 2)
	a, b := r.rank(0), r.rank(1)
	a.Add(1, snapshot.TierGPU)
	b.Add(1, snapshot.TierGPU)
	b.Add(2, snapshot.TierGPU)
	a.Add(1, snapshot.TierGPU) // a duplicate store changes nothing
	a.Remove(1, snapshot.TierGPU)
	if !idx[rankKey{1, snapshot.TierGPU}] {
		t.Fatal("block 1 dropped while rank 1 still holds it")
	}
	b.Clear()
	if len(idx) != 0 {
		t.Errorf("after rank 1 cleared, index holds %v", idx)
	}
	a.Add(3, snapshot.TierCPU)
	b.Clear()
	if !idx[rankKey{3, snapshot.TierCPU}] {
		t.Error("rank 1's clear dropped rank 0's block")
	}
}
