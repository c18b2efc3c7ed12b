package vllmsim

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestPyzmqInterop has a libzmq peer (pyzmq from PyPI) subscribe to the
// engine's PUB socket, decode every batch with msgpack, check that msgspec
// decoding into vLLM's own event structs and encoding again gives the same
// bytes, recompute every block hash with cbor2 and hashlib as vLLM does,
// then replay the stream through the ROUTER socket as a DEALER.
func TestPyzmqInterop(t *testing.T) {
	tests := []struct {
		name     string
		enc      Encoding
		batchMap bool
		noTopic  bool
	}{
		{"map", EncodingMap, false, false},
		{"array", EncodingArray, false, true},
		{"array-legacy", EncodingArrayLegacy, false, true},
		{"batch-map", EncodingMap, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.NumGPUBlocks = 17 // 16 usable: the second prompt evicts part of the first
			cfg.Encoding, cfg.BatchAsMap, cfg.ReplayWithoutTopic = tt.enc, tt.batchMap, tt.noTopic
			cfg.KVEvents.Topic = "kv@sim@" + tt.name
			e := startEngine(t, cfg)
			peerEnc := tt.name
			peer := startPeer(t, "sub", e.EventsEndpoint(), cfg.KVEvents.Topic, peerEnc, "0")
			peer.next(t, 30*time.Second) // ready; Python starts slowly on a busy machine

			// Until the subscription is live, every reset's AllBlocksCleared
			// is lost; the first one the peer sees starts the stream.
			for deadline := time.Now().Add(30 * time.Second); ; {
				if time.Now().After(deadline) {
					t.Fatalf("the Python SUB received nothing; stderr: %s", peer.stderr)
				}
				e.ResetPrefixCache(false)
				select {
				case <-peer.lines:
				case <-time.After(100 * time.Millisecond):
					continue
				}
				break
			}
			for drained := false; !drained; {
				select {
				case <-peer.lines:
				case <-time.After(300 * time.Millisecond):
					drained = true
				}
			}
			chat(t, e, strings.Repeat("The first prompt fills about nine blocks of sixteen tokens. ", 12), 20)
			chat(t, e, strings.Repeat("A different second prompt that evicts older blocks from the cache. ", 11), 20)

			var seqs []int
			stored, removed, hashed := 0, 0, 0
			for len(seqs) == 0 || stored == 0 || removed == 0 || hashed == 0 {
				m := peer.next(t, 10*time.Second)
				if m["frames"].(float64) != 3 || m["topic"] != cfg.KVEvents.Topic {
					t.Fatalf("frames %v, topic %v", m["frames"], m["topic"])
				}
				if m["msgspec_same_bytes"] != true {
					t.Fatalf("msgspec re-encoding with vLLM's structs differs: %v", m["batch"])
				}
				for _, ok := range m["hash_ok"].([]any) {
					if ok != true {
						t.Fatalf("block hash differs from vLLM's sha256_cbor: %v", m)
					}
					hashed++
				}
				seqs = append(seqs, int(m["seq"].(float64)))
				s := fmt.Sprint(m["batch"])
				stored += strings.Count(s, "BlockStored")
				removed += strings.Count(s, "BlockRemoved")
			}
			for i := 1; i < len(seqs); i++ {
				if seqs[i] != seqs[i-1]+1 {
					t.Fatalf("sequence numbers %v are not consecutive", seqs)
				}
			}

			// Replay from the first live batch: the peer gets it and what
			// follows, then the end marker.
			from := seqs[0]
			rp := startPeer(t, "replay", e.ReplayEndpoint(), fmt.Sprint(from), peerEnc)
			want := from
			for {
				m := rp.next(t, 10*time.Second)
				if m["error"] != nil {
					t.Fatal(m["error"])
				}
				wantFrames := 3.0
				if tt.noTopic {
					wantFrames = 2
				}
				if m["frames"].(float64) != wantFrames {
					t.Fatalf("replay reply has %v frames, want %v", m["frames"], wantFrames)
				}
				seq := int(m["seq"].(float64))
				if seq == -1 {
					break
				}
				if seq != want || m["msgspec_same_bytes"] != true {
					t.Fatalf("replayed seq %d (want %d), msgspec %v", seq, want, m["msgspec_same_bytes"])
				}
				if !tt.noTopic && m["topic"] != cfg.KVEvents.Topic {
					t.Fatalf("replay topic %v", m["topic"])
				}
				want++
			}
			if want <= seqs[len(seqs)-1] {
				t.Fatalf("replay ended at %d, before the live stream's %d", want, seqs[len(seqs)-1])
			}
		})
	}
}
