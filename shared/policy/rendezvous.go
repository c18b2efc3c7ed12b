package policy

import (
	"slices"

	"github.com/cespare/xxhash/v2"
)

// Rendezvous appends to dst the indexes of the n endpoints with the highest
// rendezvous (highest-random-weight) scores for key, best first: the choice,
// then where a retry goes next. The same key ranks the same endpoints as
// long as they are listed, and removing one endpoint moves only the keys it
// led, each to its next-ranked endpoint.
func Rendezvous(dst []int, key uint64, endpoints []string, n int) []int {
	start := len(dst)
	for len(dst)-start < n {
		best, bestScore := -1, uint64(0)
		for i, ep := range endpoints {
			if slices.Contains(dst[start:], i) {
				continue
			}
			if s := mix(key ^ xxhash.Sum64String(ep)); best < 0 || s > bestScore {
				best, bestScore = i, s
			}
		}
		if best < 0 {
			break
		}
		dst = append(dst, best)
	}
	return dst
}

// mix is the splitmix64 finaliser: it spreads the XOR of two hashes over
// all 64 bits so that scores of nearby keys are independent.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
