package main

import (
	"github.com/kvroute/kvroute/filter/proxywasm"
	"github.com/kvroute/kvroute/shared/policy"
)

// stats are the filter's Envoy stats (shown as wasmcustom.kvroute.*).
// Envoy sums counters and gauge additions over the worker VMs; gauges that
// every VM sets (generation, age) show the last writer's value.
type stats struct {
	outcomes     [numOutcomes]proxywasm.MetricCounter
	reasons      [numReasons]proxywasm.MetricCounter
	prefixBlocks proxywasm.MetricHistogram
	// inflight counts the routed requests whose streams have not ended,
	// summed over the VMs: back at 0 when nothing is in flight, or the
	// in-flight load the policy counts has leaked.
	inflight     proxywasm.MetricGauge
	generation   proxywasm.MetricGauge
	ageMillis    proxywasm.MetricGauge
	syncErrors   proxywasm.MetricCounter
	fetched      proxywasm.MetricCounter
	refreshBytes proxywasm.MetricCounter
	reported     proxywasm.MetricCounter
	reportErrors proxywasm.MetricCounter
	// slotsNamed counts the routed requests that named an engine slot
	// (llama.cpp's id_slot) to wait for the prompt it holds.
	slotsNamed proxywasm.MetricCounter
}

// The decision reasons: the policy's, then the rendezvous fallback and
// the pin to a previous response's engine.
const numReasons = 7

var reasonNames = [numReasons]string{
	policy.ReasonAffinity.String(),
	policy.ReasonSaturatedRelease.String(),
	policy.ReasonLeastLoad.String(),
	policy.ReasonFallback.String(),
	reasonRendezvous,
	reasonResponse,
	policy.ReasonMoved.String(),
}

func newStats() *stats {
	m := &stats{
		prefixBlocks: proxywasm.DefineHistogramMetric("kvroute.prefix_blocks"),
		inflight:     proxywasm.DefineGaugeMetric("kvroute.inflight.requests"),
		generation:   proxywasm.DefineGaugeMetric("kvroute.snapshot.generation"),
		ageMillis:    proxywasm.DefineGaugeMetric("kvroute.snapshot.age_ms"),
		syncErrors:   proxywasm.DefineCounterMetric("kvroute.sync.errors"),
		fetched:      proxywasm.DefineCounterMetric("kvroute.sync.fetched_bytes"),
		refreshBytes: proxywasm.DefineCounterMetric("kvroute.sync.refresh_bytes"),
		reported:     proxywasm.DefineCounterMetric("kvroute.reports.sent"),
		reportErrors: proxywasm.DefineCounterMetric("kvroute.reports.errors"),
		slotsNamed:   proxywasm.DefineCounterMetric("kvroute.engine_slots.named"),
	}
	for o := range m.outcomes {
		m.outcomes[o] = proxywasm.DefineCounterMetric("kvroute.requests." + outcome(o).String())
	}
	for i, r := range reasonNames {
		m.reasons[i] = proxywasm.DefineCounterMetric("kvroute.decisions." + r)
	}
	return m
}

func (m *stats) decided(d *decision) {
	m.outcomes[d.outcome].Increment(1)
	if d.outcome != routed {
		return
	}
	for i, r := range reasonNames {
		if r == d.reason {
			m.reasons[i].Increment(1)
		}
	}
	if d.reason != reasonRendezvous && d.reason != reasonResponse {
		m.prefixBlocks.Record(uint64(d.policy.Blocks))
	}
	if d.named {
		m.slotsNamed.Increment(1)
	}
}
