package service

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/shared/syncapi"
)

// ns prefixes the service's metrics.
const ns = "kvroute_cachesync"

// ForwardedHeader marks a report batch one cachesync replica passes to
// another, naming the sender's epoch: a forwarded batch is applied and not
// forwarded again, and one that comes back to its sender (a peer list
// that names the replica itself) is dropped.
const ForwardedHeader = "x-kvroute-forwarded"

// peerQueue bounds the batches waiting for one peer: a peer that is down
// costs at most this many batches of memory, the rest are dropped (and
// counted). Reports are a hint the peer's own KV events make good.
const peerQueue = 256

// newEpoch names a process's snapshot history.
func newEpoch() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Epoch returns the name of this process's snapshot history.
func (s *Server) Epoch() string { return s.epoch }

// peer forwards the gateways' report batches to one other replica.
type peer struct {
	addr    string
	batches chan []byte
}

type peerMetrics struct{ forwarded *prometheus.CounterVec }

func newPeerMetrics() peerMetrics {
	return peerMetrics{forwarded: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Name: "peer_report_batches_total",
		Help: "Report batches forwarded to other cachesync replicas, by peer and result: sent, failed (the peer did not take it), dropped (its queue was full).",
	}, []string{"peer", "result"})}
}

// forward queues a batch a gateway sent for every peer.
func (s *Server) forward(body []byte) {
	for _, p := range s.peers {
		select {
		case p.batches <- body:
		default:
			s.pm.forwarded.WithLabelValues(p.addr, "dropped").Inc()
		}
	}
}

// runPeers sends queued batches to the peers until ctx ends.
func (s *Server) runPeers(ctx context.Context) {
	client := &http.Client{Timeout: 5 * time.Second}
	for _, p := range s.peers {
		go func() {
			url := "http://" + p.addr + syncapi.ReportPath
			for {
				var body []byte
				select {
				case <-ctx.Done():
					return
				case body = <-p.batches:
				}
				req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
				if err != nil {
					continue
				}
				req.Header.Set("Content-Type", syncapi.ContentType)
				req.Header.Set(ForwardedHeader, s.epoch)
				if t := s.peerToken.Load(); t != nil {
					req.Header.Set("Authorization", syncapi.Bearer(*t))
				}
				result := "sent"
				resp, err := client.Do(req)
				if err == nil {
					resp.Body.Close()
				}
				if err != nil || !syncapi.ReportAccepted(resp.StatusCode) {
					result = "failed"
				}
				s.pm.forwarded.WithLabelValues(p.addr, result).Inc()
			}
		}()
	}
}
