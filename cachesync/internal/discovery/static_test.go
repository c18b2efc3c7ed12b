package discovery

import (
	"context"
	"log/slog"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestParseStatic(t *testing.T) {
	vllm := EventPorts{Pub: 5557}
	tests := []struct {
		name string
		spec string
		def  EventPorts
		want []Engine
	}{
		{"plain, sorted", "127.0.0.2:8000, 127.0.0.1:8000", EventPorts{}, []Engine{
			{Addr: "127.0.0.1:8000"}, {Addr: "127.0.0.2:8000"},
		}},
		{"default events", "http://127.0.0.1:8000/", vllm, []Engine{
			{Addr: "127.0.0.1:8000", Events: []EventEndpoint{{Rank: 0, Pub: "tcp://127.0.0.1:5557"}}},
		}},
		{"ports and ranks", "127.0.0.1:8000?events=6000&replay=6100&dp=2", EventPorts{}, []Engine{
			{Addr: "127.0.0.1:8000", Events: []EventEndpoint{
				{Rank: 0, Pub: "tcp://127.0.0.1:6000", Replay: "tcp://127.0.0.1:6100"},
				{Rank: 1, Pub: "tcp://127.0.0.1:6001", Replay: "tcp://127.0.0.1:6101"},
			}},
		}},
		{"endpoint of its own", "[::1]:8000?events=tcp://[::1]:7000&replay=tcp://side.local:7000", EventPorts{}, []Engine{
			{Addr: "[::1]:8000", Events: []EventEndpoint{{Rank: 0, Pub: "tcp://[::1]:7000", Replay: "tcp://side.local:7000"}}},
		}},
		{"events off for one engine", "127.0.0.1:8000?events=0\n127.0.0.3:8000", EventPorts{Pub: 5557, Replay: 5600}, []Engine{
			{Addr: "127.0.0.1:8000"},
			{Addr: "127.0.0.3:8000", Events: []EventEndpoint{{Rank: 0, Pub: "tcp://127.0.0.3:5557", Replay: "tcp://127.0.0.3:5600"}}},
		}},
		{"mapped IPv4 unmapped", "[::ffff:127.0.0.1]:8000", EventPorts{}, []Engine{{Addr: "127.0.0.1:8000"}}},
		{"publishers connect to the default listen endpoint", "10.0.0.1:8000,10.0.0.2:8000?events=5557",
			EventPorts{Listen: "tcp://*:5557", Replay: 5600, DPSize: 2}, []Engine{
				{Addr: "10.0.0.1:8000", Events: []EventEndpoint{
					{Rank: 0, Pub: "tcp://*:5557", Listen: true, Replay: "tcp://10.0.0.1:5600"},
					{Rank: 1, Pub: "tcp://*:5558", Listen: true, Replay: "tcp://10.0.0.1:5601"},
				}},
				{Addr: "10.0.0.2:8000", Events: []EventEndpoint{
					{Rank: 0, Pub: "tcp://10.0.0.2:5557", Replay: "tcp://10.0.0.2:5600"},
					{Rank: 1, Pub: "tcp://10.0.0.2:5558", Replay: "tcp://10.0.0.2:5601"},
				}},
			}},
		{"one engine's publisher connects", "10.0.0.1:8000?events=listen:tcp://0.0.0.0:6001&replay=5558,10.0.0.2:8000",
			EventPorts{Pub: 5557}, []Engine{
				{Addr: "10.0.0.1:8000", Events: []EventEndpoint{{Rank: 0, Pub: "tcp://0.0.0.0:6001", Listen: true, Replay: "tcp://10.0.0.1:5558"}}},
				{Addr: "10.0.0.2:8000", Events: []EventEndpoint{{Rank: 0, Pub: "tcp://10.0.0.2:5557"}}},
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseStatic(tt.spec, tt.def)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got  %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func TestParseStaticErrors(t *testing.T) {
	tests := []struct {
		spec string
		def  EventPorts
		want string
	}{
		{"", EventPorts{}, "no engines"},
		{"127.0.0.1:8000?events=listen", EventPorts{}, "no events listen endpoint"},
		{"127.0.0.1:8000?events=listen:5557", EventPorts{}, "want tcp://HOST:PORT"},
		{"127.0.0.1:8000?events=listener", EventPorts{}, "want listen or listen:tcp"},
		{"127.0.0.1:8000?events=listen:tcp://:5557", EventPorts{}, "want tcp://HOST:PORT"},
		{"127.0.0.1:8000", EventPorts{Pub: 5557, Listen: "tcp://*:5557"}, "engines do one or the other"},
		{"127.0.0.1:8000", EventPorts{Listen: "0.0.0.0:5557"}, "want tcp://HOST:PORT"},
		{"vllm-0.vllm:8000", EventPorts{}, "want ip:port"},
		{"127.0.0.1", EventPorts{}, "want ip:port"},
		{"127.0.0.1:0", EventPorts{}, "port 0"},
		{"127.0.0.1:8000,127.0.0.1:8000", EventPorts{}, "listed twice"},
		{"127.0.0.1:8000?events=70000", EventPorts{}, "want 1 to 65535"},
		{"127.0.0.1:8000?events=http://x:1", EventPorts{}, "want tcp://HOST:PORT"},
		{"127.0.0.1:8000?event=5557", EventPorts{}, "unknown option"},
		{"127.0.0.1:8000?events=1&events=2", EventPorts{}, "given 2 times"},
		{"127.0.0.1:8000?replay=5558", EventPorts{}, "needs an events socket"},
		{"127.0.0.1:8000?events=5557&replay=5558&dp=2", EventPorts{}, "overlap"},
		{"127.0.0.1:8000?dp=0", EventPorts{}, "want 1 to 1024"},
		{"127.0.0.1:8000?events=65535&dp=2", EventPorts{}, "out of range"},
		{"127.0.0.1:8000?%zz", EventPorts{}, "options"},
		{"127.0.0.1:8000", EventPorts{Pub: 5557, Replay: 5558, DPSize: 4}, "overlap"},
		{"127.0.0.1:8000", EventPorts{DPSize: -1}, "want ports"},
	}
	for _, tt := range tests {
		_, err := ParseStatic(tt.spec, tt.def)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("ParseStatic(%q, %+v) = %v, want an error with %q", tt.spec, tt.def, err, tt.want)
		}
	}
}

// TestStaticRun checks that the list arrives once, as a copy the receiver
// may change, and that Run returns when ctx ends.
func TestStaticRun(t *testing.T) {
	es, err := ParseStatic("127.0.0.1:8000?events=5557", EventPorts{})
	if err != nil {
		t.Fatal(err)
	}
	s := &Static{Engines: es}
	ctx, cancel := context.WithCancel(context.Background())
	out := make(chan []Engine)
	done := make(chan error)
	go func() { done <- s.Run(ctx, out) }()
	got := next(t, out)
	if !reflect.DeepEqual(got, es) {
		t.Fatalf("got %+v, want %+v", got, es)
	}
	got[0].Events[0].Pub = "changed"
	if es[0].Events[0].Pub == "changed" {
		t.Error("the receiver's copy shares memory with the source")
	}
	select {
	case more := <-out:
		t.Errorf("a second set %+v from a static list", more)
	case <-time.After(50 * time.Millisecond):
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run returned %v after ctx ended", err)
	}
	if c := s.Counters(); c.Updates != 1 {
		t.Errorf("counters %+v, want one update", c)
	}
}

// next returns the next set a source sends, or fails the test after a while.
func next(t *testing.T, out <-chan []Engine) []Engine {
	t.Helper()
	select {
	case es := <-out:
		return es
	case <-time.After(10 * time.Second):
		t.Fatal("no engine set sent")
		return nil
	}
}

var discard = slog.New(slog.DiscardHandler)
