package policy

// placeNew marks the candidates a prompt may go to. A prompt the pool holds
// none of (within a block) starts a prefix that its followers will come
// back for, wherever it lands: the load it meets now is paid once, the
// share of the pool's traffic it brings is paid for as long as it stays
// cached. So of the endpoints where its first token is predicted within one
// cold prefill of the quickest (a roomy endpoint with a long queue is
// passed over) and, if any is, not saturated by its decode load
// (saturateDecode: the prefixes it draws already bring more than their
// share), it may go only to those drawing traffic with the fewest prefixes,
// counting those placed there since the snapshot, and of those to the ones
// whose cache is within half this prompt of the emptiest, counting the
// prefills in flight there, which the index has not seen yet; the price
// picks among them.
//
// Prefixes come first because blocks are a poor count of traffic: one
// tenant's unique questions hold as many blocks as another's shared system
// prompt. By blocks alone, an engine holding three b2b-saas groups whose
// questions had all been asked looked as full as one holding four, and
// the price (the delay the prefill adds to the one more request running
// there, paid once) sent a sixteenth group to the four: 5/4/4/3 groups,
// and requests per engine 20% apart for the rest of the run.
//
// Placed so, the pool's prefixes spread evenly over its caches whatever
// order they arrive in, instead of following whichever endpoint is idle at
// the moment a prefix is first seen. Any other prompt may go to any
// eligible endpoint.
func placeNew(cands []cand, j *job) {
	quickest := -1
	for i := range cands {
		c := &cands[i]
		c.roomy = c.eligible
		if c.eligible && (quickest < 0 || c.ttft < cands[quickest].ttft) {
			quickest = i
		}
	}
	if quickest < 0 || j.most >= j.blockTokens {
		return
	}
	limit := cands[quickest].ttft + cands[quickest].prefill
	calm := false // some endpoint within the limit is not saturated
	for i := range cands {
		c := &cands[i]
		c.roomy = c.eligible && c.ttft <= limit
		calm = calm || (c.roomy && !c.saturated)
	}
	fewest := -1
	for i := range cands {
		c := &cands[i]
		c.roomy = c.roomy && (!calm || !c.saturated)
		if c.roomy && (fewest < 0 || c.prefixes < fewest) {
			fewest = c.prefixes
		}
	}
	emptiest := -1.0
	for i := range cands {
		c := &cands[i]
		c.roomy = c.roomy && c.prefixes == fewest
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

// placeCopies keeps a prompt the pool holds from copying its prefix to an
// endpoint that would unbalance the pool for good. A copy is a placement
// too: from then on the copier draws a share of the prefix's traffic, for
// as long as it stays cached. Copied to an endpoint that already draws as
// much traffic as the holder (as many prefixes), the share moves the
// wrong way and stays: in a b2b-saas warm-up a holder prefilling another
// group's first request was priced 8% above an idle engine of as many
// groups, past the copy margin, and that group's later prompts split
// between the two for the rest of the run (engines 190/211/209/230
// requests at 56 req/s, TTFT p90 3.2 s at 64 against 0.2 s without the
// copy). What made the holder dear (a prefill ahead of it, the requests
// decoding there that minute) passes within seconds.
//
// A copier one prefix short of the holder gains nothing either: with a
// share of the prefix it draws about as much as the holder, and in a
// warm-up the prefix it is short is the room for a group not seen yet.
// In another b2b-saas warm-up an engine of three groups copied a fourth
// engine's group, priced 10 ms below it; half a second later the
// sixteenth group's first request found it busy with the copy and went to
// an engine of four (the knee fell from 64 req/s to below 40). An
// endpoint drawing nothing is the exception: it is idle capacity, and
// its copy is how a hot prefix spills.
//
// So while a holder that draws no more than one prefix above the copier
// (or no more than an idle copier) is priced within the copy's own
// prefill of the copier (whose price already pays for the copy) once for
// each prefix the holder draws, and meets the request's SLOs, the copier
// is passed over: the copy must save this request more than it spends.
// Once for each prefix, because the price gap is the holder's whole load
// of the moment, and the copy relieves it for good of one prefix's share
// at most; a hot prefix's holder draws that one prefix, and its copies
// follow the load as before. On the 60% sweep the requests decoding at
// holders of four groups (one to nine more than at the copier) priced
// them 0.4-4.5 s above engines of three or four, past one copy's prefill
// (0.2-0.5 s): applied once, the rule let seventeen copies by in a run,
// four in the warm-up, each a cold prefill that split a group for good,
// and a hit rate of 75% at 2 req/s against sglang-router's 93%. Once for
// each prefix: five copies, none in the first 96 s, and 93%. On mixed,
// whose answers run to 1,500 tokens, the warm-up copies this stops had
// evened out groups with long answers, whose decode load lasts (goodput
// 12.9 req/s at 40 against 13.5): one request's price cannot tell that
// load from a passing one (the bench's notes).
//
// A holder past that is saturated (a stated SLO is the operator's word
// for it), and a copier drawing two prefixes fewer than every such holder
// evens the pool out; both copy as before. Copies of a few blocks (at
// most copyFew of the prompt's) follow the load as before: they move
// little.
func placeCopies(cands []cand, j *job) {
	if j.most < j.blockTokens {
		return
	}
	// The holders that may keep a copier waiting: a prompt's deepest
	// holders are few, so each copier is checked against them alone, not
	// against the whole pool (a loop over the pool per copier cost
	// quadratic time in large pools).
	var near [16]int32
	holders := near[:0]
	for k := range cands {
		if cands[k].keepsCopiers(j) {
			if len(holders) == len(near) {
				holders = nil // more than near holds: check against the pool
				break
			}
			holders = append(holders, int32(k))
		}
	}
	for i := range cands {
		c := &cands[i]
		if !c.roomy || !c.bulk {
			continue
		}
		// The most a holder may draw and still keep c waiting.
		room := c.prefixes
		if room > 0 {
			room++
		}
		if holders != nil {
			for _, k := range holders {
				if cands[k].outwaits(c, room) {
					c.roomy = false
					break
				}
			}
			continue
		}
		for k := range cands {
			if h := &cands[k]; h.outwaits(c, room) && h.keepsCopiers(j) {
				c.roomy = false
				break
			}
		}
	}
}

// keepsCopiers reports whether h holds the most of the prompt any
// endpoint does (within a block), meets the request's SLOs and is not
// saturated by its decode load: a holder that may keep a copier waiting.
func (h *cand) keepsCopiers(j *job) bool {
	return h.eligible && h.cached >= j.most-j.blockTokens && h.meets(j, 0) && !h.saturated
}

// outwaits reports whether h, drawing no more than room prefixes, is
// priced within the copy's own prefill of copier c for each prefix it
// draws.
func (h *cand) outwaits(c *cand, room int) bool {
	return h.prefixes <= room && h.price <= c.price+c.copying*float64(max(h.prefixes, 1))
}
