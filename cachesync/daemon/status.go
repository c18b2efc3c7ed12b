package daemon

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/cachesync/internal/service"
	"github.com/kvroute/kvroute/shared/snapshot"
)

var (
	descEngineHealth  = prometheus.NewDesc(ns+"engine_health", "1 for each engine's health as the scraper sees it.", []string{"engine", "health"}, nil)
	descEnginePrecise = prometheus.NewDesc(ns+"engine_precise", "1 if an engine is indexed from its KV events, 0 if from routing reports (approximate).", []string{"engine"}, nil)
	descEngineReqs    = prometheus.NewDesc(ns+"engine_requests", "An engine's requests by state, as last scraped.", []string{"engine", "state"}, nil)
	descEngineKV      = prometheus.NewDesc(ns+"engine_kv_cache_usage_ratio", "An engine's KV-cache usage, as last scraped.", []string{"engine"}, nil)
	descEngineIndex   = prometheus.NewDesc(ns+"engine_index_blocks", "An engine's entries in the latest snapshot's index.", []string{"engine"}, nil)
	descEngineDemand  = prometheus.NewDesc(ns+"engine_decode_demand_tokens_per_second", "Output tokens per second that the requests gateways routed to an engine asked for (max_tokens; 256 when unstated), decayed over 30 s: how evenly the pool's decoding is spread, whichever groups share an engine.", []string{"engine"}, nil)
	descEnginePrefix  = prometheus.NewDesc(ns+"engine_prefixes", "The distinct prompt prefixes an engine's index entries hold that gateways routed there in the last minute, each weighed by the engine's share of its traffic, in the latest snapshot: what new prefixes are placed by.", []string{"engine"}, nil)
)

// engineStatus returns the engines' rows for the status page and the
// per-engine metrics, which read nothing else.
func (d *Daemon) engineStatus() []service.EngineStatus {
	blocks, prefixes := map[string]int{}, map[string]int{}
	if im := d.ix.Image(); im != nil {
		if m, err := im.Manifest(); err == nil {
			for i := range m.NumEndpoints() {
				if e := m.Endpoint(i); !e.Vacant() {
					blocks[e.Addr()], prefixes[e.Addr()] = e.IndexBlocks(), e.Prefixes()
				}
			}
		}
	}
	now := time.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]service.EngineStatus, 0, len(d.engines))
	for addr, e := range d.engines {
		st := e.last
		row := service.EngineStatus{
			Addr: addr, Name: e.d.Name, Kind: st.Kind.String(), Health: healthNames[snapshot.HealthUnknown],
			Precise: e.precise, Template: templateName(e.template.renders, e.template.custom), Agreement: "unchecked",
			IndexBlocks: blocks[addr], Prefixes: prefixes[addr], DecodeDemand: d.demand.Endpoint(addr, now),
		}
		if e.scraped {
			row.Health = healthNames[st.Health]
			row.Running, row.Waiting, row.KVUsage = st.Running, st.Waiting, st.KVCacheUsage
			row.Rate, row.Calibrated = st.Rate.TokensPerSecond, st.Rate.Calibrated
			if r, ok := d.peerRate(e); ok {
				row.Rate = r
			}
		}
		switch tc := &e.template; {
		case !d.checkable(e):
			row.Agreement = "not checkable"
		case tc.unseen != "":
			row.Agreement = "cannot be checked: " + tc.unseen
		case tc.mismatch || tc.disagrees():
			row.Agreement = "disagrees"
			for _, a := range tc.agree {
				if !a.Agrees() && a.Probe != "" {
					row.Agreement = "disagrees with " + a.Template.String() + " at byte " + strconv.Itoa(a.Common) + " of probe " + a.Probe
					break
				}
			}
		case tc.agrees():
			row.Agreement = "agrees"
		}
		out = append(out, row)
	}
	return out
}

// collectEngines sends the per-engine metrics.
func collectEngines(ch chan<- prometheus.Metric, rows []service.EngineStatus) {
	gauge := func(desc *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, v, labels...)
	}
	for _, r := range rows {
		gauge(descEngineHealth, 1, r.Addr, r.Health)
		precise := 0.0
		if r.Precise {
			precise = 1
		}
		gauge(descEnginePrecise, precise, r.Addr)
		gauge(descEngineReqs, float64(r.Running), r.Addr, "running")
		gauge(descEngineReqs, float64(r.Waiting), r.Addr, "waiting")
		gauge(descEngineKV, r.KVUsage, r.Addr)
		gauge(descEngineIndex, float64(r.IndexBlocks), r.Addr)
		gauge(descEnginePrefix, float64(r.Prefixes), r.Addr)
		gauge(descEngineDemand, r.DecodeDemand, r.Addr)
	}
}
