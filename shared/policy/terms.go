package policy

import (
	"time"

	"github.com/kvroute/kvroute/shared/predict"
	"github.com/kvroute/kvroute/shared/snapshot"
)

// job is what a request brings to every candidate's price.
type job struct {
	prompt      float64 // tokens
	output      float64 // tokens it may generate
	blocks      int     // its hashed blocks
	blockTokens float64
	sloTTFT     float64 // seconds; 0 none
	sloTPOT     float64
	// most is the most of the prompt any eligible endpoint holds, in
	// tokens: known once every candidate is priced (mostCached).
	most float64
}

// slo reports whether the request is held to an SLO, stated in the
// configuration or by the request.
func (j *job) slo() bool { return j.sloTTFT > 0 || j.sloTPOT > 0 }

// mostCached returns the most of the prompt any eligible candidate holds.
func mostCached(cands []cand) float64 {
	most := 0.0
	for i := range cands {
		if c := &cands[i]; c.eligible {
			most = max(most, c.cached)
		}
	}
	return most
}

func (p *Picker) job(m *snapshot.Manifest, r *Request) job {
	j := job{blocks: max(len(r.Hashes), r.Blocks), blockTokens: float64(p.cfg.BlockBytes) / BytesPerToken(m)}
	j.prompt = float64(r.PromptTokens)
	if j.prompt <= 0 {
		j.prompt = float64(j.blocks) * j.blockTokens
	}
	j.output = float64(r.OutputTokens)
	if j.output <= 0 {
		j.output = float64(p.cfg.DefaultOutputTokens)
	}
	j.sloTTFT, j.sloTPOT = p.cfg.SLOTTFT.Seconds(), p.cfg.SLOTPOT.Seconds()
	if r.SLOTTFT > 0 {
		j.sloTTFT = r.SLOTTFT.Seconds()
	}
	if r.SLOTPOT > 0 {
		j.sloTPOT = r.SLOTPOT.Seconds()
	}
	return j
}

// cand is one eligible endpoint, priced.
type cand struct {
	eligible bool
	sel      bool    // selected for the choice at hand
	cached   float64 // tokens, CPU-tier blocks discounted
	uncached float64
	f        predict.Features
	ttft     float64 // seconds
	itl      float64
	others   float64 // seconds its work adds to the requests sharing the endpoint
	evict    float64 // seconds of future prefill its eviction costs
	margin   float64 // seconds a copy must undercut the holders by (copyRoom)
	copying  float64 // seconds its copied blocks take to prefill there; 0 when it copies none
	bulk     bool    // it copies more than a few blocks (copyFew of the prompt's)
	price    float64 // what the choice minimises, seconds
	prefill  float64 // seconds its own uncached tokens take to prefill there
	cold     float64 // seconds the whole prompt takes to prefill there
	fill     float64 // its cache's fill, pending prefills included; -1 unknown
	capacity float64 // its cache's blocks
	prefixes int     // the prefixes its cache draws traffic with, pending ones included
	roomy    bool    // passed placeNew's and placeCopies' tests
	// loaded is the ITL its batch is predicted once its queue is in it
	// and this request too; saturated, that it is past decodeSaturation
	// times the pool's lowest (saturateDecode).
	loaded    float64
	saturated bool
	// slots and slotsHeld: an engine whose cache is a prompt per slot
	// (snapshot.EngineSlot), how many it has and how many hold a prompt;
	// slots 0 for any other.
	slots, slotsHeld int
}

// price fills in c for endpoint e, whose prefix match is mt and on which
// this gateway has local in flight; pool is the deepest match of any other
// eligible endpoint.
//
// The prediction's terms: the request's uncached tokens there; the backlog
// of uncached tokens ahead of it (this gateway's own, which the snapshot
// lags, plus what cachesync estimates for the others); the requests in its
// batch (the engine's count, or this gateway's if that is higher: the
// snapshot may not have seen them yet) and in its queue. Then:
//
//	price = TTFT + min(out, decodeHorizon)·ITL (auto) | TTFT (prefill) | out·ITL + TTFT/out (decode)
//	        + OthersWeight · others + EvictionWeight · eviction + copy margin
//
// others is what the request's own work costs the requests that share the
// endpoint with it: every step that prefills its uncached tokens, and every
// step it decodes in, is longer for each request running or queued there.
// Its own latency alone would be a selfish price: a request would leave a
// warm endpoint for a cold one to save a few milliseconds per token, and
// pay for it with a full prefill that stalls every batch it lands in.
// eviction prices the cached blocks the request's new blocks would push
// out: their prefill time times how full the endpoint's cache is, and all
// of it once the cache would overflow; blocks another endpoint already
// holds count in full, empty cache or not, so a prefix is copied only when
// the queue at its holder costs more than a cold prefill plus the room,
// and by more than the copy margin (copyRoom). A cache of a prompt per
// slot (llama.cpp's) is full when every slot holds a prompt, however few
// of its tokens they fill.
//
// others also counts the recompute of what the engine preempts when the
// request's blocks do not fit beside the running requests' (preempted).
func (p *Picker) price(c *cand, e snapshot.Endpoint, mt snapshot.Match, pool int32, local Local, stale bool, j *job) {
	cfg := &p.cfg
	eff := float64(mt.GPU) + cfg.CPUDiscount*float64(mt.Blocks-mt.GPU)
	c.cached = min(j.prompt, eff*j.blockTokens)
	c.uncached = j.prompt - c.cached

	c.f = predict.Features{Uncached: c.uncached, Backlog: float64(local.PrefillTokens), Running: float64(local.Requests)}
	if !stale {
		c.f.Backlog += float64(e.PrefillTokens())
		running, waiting := float64(e.Running()), float64(e.Waiting())
		if local.AtLoadKnown {
			// The engine's figures are as of its scrape and count this
			// gateway's requests of then; its own it knows as of now.
			// The others' and its own together run as the engine ran them
			// then: a batch that had a queue behind it was full.
			total := max(running+waiting-float64(local.AtLoad), 0) + float64(local.Requests)
			c.f.Running, c.f.Waiting = total, 0
			if waiting > 0 {
				c.f.Running, c.f.Waiting = min(total, running), max(total-running, 0)
			}
		} else {
			c.f.Running = max(c.f.Running, running)
			c.f.Waiting = waiting
		}
	}
	rate := e.PrefillRate()
	if rate <= 0 {
		rate = cfg.PrefillRate
	}
	fallback := predict.Default(rate)
	mdl := e.LatencyModel().Resolve(&fallback)
	c.f.Wait = stepLeft(local, c.f.Running, c.f.Waiting, mdl.ITL(c.f.Running))
	c.ttft = mdl.TTFT(c.f)
	c.itl = mdl.ITL(c.f.Running + 1)
	share := c.f.Running + c.f.Waiting
	c.loaded = mdl.ITL(share + 1)
	prefillCost, decodeCost := c.uncached*mdl.PerUncachedToken()*share, j.output*mdl.PerRunning()*share

	// Tokens the engine must prefill again because this request's blocks
	// did not fit beside the running requests': it preempts its newest
	// request and recomputes it later, a prefill that stalls every batch
	// it lands in, as the request's own does.
	recompute := 0.0
	if !stale {
		recompute = c.preempted(e, local, j) * mdl.PerUncachedToken() * share
	}

	c.prefill = c.uncached * mdl.PerUncachedToken()
	c.cold = j.prompt * mdl.PerUncachedToken()
	c.prefixes = e.Prefixes() + local.PendingPrefixes
	added := float64(j.blocks - int(mt.Blocks))
	// A block another endpoint already holds is a copy.
	copied := min(added, float64(max(pool-mt.Blocks, 0)))
	c.fill = -1
	if capacity := float64(e.IndexCapacity()); capacity > 0 {
		c.capacity = capacity
		// The index's blocks, and those of the prompts this gateway
		// placed since the snapshot was built. Not the backlog: a prompt
		// in flight shows in the index once its routing report is in
		// (cachesync's pending blocks), long before its first token, and
		// counted twice meanwhile, it made one endpoint look a group
		// fuller than another for half a second in every warm-up.
		held := float64(e.IndexBlocks())
		c.fill = (held + float64(local.Pending)) / capacity
		// Each new block evicts with the odds of a full cache, and surely
		// once the cache overflows; never more than the blocks it adds.
		// A copy spends the pool's room twice, so its blocks evict
		// surely, however empty the caches are now.
		full := min(held/capacity, 1)
		if c.slots > 0 {
			// A cache of a prompt per slot is full when every slot holds
			// one, however short: a new prompt then takes a whole slot.
			full = 0
			if c.slotsHeld+local.PendingPrefixes >= c.slots {
				full = 1
			}
		}
		fresh := added - copied
		evicted := copied + min(fresh, max(fresh*full, held+added-capacity-copied))
		c.evict = evicted * j.blockTokens / rate
	}

	switch cfg.Mode {
	case ModePrefill:
		c.price, c.others = c.ttft, prefillCost
	case ModeDecode:
		c.price, c.others = j.output*c.itl+c.ttft/j.output, decodeCost
	default:
		// The decode load an endpoint shows now lasts only until the
		// next placements even it out, so a long answer is priced for
		// its first decodeHorizon tokens: priced whole, 1,500 tokens of
		// a few milliseconds' ITL difference outweighed a cached prefix.
		out := min(j.output, decodeHorizon)
		c.price, c.others = c.ttft+out*c.itl, prefillCost+out*mdl.PerRunning()*share
	}
	c.others += recompute
	c.price += cfg.OthersWeight*c.others + cfg.EvictionWeight*c.evict
	if copied > 0 {
		c.copying = copied * j.blockTokens * mdl.PerUncachedToken()
		c.bulk = copied > copyFew*float64(j.blocks)
		c.margin = min(copyRoom*c.price, c.copying)
		c.price += c.margin
	}
}

// copyRoom is the share of its price by which a copy must undercut the
// endpoints holding more of the prompt: about the latency model's median
// error at steady load, as sloRoom. A copy outlasts the moment that priced
// it: it draws its prefix's traffic from then on. In b2b-saas warm-ups a
// holder prefilling another group's first request priced 6-8% above an
// idle engine, which took a copy; in one run the sixteenth group then went
// to the holder (five groups' traffic on one engine, three on another,
// knee 56 req/s against 72), in another the copied group's traffic split
// for good (engines 10% apart, TTFT p99 5 s at 64 req/s against 0.3 s).
// The price of it: on mixed, whose warm-up copies balance groups with
// heavy-tailed answers, a few percent of goodput. The margin is never more
// than the copied blocks' prefill, so a copy of a few blocks (a short
// system prompt) still follows the load.
const copyRoom = sloRoom

// copyFew is the share of a prompt's blocks up to which a copy is of a few
// blocks: a short system prompt, whose copy spends little room and moves
// little traffic, and follows the load (placeCopies). It is a share of
// the prompt, not of the price: judged by whether the copy margin's cap
// bound (the copy's prefill under a tenth of the price), as it was until
// 2026-12-04, nearly every copy was of a few blocks under auto's price,
// whose decode terms put a tenth of it above the prefill of a 4,300-token
// system prompt: all ten copies of a 60% sweep run passed as a few.
const copyFew = 0.1

// decodeHorizon is how many of a request's output tokens ModeAuto prices
// the decoding of: about one chat answer (DefaultOutputTokens' default),
// the time over which the running requests turn over and the decode
// load the snapshot shows no longer holds.
const decodeHorizon = 256

// preempted estimates the tokens request j would push out of the blocks
// held by the requests running on e: the KV cache the engine reported in
// use at its scrape, and the prefill this gateway still has in flight
// there (ahead of j in the queue; the scrape may count some of it already,
// which errs toward less room), leave too little for j's uncached blocks
// and the blocks its output will take. Unknown
// usage or capacity, and room enough, cost nothing. A warm endpoint's
// cache hits are blocks the running requests may share; this counts them
// as free, which only an engine whose prefix sits in no running request
// gets wrong, and then by the prefix alone.
func (c *cand) preempted(e snapshot.Endpoint, local Local, j *job) float64 {
	usage, capacity := e.KVCacheUsage(), float64(e.IndexCapacity())
	if !(usage > 0) || capacity <= 0 {
		return 0
	}
	free := (1-min(usage, 1))*capacity*j.blockTokens - float64(local.PrefillTokens)
	need := c.uncached + j.output
	return min(max(need-free, 0), need)
}

// meets reports whether the request is predicted within its SLOs at c,
// with room to spare (a share of each) unless c holds the most of the
// prompt any endpoint holds (within a block). The time per
// output token is that of the batch it joins, whose steps carry its
// prefill: spread over the decodeHorizon tokens in which the batch turns
// over, the stall is what every request decoding there pays per token.
// Judged by its own ITL alone, a request left a holder predicted just
// over a 50 ms SLO for a cold endpoint just under it, and its 6,000-token
// prefill pushed the ninety requests decoding there over.
func (c *cand) meets(j *job, room float64) bool {
	within := 1.0
	if c.cached < j.most-j.blockTokens {
		within -= room
	}
	return (j.sloTTFT == 0 || c.ttft <= within*j.sloTTFT) &&
		(j.sloTPOT == 0 || c.itl+c.prefill/decodeHorizon <= within*j.sloTPOT)
}

func (c *cand) terms(slot int) Terms {
	return Terms{
		Endpoint: slot, CachedTokens: int(c.cached), UncachedTokens: int(c.uncached + 0.5),
		Backlog: int(c.f.Backlog), Running: int(c.f.Running), Waiting: int(c.f.Waiting), Wait: seconds(c.f.Wait),
		TTFT: seconds(c.ttft), ITL: seconds(c.itl), Others: seconds(c.others), Eviction: seconds(c.evict), CopyMargin: seconds(c.margin), Price: seconds(c.price),
		Prefixes: c.prefixes, FillPercent: fillPercent(c.fill), DecodeSaturated: c.saturated,
	}
}

func fillPercent(fill float64) int {
	if fill < 0 {
		return -1
	}
	return int(fill*100 + 0.5)
}

func seconds(s float64) time.Duration { return time.Duration(min(s, 1e9) * float64(time.Second)) }

// stepLeft is what the engine must run before it starts a step the request
// joins: what the step under way has left, known to a few milliseconds from
// the gateway's own streams while it streams from the engine, and the whole
// next step too when less is left than the request needs to reach the
// engine's scheduler (the learned lead). Otherwise half a predicted step,
// the average over arrivals, when the engine is busy, and nothing when it
// is idle. A step that has already run past the length of the last one (it
// holds a prefill) is taken to end now, which no request can make.
func stepLeft(local Local, running, waiting, itl float64) float64 {
	if local.StepLength > 0 {
		left := max(local.StepLength-local.StepAge, 0)
		if left < local.StepLead {
			left += local.StepLength
		}
		return left
	}
	if running+waiting == 0 {
		return 0
	}
	return itl / 2
}
