package proxywasm

import (
	"bytes"
	"reflect"
	"testing"
)

func TestPairsRoundTrip(t *testing.T) {
	for _, pairs := range [][][2]string{
		{},
		{{":method", "POST"}},
		{{":path", "/v1/chat/completions"}, {"x-empty", ""}, {"", "odd"}},
	} {
		got, err := decodePairs(encodePairs(pairs))
		if err != nil {
			t.Fatalf("decode(encode(%q)): %v", pairs, err)
		}
		if len(pairs) == 0 && len(got) == 0 {
			continue
		}
		if !reflect.DeepEqual(got, pairs) {
			t.Errorf("round trip = %q, want %q", got, pairs)
		}
	}
}

func TestEncodePairsLayout(t *testing.T) {
	want := []byte{
		2, 0, 0, 0, // count
		1, 0, 0, 0, 2, 0, 0, 0, // "a" -> "bc"
		0, 0, 0, 0, 1, 0, 0, 0, // "" -> "d"
		'a', 0, 'b', 'c', 0,
		0, 'd', 0,
	}
	if got := encodePairs([][2]string{{"a", "bc"}, {"", "d"}}); !bytes.Equal(got, want) {
		t.Errorf("encodePairs = %v, want %v", got, want)
	}
}

func TestDecodePairsRejectsMalformed(t *testing.T) {
	good := encodePairs([][2]string{{"k", "v"}})
	for name, b := range map[string][]byte{
		"short count":     {1, 0},
		"count too large": {0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0},
		"missing NUL":     append(append([]byte{}, good[:len(good)-1]...), 'x'),
		"truncated":       good[:len(good)-2],
		"trailing bytes":  append(append([]byte{}, good...), 0),
	} {
		if _, err := decodePairs(b); err == nil {
			t.Errorf("%s: decodePairs accepted %v", name, b)
		}
		if err := visitPairs(b, func(k, v []byte) {}); err == nil {
			t.Errorf("%s: visitPairs accepted %v", name, b)
		}
	}
}

func FuzzDecodePairs(f *testing.F) {
	f.Add(encodePairs([][2]string{{"a", "b"}}))
	f.Add([]byte{1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		pairs, err := decodePairs(b)
		if err != nil {
			return
		}
		if again, err := decodePairs(encodePairs(pairs)); err != nil || len(again) != len(pairs) {
			t.Fatalf("re-encoding %q failed: %v", pairs, err)
		}
	})
}
