// Package policy chooses the endpoint for a request.
//
// Pick implements "sticky until saturated" over a snapshot: prefer the
// endpoint holding the longest cached prefix of the prompt while its load
// stays within bounds; past them, release affinity and balance by load.
// Rendezvous is the fallback when there is no snapshot.
//
// # The rules
//
// An endpoint is eligible if its snapshot row is healthy and it serves the
// requested model or adapter. For each, the prefix walk
// (snapshot.View.Prefix) gives the leading blocks it holds in any tier (B)
// and on the GPU (G). Its effective cached blocks are G + d*(B-G), d being
// Config.CPUDiscount (a CPU-tier hit still costs a transfer), and its
// cached tokens are that times the tokens of a block (Config.BlockBytes over
// the snapshot's bytes per token), at most the prompt.
//
// Load is token-aware. In ModePrefill an endpoint's estimated time to first
// token is
//
//	TTFT = (in-flight uncached prefill tokens + this request's uncached tokens) / prefill rate
//
// where the in-flight tokens are the snapshot's figure plus this gateway's
// own (Request.Local), and the rate is the endpoint's calibrated throughput
// from the snapshot or Config.PrefillRate. In ModeDecode the load is active
// requests (the snapshot's running plus waiting, plus Local.Requests, plus
// this one) against the endpoint's cap: its SignalRequests threshold or
// Config.DecodeCap.
//
// An endpoint is warm if its cached tokens are at least
// Config.AffinityThreshold of the prompt. The warm endpoints within one
// block of the longest match are affine. An affine endpoint is saturated
// if, in prefill mode, its TTFT exceeds the best cold (not warm) endpoint's
// by more than Config.MaxTTFTPenalty, or exceeds Config.MaxTTFT, or its
// in-flight tokens exceed its calibrated SignalPrefillTokens threshold; in
// decode mode, if its active requests exceed its cap. Then:
//
//   - affinity: the affine, unsaturated endpoint with the least load;
//   - saturated-release: every affine endpoint is saturated; the endpoint with
//     the least load among the rest that are within the absolute limits
//     (MaxTTFT and the calibrated threshold, or the decode cap);
//   - least-load: no endpoint is warm; the same choice;
//   - fallback: nothing is within the absolute limits; the least loaded
//     eligible endpoint. With nothing eligible Endpoint is -1.
//
// "Least load" is least estimated TTFT in prefill mode, so a partly warm
// endpoint still gains from its cache; it is the least active/cap fraction
// in decode mode.
//
// # Hysteresis
//
// A Picker remembers, per endpoint slot, whether that endpoint was
// saturated when last judged. A saturated endpoint counts as unsaturated
// again only when it is below every limit scaled by 1 - Config.Hysteresis
// (by default the penalty must fall from 18 s to 16.2 s, a decode cap of
// 256 to 230.4). Without it, an endpoint at the edge flips between affinity
// and release on every request, and each flip to it sends a burst of cache
// hits that pushes it back over. The state follows the endpoint, not the
// slot: it is reset when the slot's snapshot.Endpoint.Since changes.
//
// # Ties
//
// Among candidates whose load is within Config.TieTolerance (prefill) or
// Config.TieRequests requests (decode) of the best, Pick chooses uniformly
// at random using Request.Random. Many gateways see the same snapshot; if
// each took the strict minimum they would all send the next burst to the
// same endpoint. The caller supplies the randomness, so tests are
// deterministic and the Wasm filter needs no crypto/rand.
//
// # Stale snapshots
//
// If the snapshot is older than the caller's max staleness, it sets
// Request.Stale: the snapshot's load figures are ignored and only the
// gateway's own counts are used; the prefix index and health still are,
// since caches and health change more slowly than queues.
//
// # Local load
//
// Request.Local is a slice indexed like the snapshot's endpoint table.
// Indexing costs nothing per endpoint on the request path, where a map by
// address would hash every address on every request. Slots are stable: an
// endpoint keeps its slot for as long as it is listed, and a slot that
// changes hands gets a new snapshot.Endpoint.Since, so the filter remaps its
// counters (which it keeps by address in shared data) only when Since moves.
//
// # Defaults
//
//   - AffinityThreshold 0.8: llm-d's prefix-cache-affinity-filter, chosen
//     from the bimodal distribution of prefix hit ratios llm-d observed in
//     production.
//   - MaxTTFTPenalty 18 s and PrefillRate 15928 tok/s: llm-d's shipped
//     maxTTFTPenaltyMs and peakPrefillThroughput (their product, 287k
//     tokens, is the saturation threshold the sticky-until-saturated blog
//     calibrated for Qwen3-32B on H100). Calibrate per model and
//     accelerator and publish the rate in the snapshot.
//   - MaxTTFT 60 s: a backstop for when every endpoint is loaded; the
//     relative penalty decides in normal operation.
//   - DecodeCap 256: vLLM's long-standing default max_num_seqs.
//   - CPUDiscount 0.8: llm-d-kv-cache's weight for CPU-tier hits.
//   - Hysteresis 0.1, TieTolerance 25 ms (about 400 tokens of prefill at
//     the default rate), TieRequests 1.
//   - BlockBytes 64, the filter's block size; cachesync's -bytes-per-token
//     (default 4) reaches the policy in the snapshot.
package policy
