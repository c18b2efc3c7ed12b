package daemon

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/cachesync/internal/bridge"
	"github.com/kvroute/kvroute/cachesync/internal/discovery"
	"github.com/kvroute/kvroute/cachesync/internal/kvevents"
	"github.com/kvroute/kvroute/cachesync/internal/scrape"
	"github.com/kvroute/kvroute/cachesync/internal/verify"
	"github.com/kvroute/kvroute/shared/report"
	"github.com/kvroute/kvroute/shared/snapshot"
)

func reportLimits(c Config) report.Limits { return report.Limits{MaxHashes: c.Hash.MaxBlocks} }

// engineStats sums the event subscribers' and bridges' statistics.
type engineStats struct {
	sub kvevents.Stats
	br  bridge.Stats
}

func (s *engineStats) add(o engineStats) {
	a, b := &s.sub, &o.sub
	a.Batches += b.Batches
	a.Stored += b.Stored
	a.Removed += b.Removed
	a.Cleared += b.Cleared
	a.UnknownEvents += b.UnknownEvents
	a.Gaps += b.Gaps
	a.Replays += b.Replays
	a.ReplayFailures += b.ReplayFailures
	a.Replayed += b.Replayed
	a.Duplicates += b.Duplicates
	a.DecodeErrors += b.DecodeErrors
	a.Connects += b.Connects
	for i := range a.Resets {
		a.Resets[i] += b.Resets[i]
	}
	c, e := &s.br, &o.br
	c.Stored += e.Stored
	c.Removed += e.Removed
	c.Evicted += e.Evicted
	c.Clears += e.Clears
	for i := range c.Skipped {
		c.Skipped[i] += e.Skipped[i]
	}
	c.Blocks += e.Blocks
	c.TextBlocks += e.TextBlocks
	c.Bytes += e.Bytes
}

func (e *engine) stats() engineStats {
	var s engineStats
	for _, sub := range e.subs {
		s.add(engineStats{sub: sub.Stats()})
	}
	for _, br := range e.bridges {
		s.add(engineStats{br: br.Stats()})
	}
	return s
}

const ns = "kvroute_cachesync_"

var (
	descEvents         = prometheus.NewDesc(ns+"kv_events_total", "KV-cache events applied, by type.", []string{"type"}, nil)
	descBatches        = prometheus.NewDesc(ns+"kv_event_batches_total", "KV-event batches applied.", nil, nil)
	descGaps           = prometheus.NewDesc(ns+"kv_event_gaps_total", "Sequence gaps noticed in engines' event streams.", nil, nil)
	descReplays        = prometheus.NewDesc(ns+"kv_event_replays_total", "Replay requests sent to engines.", nil, nil)
	descReplayFailures = prometheus.NewDesc(ns+"kv_event_replay_failures_total", "Replays that failed.", nil, nil)
	descReplayed       = prometheus.NewDesc(ns+"kv_event_replayed_batches_total", "Batches applied from replays.", nil, nil)
	descDecodeErrors   = prometheus.NewDesc(ns+"kv_event_decode_errors_total", "Event messages that did not decode.", nil, nil)
	descUnrouted       = prometheus.NewDesc(ns+"kv_event_unrouted_total", "Event messages a bound events socket (-events-listen) dropped because their topic named no engine on it: an engine not discovered yet, or a topic that is not kv@<its ip>@<model>.", nil, nil)
	descQueueDrops     = prometheus.NewDesc(ns+"kv_event_queue_drops_total", "Event messages a bound events socket dropped because their engine's queue was full; replay refills them.", nil, nil)
	descResets         = prometheus.NewDesc(ns+"kv_event_resets_total", "Engine index resets, by reason.", []string{"reason"}, nil)
	descSkipped        = prometheus.NewDesc(ns+"bridge_skipped_blocks_total", "Engine blocks not indexed, by reason.", []string{"reason"}, nil)
	descEvicted        = prometheus.NewDesc(ns+"bridge_evicted_blocks_total", "Engine blocks dropped for the bridge's capacity cap.", nil, nil)
	descBlocks         = prometheus.NewDesc(ns+"bridge_engine_blocks", "Engine blocks the bridges track.", nil, nil)
	descTextBlocks     = prometheus.NewDesc(ns+"bridge_text_blocks", "Text blocks the engines hold, summed over engines.", nil, nil)
	descBridgeBytes    = prometheus.NewDesc(ns+"bridge_state_bytes", "Memory of the bridges' state.", nil, nil)
	descEngines        = prometheus.NewDesc(ns+"engines", "Engines discovered, by index mode.", []string{"mode"}, nil)
	descHealth         = prometheus.NewDesc(ns+"engines_by_health", "Engines by health as the scraper sees them.", []string{"health"}, nil)
	descScrapes        = prometheus.NewDesc(ns+"scrapes_total", "Metric scrapes of engines, failed ones included.", nil, nil)
	descScrapeFailures = prometheus.NewDesc(ns+"scrape_failures_total", "Metric scrapes of engines that failed.", nil, nil)
	descScrapeSeconds  = prometheus.NewDesc(ns+"scrape_seconds_total", "Time spent scraping engines.", nil, nil)
	descAgreement      = prometheus.NewDesc(ns+"template_agreement", "Share of the probe conversations an engine renders byte for byte as the gateways' chat template does (1: agrees).", []string{"engine", "template"}, nil)
	descCommonPrefix   = prometheus.NewDesc(ns+"template_common_prefix_bytes", "Bytes an engine's render of its first differing probe shares with the gateways' template's; absent when they agree.", []string{"engine", "template"}, nil)
	descTemplates      = prometheus.NewDesc(ns+"engines_by_template", "Engines whose chat template is checked (those with KV events, and llama.cpp) by the check: agrees, disagrees (an engine with KV events is then indexed approximately), unchecked.", []string{"state"}, nil)
	descPrefillRate    = prometheus.NewDesc(ns+"engine_prefill_rate_tokens_per_second", "Prefill rate published for each engine: calibrated from its metrics; until then its deployment's calibrated engines' median, else the configured default.", []string{"engine", "kind"}, nil)
	descSlowdown       = prometheus.NewDesc(ns+"engine_slowdown_ratio", "How much slower than the other engines of its deployment an engine decodes, beyond the noise (pace.Band); 1 when not slower. The engine's ITL model is scaled by it.", []string{"engine"}, nil)
	descCalibrated     = prometheus.NewDesc(ns+"engine_prefill_rate_calibrated", "1 once an engine's prefill rate is calibrated from its own metrics, 0 while the default stands.", []string{"engine"}, nil)
	descBytesPerToken  = prometheus.NewDesc(ns+"bytes_per_token", "Text bytes per token each model's approximate indexes are sized by: learned from the gateways' reports and the engines' prompt-token counters (source learned), or -bytes-per-token (configured).", []string{"model", "source"}, nil)
	descDiscovery      = prometheus.NewDesc(ns+"discovery_updates_total", "Engine sets discovery sent.", nil, nil)
	descDiscoveryErrs  = prometheus.NewDesc(ns+"discovery_errors_total", "Discovery lookups that failed (the last set stands).", nil, nil)
)

var healthNames = map[snapshot.Health]string{
	snapshot.HealthUnknown: "unknown", snapshot.HealthHealthy: "healthy",
	snapshot.HealthDraining: "draining", snapshot.HealthUnhealthy: "unhealthy",
}

// collector reads the components' statistics when Prometheus scrapes.
type collector struct{ d *Daemon }

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descEvents, descBatches, descGaps, descReplays, descReplayFailures, descReplayed,
		descDecodeErrors, descUnrouted, descQueueDrops, descResets, descSkipped, descEvicted, descBlocks, descTextBlocks, descBridgeBytes, descEngines,
		descHealth, descScrapes, descScrapeFailures, descScrapeSeconds, descAgreement, descCommonPrefix, descTemplates, descDiscovery, descDiscoveryErrs,
		descPrefillRate, descSlowdown, descCalibrated, descBytesPerToken, descEngineHealth, descEnginePrecise, descEngineReqs, descEngineKV, descEngineIndex, descEnginePrefix, descEngineDemand, descMoves} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	d := c.d
	collectEngines(ch, d.engineStatus())
	d.mu.Lock()
	total := d.gone
	total.br.Blocks, total.br.TextBlocks, total.br.Bytes = 0, 0, 0 // gauges count live engines only
	precise := 0
	var states [3]int // agrees, disagrees, unchecked
	type agreement struct {
		engine string
		a      verify.Agreement
	}
	var agree []agreement
	var rates []scrape.State
	for addr, e := range d.engines {
		total.add(e.stats())
		if e.scraped {
			st := e.last
			if r, ok := d.peerRate(e); ok {
				st.Rate.TokensPerSecond = r // what the snapshot publishes
			}
			rates = append(rates, st)
		}
		if e.precise {
			precise++
		}
		if !d.checkable(e) {
			continue
		}
		switch tc := &e.template; {
		case tc.mismatch:
			states[1]++
		case tc.agrees():
			states[0]++
		default:
			states[2]++
		}
		for _, a := range e.template.agree {
			agree = append(agree, agreement{addr, a})
		}
	}
	var bound kvevents.ListenerStats
	for _, l := range d.listeners {
		st := l.Stats()
		bound.Unrouted += st.Unrouted
		bound.Dropped += st.Dropped
	}
	engines := len(d.engines)
	moves := d.moves
	scraper := d.scraper
	d.mu.Unlock()

	counter := func(desc *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(desc *prometheus.Desc, v int, labels ...string) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, float64(v), labels...)
	}
	s := total.sub
	counter(descEvents, s.Stored, "BlockStored")
	counter(descEvents, s.Removed, "BlockRemoved")
	counter(descEvents, s.Cleared, "AllBlocksCleared")
	counter(descEvents, s.UnknownEvents, "unknown")
	counter(descMoves, moves)
	counter(descBatches, s.Batches)
	counter(descGaps, s.Gaps)
	counter(descReplays, s.Replays)
	counter(descReplayFailures, s.ReplayFailures)
	counter(descReplayed, s.Replayed)
	counter(descDecodeErrors, s.DecodeErrors)
	counter(descUnrouted, bound.Unrouted)
	counter(descQueueDrops, bound.Dropped)
	for r, n := range s.Resets {
		counter(descResets, n, kvevents.Reason(r).String())
	}
	b := total.br
	for r, n := range b.Skipped {
		counter(descSkipped, n, bridge.Skip(r).String())
	}
	counter(descEvicted, b.Evicted)
	gauge(descBlocks, b.Blocks)
	gauge(descTextBlocks, b.TextBlocks)
	gauge(descBridgeBytes, b.Bytes)
	gauge(descEngines, precise, "precise")
	gauge(descEngines, engines-precise, "approximate")
	for i, state := range []string{"agrees", "disagrees", "unchecked"} {
		gauge(descTemplates, states[i], state)
	}
	for _, g := range agree {
		share := 0.0
		if g.a.Compared > 0 {
			share = float64(g.a.Exact) / float64(g.a.Compared)
		}
		ch <- prometheus.MustNewConstMetric(descAgreement, prometheus.GaugeValue, share, g.engine, g.a.Template.String())
		if !g.a.Agrees() && g.a.Probe != "" {
			gauge(descCommonPrefix, g.a.Common, g.engine, g.a.Template.String())
		}
	}
	for _, st := range rates {
		ch <- prometheus.MustNewConstMetric(descPrefillRate, prometheus.GaugeValue, st.Rate.TokensPerSecond, st.Addr, st.Kind.String())
		calibrated := 0
		if st.Rate.Calibrated {
			calibrated = 1
		}
		gauge(descCalibrated, calibrated, st.Addr)
		ch <- prometheus.MustNewConstMetric(descSlowdown, prometheus.GaugeValue, d.models.slowdown(st.Addr), st.Addr)
	}
	seen := map[string]bool{}
	for _, st := range rates {
		if len(st.Models) == 0 || seen[st.Models[0]] {
			continue
		}
		seen[st.Models[0]] = true
		v, learned := d.tokenRatio(st.Models[0])
		source := "configured"
		if learned {
			source = "learned"
		}
		ch <- prometheus.MustNewConstMetric(descBytesPerToken, prometheus.GaugeValue, v, st.Models[0], source)
	}
	if scraper != nil {
		st := scraper.Stats()
		counter(descScrapes, st.Scrapes)
		counter(descScrapeFailures, st.Failures)
		ch <- prometheus.MustNewConstMetric(descScrapeSeconds, prometheus.CounterValue, st.ScrapeSeconds)
		for h, name := range healthNames {
			gauge(descHealth, st.Engines[h], name)
		}
	}
	if c, ok := d.source.(interface{ Counters() discovery.Counters }); ok {
		dc := c.Counters()
		counter(descDiscovery, dc.Updates)
		counter(descDiscoveryErrs, dc.Errors)
	}
}
