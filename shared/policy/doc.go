// Package policy chooses the endpoint for a request.
//
// Pick prices every eligible endpoint (healthy, serving the requested model
// or adapter) by the latency the request is predicted to see there, plus
// what it would cost the others, and takes the cheapest: a cached prefix is
// preferred exactly as long as the time it saves outweighs the load it
// meets. There is no affinity threshold to fall off: "sticky until
// saturated" is where the prices cross, and, in ModeAuto without SLOs,
// where an endpoint's batch decodes decodeSaturation times slower than
// another's (Decode saturation, below). Rendezvous is the fallback when
// there is no snapshot.
//
// # The price
//
// The prefix walk (snapshot.View.Prefix) gives the leading blocks an
// endpoint holds in any tier (B) and on the GPU (G); its cached tokens are
// (G + d·(B-G)) blocks' worth, d being Config.CPUDiscount (a CPU-tier hit
// still costs a transfer), at most the prompt. Its latency model
// (shared/predict: fitted by cachesync from what requests really took, or
// the default built from the endpoint's calibrated prefill rate) predicts
//
//	TTFT from the uncached tokens there, the uncached tokens ahead of the
//	     request (this gateway's in flight, which the snapshot lags, plus
//	     cachesync's estimate of the others'), the requests running and the
//	     requests waiting (the engine's as of its scrape, less what this
//	     gateway had there then, Local.AtLoad, plus this gateway's own as of
//	     now);
//	ITL  from the requests running, this one included, and the KV-cache usage.
//
// The price is TTFT + out·ITL in ModeAuto, out being the output tokens the
// request asks for (Config.DefaultOutputTokens if it does not say) up to
// 256: its predicted latency, so the decode load counts, and a pool's
// bottleneck, prefill or decode, weighs most on its own; but a long
// answer's decoding only as far as the load it sees now will last, until
// the next placements even it out.
// ModePrefill prices TTFT alone, ModeDecode out·ITL (TTFT breaking ties).
// To that is added what the request's work costs the requests sharing the
// endpoint (Config.OthersWeight): every step that prefills its uncached
// tokens or decodes one of its tokens is longer for each of them, so a
// request does not leave a warm endpoint for a slightly faster batch and
// stall a cold one with a full prefill. Where the request's uncached
// blocks and its output's do not fit in the KV cache the running requests
// left free at the scrape (less this gateway's prefill in flight there),
// the engine will preempt one of them and prefill it again: the overflow
// counts toward the others' cost as prefill of its own would. And the
// eviction price is added,
// Config.EvictionWeight times the prefill time of the cached blocks the
// request's new blocks would push out of the endpoint's cache: its new
// blocks times how full the cache is (the index's blocks over its
// capacity, both in the snapshot), and all of the overflow once it would be
// full; blocks another endpoint already holds count in full however empty
// the cache, since a copy spends the pool's room twice. A copy must also
// undercut the endpoints holding more of the prompt by a tenth of its
// price, the model's usual error, and at most by its copied blocks'
// prefill time: it draws its prefix's traffic from then on. So a warm
// endpoint keeps its prefix until queueing there costs clearly more than a
// cold prefill and a copy's room elsewhere; and a prefix hotter than one
// endpoint can serve spreads to a second endpoint, which then holds it too
// and keeps it warm.
//
// # Placement
//
// A prompt the pool holds none of starts a prefix that will bring its
// share of traffic to wherever it lands for as long as it stays cached, so
// it is placed by cache room first: only endpoints whose cache (pending
// prefills included) is within half the prompt of the emptiest qualify,
// among those whose predicted time to first token is within one cold
// prefill of the quickest, and the price picks among them. Prefixes then
// spread evenly over the caches whatever order they arrive in, not after
// the momentary idleness the next arrival reshuffles. A prompt the pool
// holds is a placement too when it goes elsewhere: the copy then draws a
// share of its prefix's traffic. So an endpoint drawing as many prefixes
// as a holder (the snapshot's count), or one fewer, may copy more than a
// few blocks only once that holder is priced past it by the copy's own
// prefill; one drawing two fewer, or none, as the price says.
//
// With an SLO (Config.SLOTTFT, Config.SLOTPOT, or per request) the choice
// is the best-cached endpoint predicted to meet it, the cheapest of those;
// if none is, the cheapest (Decision.MeetsSLO false, for shedding). A TPOT
// SLO is met where the batch the request joins is predicted within it, its
// prefill there included: every request decoding there waits it out. An
// endpoint holding less of the prompt than the best-cached must meet the
// SLOs with a tenth to spare, the model's usual error, or predictions a
// hair either side of an SLO would trade a holder for a dear copy.
// Prices within Config.TieTolerance tie, and ties are broken at random so
// that gateways sharing a snapshot spread simultaneous requests, among the
// tied endpoints holding the most of the prompt: a tie makes no copy.
//
// # Decode saturation
//
// In ModeAuto without SLOs, an endpoint whose batch, its queue and this
// request included, is predicted an ITL over 1.3 times the pool's lowest is
// saturated (while cachesync's planner is moving groups, only once that has
// lasted as long as the pool's quickest batch takes to turn over, so that a
// moved group's cold prefills release nothing): passed over while another
// endpoint may take the request, for prefixes it holds and for new ones,
// and, holding the prompt, it keeps no copier waiting. One request's price
// pays a copy's prefill now and sees none of the decoding the copy saves
// the prefix's later requests, so a holder whose prefixes' answers run long
// stays dear for good and keeps them.
// With an SLO stated, the SLO is the operator's word for saturation.
//
// # Moved groups
//
// cachesync's planner pins a prompt group (snapshot.GroupKey) to an
// endpoint to spread the pool's decoding: a group is placed by its first
// request, which cannot tell how long the group's answers run. A request
// of a pinned group goes to the pinned endpoint, cold or not, overriding
// the price, the copy rules and placement, unless the endpoint is
// ineligible, saturated, misses a stated SLO, or is predicted its first
// token more than two cold prefills of the whole prompt after the
// quickest endpoint's (follows).
//
// # Reasons
//
//   - affinity: the chosen endpoint holds (within a block) the most of the
//     prompt of any;
//   - saturated-release: a warmer endpoint was priced out by its load;
//   - least-load: no endpoint holds any of it: placed by load and room;
//   - moved: the prompt's group is pinned (snapshot.Manifest.Pinned) to an
//     endpoint holding less of it than another: cachesync's planner is
//     moving the group there to spread the pool's decoding;
//   - fallback: nothing is eligible, Endpoint is -1.
//
// # Defaults
//
//   - Mode auto: the whole predicted latency, whichever stage dominates.
//   - PrefillRate 15,928 tokens/s: llm-d's shipped figure, for endpoints
//     cachesync has not calibrated.
//   - CPUDiscount 0.8: a CPU-tier hit still pays a PCIe transfer, about a
//     fifth of recomputing at H100 prefill rates.
//   - OthersWeight 1: a second of another request's latency counts as much
//     as a second of this one's.
//   - EvictionWeight 1: an evicted block costs its prefill once, when it is
//     next needed.
//   - TieTolerance 5 ms: below what the model can tell apart, above float
//     noise.
//   - DefaultOutputTokens 256: a chat answer's length when max_tokens is
//     unset.
//   - BlockBytes 64, the filter's block size; cachesync's -bytes-per-token
//     (default 4) reaches the policy in the snapshot.
package policy
