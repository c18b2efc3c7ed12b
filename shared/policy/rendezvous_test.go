package policy

import (
	"slices"
	"strconv"
	"testing"
)

// first is Rendezvous's choice, -1 for none.
func first(key uint64, endpoints []string) int {
	if r := Rendezvous(nil, key, endpoints, 1); len(r) > 0 {
		return r[0]
	}
	return -1
}

func TestRendezvous(t *testing.T) {
	if got := first(1, nil); got != -1 {
		t.Errorf("no endpoints: %d", got)
	}
	eps := make([]string, 10)
	for i := range eps {
		eps[i] = "10.0.0." + strconv.Itoa(i) + ":8000"
	}
	const keys = 10000
	before := make([]int, keys)
	count := make([]int, len(eps))
	for k := range keys {
		before[k] = first(uint64(k)*0x9e3779b97f4a7c15, eps)
		count[before[k]]++
	}
	for i, n := range count {
		if n < keys/len(eps)*8/10 || n > keys/len(eps)*12/10 {
			t.Errorf("endpoint %d got %d of %d keys", i, n, keys)
		}
	}
	// Removing endpoint 3 moves only its keys; the order of the list does
	// not matter.
	rest := append(append([]string{}, eps[4:]...), eps[:3]...)
	for k := range keys {
		got := rest[first(uint64(k)*0x9e3779b97f4a7c15, rest)]
		if before[k] != 3 && got != eps[before[k]] {
			t.Fatalf("key %d moved from %s to %s", k, eps[before[k]], got)
		}
	}
}

func TestRendezvousRanks(t *testing.T) {
	eps := []string{"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000", "10.0.0.4:8000"}
	for key := range uint64(200) {
		r := Rendezvous(nil, key, eps, 3)
		if len(r) != 3 || r[0] != first(key, eps) || r[0] == r[1] || r[1] == r[2] || r[0] == r[2] {
			t.Fatalf("key %d: ranked %v, first %d", key, r, first(key, eps))
		}
		// The runner-up is the choice once the first is gone: a retry
		// goes where the key would move.
		rest := slices.Delete(slices.Clone(eps), r[0], r[0]+1)
		if eps[r[1]] != rest[first(key, rest)] {
			t.Fatalf("key %d: runner-up %s, but without %s the key goes to %s", key, eps[r[1]], eps[r[0]], rest[first(key, rest)])
		}
	}
	if r := Rendezvous(nil, 1, eps[:2], 5); len(r) != 2 {
		t.Errorf("ranked %v of two endpoints", r)
	}
}
