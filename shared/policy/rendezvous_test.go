package policy

import (
	"strconv"
	"testing"
)

func TestRendezvous(t *testing.T) {
	if got := Rendezvous(1, nil); got != -1 {
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
		before[k] = Rendezvous(uint64(k)*0x9e3779b97f4a7c15, eps)
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
		got := rest[Rendezvous(uint64(k)*0x9e3779b97f4a7c15, rest)]
		if before[k] != 3 && got != eps[before[k]] {
			t.Fatalf("key %d moved from %s to %s", k, eps[before[k]], got)
		}
	}
}
