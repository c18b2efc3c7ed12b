package policy

// saturateDecode marks, in ModeAuto with no SLO stated, the candidates
// whose batch, once its queue is in it, is predicted an inter-token
// latency more than decodeSaturation times the pool's lowest: saturated by
// their decode load. choose passes them over while any other may take the
// request, and a saturated holder keeps no copier waiting (keepsCopiers),
// so a holder stays sticky until its batch runs that much slower than
// another endpoint's.
//
// The price cannot see this by itself: it prices one request, and a copy's
// prefill, which stalls every request decoding at the copier, is paid now
// while the decode load it relieves is paid by every later request of the
// prefix. Where a prefix's answers are long, that load lasts: on mixed
// (answers of 20 to 1,500 tokens), an engine holding groups whose answers
// ran long had 215 requests decoding at 97 ms a token while another had
// 120 at 62 ms, and the holder still priced lower than a copy; its
// requests all missed a 50 ms TPOT. A stated TPOT SLO moved them (the
// kvroute-slo arm); without one, this ratio does.
//
// It is the batch's ITL, not the request's time per token (meets): a
// copier's own cold prefill is its price's business, not a sign of its
// load. And its queue counts: an engine whose cache is too full to admit
// its queue runs a small batch fast; compared by its running requests
// alone, it made every other endpoint look saturated, drew the whole
// pool's traffic, and thrashed (on mixed at 64 req/s, 523 requests to it
// against 122 to two others, its hit rate 67%, TTFT p90 188 s).
// It returns how many it marked.
func saturateDecode(cands []cand) int {
	best := -1.0
	for i := range cands {
		if c := &cands[i]; c.eligible && (best < 0 || c.loaded < best) {
			best = c.loaded
		}
	}
	n := 0
	for i := range cands {
		c := &cands[i]
		c.saturated = c.eligible && c.loaded > decodeSaturation*best
		if c.saturated {
			n++
		}
	}
	return n
}

// decodeSaturation is how many times the pool's lowest predicted ITL an
// endpoint's may be before it counts as saturated. In every workload of
// the bench but mixed, the chosen endpoint's predicted ITL was within 1.15
// of the runner-up's in 99% of decisions (1.11 on b2b-saas, 1.12 on the
// 60% sweep); on mixed, over 1.3 in 3-18%.
const decodeSaturation = 1.3
