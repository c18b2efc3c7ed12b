package inflight

import "testing"

func TestUpdateSumRoundTrip(t *testing.T) {
	const ttl = 1000
	var tab Table
	tab.Update(1, 100, ttl, 0xa, Counts{500, 1})
	tab.Update(2, 100, ttl, 0xa, Counts{300, 1})
	tab.Update(2, 110, ttl, 0xb, Counts{7, 1})
	var got Table
	if err := got.Decode(tab.Append(nil)); err != nil {
		t.Fatal(err)
	}
	if s := got.Sum(120, ttl, 0xa); s != (Counts{800, 2}) {
		t.Errorf("sum a = %+v, want {800 2}", s)
	}
	if s := got.Sum(120, ttl, 0xb); s != (Counts{7, 1}) {
		t.Errorf("sum b = %+v", s)
	}
	// VM 1 releases its request: counts go back, never below zero.
	got.Update(1, 130, ttl, 0xa, Counts{-500, -1})
	got.Update(1, 130, ttl, 0xa, Counts{-500, -1})
	if s := got.Sum(130, ttl, 0xa); s != (Counts{300, 1}) {
		t.Errorf("after release sum a = %+v, want {300 1}", s)
	}
}

func TestStaleRowsStopCountingAndAreDropped(t *testing.T) {
	const ttl = 1000
	var tab Table
	tab.Update(1, 0, ttl, 0xa, Counts{100, 1}) // a VM that then dies
	tab.Update(2, 0, ttl, 0xa, Counts{50, 1})
	tab.Update(2, 1500, ttl, 0, Counts{}) // VM 2 beats on its tick
	if s := tab.Sum(1500, ttl, 0xa); s != (Counts{50, 1}) {
		t.Errorf("sum with a dead VM = %+v, want only the live VM's {50 1}", s)
	}
	if len(tab.Rows) != 1 {
		t.Errorf("%d rows kept, want the dead VM's dropped", len(tab.Rows))
	}
}

func TestDecodeRejectsCorrupt(t *testing.T) {
	var tab Table
	tab.Update(1, 1, 10, 2, Counts{3, 4})
	good := tab.Append(nil)
	for name, b := range map[string][]byte{
		"magic":     append([]byte("XXXX"), good[4:]...),
		"truncated": good[:len(good)-1],
		"trailing":  append(append([]byte{}, good...), 0),
		"short":     good[:5],
	} {
		var got Table
		if err := got.Decode(b); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
	var empty Table
	if err := empty.Decode(nil); err != nil || len(empty.Rows) != 0 {
		t.Errorf("empty value: %v %v", empty, err)
	}
}

func FuzzDecode(f *testing.F) {
	var tab Table
	tab.Update(1, 1, 10, 2, Counts{3, 4})
	f.Add(tab.Append(nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		var tab, again Table
		if tab.Decode(b) != nil {
			return
		}
		if err := again.Decode(tab.Append(nil)); err != nil {
			t.Fatalf("re-encoding failed: %v", err)
		}
	})
}

// The request path decodes the table and sums it for every endpoint slot;
// with a reused Table it must not allocate.
func TestDecodeReusesMemory(t *testing.T) {
	var src Table
	for vm := range uint64(8) {
		for ep := range uint64(64) {
			src.Update(vm+1, 100, 1000, ep, Counts{10, 1})
		}
	}
	b := src.Append(nil)
	var tab Table
	tab.Decode(b)
	var total int64
	sum := func(e Entry) { total += e.Requests }
	if n := testing.AllocsPerRun(100, func() {
		tab.Decode(b)
		tab.Each(100, 1000, sum)
	}); n != 0 {
		t.Errorf("decode and sum allocate %v times per run", n)
	}
}

func BenchmarkDecodeSum(b *testing.B) {
	var src Table
	for vm := range uint64(8) {
		for ep := range uint64(64) {
			src.Update(vm+1, 100, 1000, ep, Counts{10, 1})
		}
	}
	v := src.Append(nil)
	var tab Table
	var total int64
	b.SetBytes(int64(len(v)))
	b.ReportAllocs()
	for b.Loop() {
		tab.Decode(v)
		tab.Each(100, 1000, func(e Entry) { total += e.Requests })
	}
}
