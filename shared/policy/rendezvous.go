package policy

import (
	"slices"

	"github.com/cespare/xxhash/v2"
)

// Rendezvous returns the index of the endpoint with the highest
// rendezvous (highest-random-weight) score for key, or -1 if endpoints is
// empty. The same key maps to the same endpoint as long as that endpoint is
// listed, and removing one endpoint moves only the keys it held.
func Rendezvous(key uint64, endpoints []string) int {
	best, bestScore := -1, uint64(0)
	for i, ep := range endpoints {
		s := mix(key ^ xxhash.Sum64String(ep))
		if best < 0 || s > bestScore {
			best, bestScore = i, s
		}
	}
	return best
}

// RendezvousRanked appends to dst the indexes of the n endpoints with the
// highest rendezvous scores for key, best first (the first is Rendezvous's
// choice): where a retry goes next, still the same for the same key.
func RendezvousRanked(dst []int, key uint64, endpoints []string, n int) []int {
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
