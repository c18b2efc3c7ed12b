package main

import (
	"runtime/metrics"

	"github.com/kvroute/kvroute/filter/proxywasm"
)

// runtimeStats publishes the Go runtime's GC cycles and live heap as Envoy
// stats, summed over the worker VMs: a Wasm VM's memory never shrinks, so
// operators need to see what the heap inside it does.
type runtimeStats struct {
	samples   [2]metrics.Sample
	gcCycles  proxywasm.MetricCounter
	heapBytes proxywasm.MetricGauge
	lastGC    uint64
	lastHeap  int64
}

func newRuntimeStats() *runtimeStats {
	s := &runtimeStats{
		gcCycles:  proxywasm.DefineCounterMetric("kvroute.vm.gc_cycles"),
		heapBytes: proxywasm.DefineGaugeMetric("kvroute.vm.heap_bytes"),
	}
	s.samples[0].Name = "/gc/cycles/total:gc-cycles"
	s.samples[1].Name = "/memory/classes/heap/objects:bytes"
	return s
}

// update publishes what changed since the last call; it does not allocate.
func (s *runtimeStats) update() {
	metrics.Read(s.samples[:])
	if s.samples[0].Value.Kind() == metrics.KindUint64 {
		gc := s.samples[0].Value.Uint64()
		s.gcCycles.Increment(gc - s.lastGC)
		s.lastGC = gc
	}
	if s.samples[1].Value.Kind() == metrics.KindUint64 {
		heap := int64(s.samples[1].Value.Uint64())
		s.heapBytes.Add(heap - s.lastHeap)
		s.lastHeap = heap
	}
}
