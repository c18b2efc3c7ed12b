package daemon

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/cachesync/internal/planner"
	"github.com/kvroute/kvroute/shared/snapshot"
)

// descMoves counts the prompt groups the planner moved.
var descMoves = prometheus.NewDesc(ns+"group_moves_total",
	"Prompt groups the planner moved between engines of a deployment to spread their decoding (a swap counts two).", nil, nil)

// plan lets the planner move groups within each deployment's healthy
// engines, by the demand the gateways' reports show; d.mu is held. The
// pins reach the snapshot as each engine's row is next updated.
func (d *Daemon) plan(now time.Time) {
	pools := map[string][]planner.Endpoint{}
	for addr, e := range d.engines {
		if e.scraped && e.last.Health == snapshot.HealthHealthy && !e.d.Draining {
			if dep := d.models.deploymentOf(addr); dep != "" {
				pools[dep] = append(pools[dep], planner.Endpoint{Addr: addr, Waiting: e.last.Waiting,
					KVCacheUsage: e.last.KVCacheUsage})
			}
		}
	}
	for _, m := range d.planner.Plan(now, d.demand.Groups(now), pools) {
		group := strconv.FormatUint(m.Key, 16)
		if m.Dropped {
			d.log.Info("dropped a prompt group's pin: its requests did not follow", "deployment", m.Pool,
				"group", group, "pinned_to", m.From, "output_tokens_per_second", m.Rate)
			continue
		}
		d.moves++
		d.log.Info("moved a prompt group", "deployment", m.Pool, "group", group,
			"from", m.From, "to", m.To, "output_tokens_per_second", m.Rate,
			"target_kv_cache_usage", d.engines[m.To].last.KVCacheUsage)
	}
}
