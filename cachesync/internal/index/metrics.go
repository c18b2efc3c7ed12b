package index

import "github.com/prometheus/client_golang/prometheus"

const namespace = "kvroute_cachesync"

// metrics are the index's Prometheus metrics. Counters and the build-time
// histogram are updated as things happen; gauges are read from the latest
// Stats when scraped.
type metrics struct {
	x         *Index
	buildTime prometheus.Histogram
	records   *prometheus.CounterVec
	hashes    prometheus.Counter
	added     prometheus.Counter
	evicted   prometheus.Counter
	ops       prometheus.Counter
	stale     prometheus.Counter
	pending   *prometheus.CounterVec

	generation, entries, approxEntries, size, endpoints, queued, decisions *prometheus.Desc
}

func newMetrics(x *Index) *metrics {
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Name: name, Help: help})
	}
	desc := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(namespace+"_"+name, help, labels, nil)
	}
	return &metrics{
		x: x,
		buildTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Name: "snapshot_build_seconds",
			Help:    "Time to encode a snapshot generation.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
		records: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "report_records_total",
			Help: "Report records by what became of them: applied to an approximate endpoint, ignored because the endpoint is unknown or precise, or an outcome (a first token's time) for the latency fit.",
		}, []string{"outcome"}),
		hashes:  counter("report_hashes_total", "Block hashes of applied routing-report records."),
		added:   counter("approx_added_total", "Hashes added to approximate endpoints' sets."),
		evicted: counter("approx_evicted_total", "Hashes evicted from approximate endpoints' sets to stay within capacity."),
		ops:     counter("precise_changes_total", "Block changes applied from precise endpoints' KV events."),
		stale:   counter("precise_stale_changes_total", "Block changes dropped because their endpoint had left precise mode or been removed."),
		pending: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "pending_blocks_total",
			Help: "Blocks routing reports said a precise endpoint was computing: added as pending, confirmed by its engine's events, or expired unconfirmed.",
		}, []string{"outcome"}),

		generation:    desc("snapshot_generation", "Generation of the latest snapshot."),
		entries:       desc("index_entries", "Block hashes in the latest snapshot's prefix index."),
		approxEntries: desc("approx_entries", "Hashes held by approximate endpoints' sets."),
		size:          desc("snapshot_bytes", "Size of the latest snapshot, all parts."),
		endpoints:     desc("endpoints", "Endpoints in the latest snapshot by mode.", "mode"),
		queued:        desc("report_queue_hashes", "Hashes of routing reports waiting for the builder loop."),
		decisions:     desc("decisions_total", "Routing decisions the gateways reported, by the filter's reason (unknown: gateways of the previous report format).", "reason"),
	}
}

func (m *metrics) register(r prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m.buildTime, m.records, m.hashes, m.added, m.evicted, m.ops, m.stale, m.pending, m} {
		if err := r.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// Describe implements prometheus.Collector for the gauges.
func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.generation, m.entries, m.approxEntries, m.size, m.endpoints, m.queued, m.decisions} {
		ch <- d
	}
}

// Collect implements prometheus.Collector for the gauges.
func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	st := m.x.Stats()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	gauge(m.generation, float64(st.Generation))
	gauge(m.entries, float64(st.Entries))
	gauge(m.approxEntries, float64(st.ApproxEntries))
	gauge(m.size, float64(st.Size))
	gauge(m.endpoints, float64(st.Precise), Precise.String())
	gauge(m.endpoints, float64(st.Endpoints-st.Precise), Approximate.String())
	m.x.rmu.Lock()
	q := m.x.rhashes
	m.x.rmu.Unlock()
	gauge(m.queued, float64(q))
	for reason, n := range m.x.Decisions() {
		ch <- prometheus.MustNewConstMetric(m.decisions, prometheus.CounterValue, float64(n), reason)
	}
}
