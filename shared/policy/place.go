package policy

// placeNew marks the candidates a prompt may go to. A prompt the pool
// holds none of (within a block) starts a prefix that its followers will
// come back for, wherever it lands: the load it meets now is paid once,
// the share of the pool's traffic it brings is paid for as long as it
// stays cached. So of the endpoints where its first token is predicted
// within one cold prefill of the quickest (a roomy endpoint with a long
// queue is passed over), it may go only to those whose cache is within
// half this prompt of the emptiest, counting the prefills in flight there,
// which the index has not seen yet; the price picks among them. The delay
// its prefill adds to the requests already there is paid once too, and
// does not count against room: it kept a fifth group off an engine with
// two requests running in a b2b-saas warm-up, and onto one that then
// carried five of sixteen. Placed so, the pool's prefixes spread evenly
// over its caches whatever order they arrive in, instead of following
// whichever endpoint is idle at the moment a prefix is first seen. Any
// other prompt may go to any eligible endpoint.
func placeNew(cands []cand, j *job) {
	most, quickest := 0.0, -1
	for i := range cands {
		c := &cands[i]
		c.roomy = c.eligible
		if !c.eligible {
			continue
		}
		most = max(most, c.cached)
		if quickest < 0 || c.ttft < cands[quickest].ttft {
			quickest = i
		}
	}
	if quickest < 0 || most >= j.blockTokens {
		return
	}
	limit := cands[quickest].ttft + cands[quickest].prefill
	emptiest := -1.0
	for i := range cands {
		c := &cands[i]
		c.roomy = c.eligible && c.ttft <= limit
		if c.roomy && c.fill >= 0 && (emptiest < 0 || c.fill < emptiest) {
			emptiest = c.fill
		}
	}
	if emptiest < 0 {
		return
	}
	for i := range cands {
		if c := &cands[i]; c.roomy && c.fill >= 0 {
			// Half the prompt in the endpoint's own blocks: caches of
			// different sizes fill in proportion.
			c.roomy = c.fill-0.5*float64(j.blocks)/c.capacity <= emptiest
		}
	}
}
