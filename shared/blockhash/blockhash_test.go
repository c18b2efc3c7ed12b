package blockhash

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// pattern returns n bytes of the sequence (i*mul+add) mod m.
func pattern(n, mul, add, m int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte((i*mul + add) % m)
	}
	return b
}

// The expected values were computed with the Python xxhash package (4.1.0),
// independently of this code:
//
//	seed = xxh64_intdigest(model.encode() + b"\0" + adapter.encode())
//	next = xxh64_intdigest(struct.pack("<Q", prev) + block)
func TestDefinitionPinned(t *testing.T) {
	text := pattern(200, 7, 3, 251) // three full 64-byte blocks and 8 bytes more
	tests := []struct {
		name string
		got  func() []uint64
		want []uint64
	}{
		{"seed", func() []uint64 { return []uint64{Seed("Qwen/Qwen2.5-7B-Instruct", "")} }, []uint64{0x2d2a51af1df9c6bc}},
		{"seed with adapter", func() []uint64 { return []uint64{Seed("meta-llama/Llama-3.1-8B-Instruct", "sql-lora")} }, []uint64{0x4abfce4aa238a772}},
		{"next of empty block", func() []uint64 { return []uint64{Next(0, nil)} }, []uint64{0x34c96acdcadb1bbb}},
		{"next of short block", func() []uint64 { return []uint64{Next(0x0123456789abcdef, []byte("hello, world"))} }, []uint64{0x9991e82a049bc2cf}},
		{"next of 300-byte block", func() []uint64 { return []uint64{Next(42, pattern(300, 13, 5, 256))} }, []uint64{0x1dd65aed55dbf6b7}},
		{"append", func() []uint64 { return Append(nil, Seed("Qwen/Qwen2.5-7B-Instruct", ""), text, Config{}) },
			[]uint64{0x8a1036fd8027e546, 0x74ea36f7f030923f, 0xc1778660d42b8972}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.got()
			if len(got) != len(tt.want) {
				t.Fatalf("got %d hashes %x, want %x", len(got), got, tt.want)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Errorf("hash %d = %#x, want %#x", i, got[i], tt.want[i])
				}
			}
		})
	}
}

// reference is the definition written the obvious way.
func reference(prev uint64, block []byte) uint64 {
	b := binary.LittleEndian.AppendUint64(nil, prev)
	return xxhash.Sum64(append(b, block...))
}

func TestNextMatchesDefinition(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for n := 0; n <= 600; n++ {
		block := make([]byte, n)
		for i := range block {
			block[i] = byte(r.Uint32())
		}
		prev := r.Uint64()
		if got, want := Next(prev, block), reference(prev, block); got != want {
			t.Fatalf("Next(%#x, %d bytes) = %#x, want %#x", prev, n, got, want)
		}
	}
}

func TestAppend(t *testing.T) {
	text := pattern(1000, 31, 7, 256)
	seed := Seed("m", "")
	chain := func(bs, blocks int) []uint64 {
		var out []uint64
		h := seed
		for i := 0; i < blocks; i++ {
			h = reference(h, text[i*bs:(i+1)*bs])
			out = append(out, h)
		}
		return out
	}
	tests := []struct {
		name string
		text []byte
		cfg  Config
		want []uint64
	}{
		{"empty", nil, Config{}, nil},
		{"shorter than a block", text[:63], Config{}, nil},
		{"exactly one block", text[:64], Config{}, chain(64, 1)},
		{"partial block dropped", text[:200], Config{}, chain(64, 3)},
		{"default size", text, Config{}, chain(64, 15)},
		{"block size 16", text, Config{BlockSize: 16}, chain(16, 62)},
		{"block size 256", text, Config{BlockSize: 256}, chain(256, 3)},
		{"block size 300 (beyond the stack buffer)", text, Config{BlockSize: 300}, chain(300, 3)},
		{"capped", text, Config{MaxBlocks: 4}, chain(64, 4)},
		{"cap above the text", text, Config{MaxBlocks: 100}, chain(64, 15)},
		{"negative settings mean defaults", text, Config{BlockSize: -1, MaxBlocks: -5}, chain(64, 15)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Append(nil, seed, tt.text, tt.cfg)
			if len(got) != len(tt.want) {
				t.Fatalf("got %d hashes, want %d", len(got), len(tt.want))
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Fatalf("hash %d = %#x, want %#x", i, got[i], tt.want[i])
				}
			}
		})
	}
}

func TestAppendKeepsDst(t *testing.T) {
	dst := []uint64{7, 8}
	got := Append(dst, Seed("m", ""), pattern(128, 1, 0, 256), Config{})
	if len(got) != 4 || got[0] != 7 || got[1] != 8 {
		t.Fatalf("Append did not append to dst: %x", got)
	}
}

func TestPrefixProperty(t *testing.T) {
	// Two texts that share their first k blocks share exactly k hashes.
	a := pattern(640, 17, 1, 256)
	b := append([]byte(nil), a...)
	b[3*64+10] ^= 1 // differs in block 3
	ha := Append(nil, Seed("m", ""), a, Config{})
	hb := Append(nil, Seed("m", ""), b, Config{})
	for i := range ha {
		if same := ha[i] == hb[i]; same != (i < 3) {
			t.Errorf("block %d: equal=%v, want %v", i, same, i < 3)
		}
	}
}

func TestSeedsSeparateModels(t *testing.T) {
	seeds := map[uint64]string{}
	for _, ma := range [][2]string{{"a", ""}, {"b", ""}, {"a", "x"}, {"ax", ""}, {"", "ax"}, {"a\x00", ""}} {
		s := Seed(ma[0], ma[1])
		if prev, dup := seeds[s]; dup {
			t.Errorf("Seed(%q) collides with %s", ma, prev)
		}
		seeds[s] = ma[0] + "|" + ma[1]
	}
}

func TestMax(t *testing.T) {
	tests := []struct {
		cfg  Config
		want int
	}{
		{Config{}, 8192},
		{Config{BlockSize: 16}, 32768},
		{Config{BlockSize: 100}, 5243},
		{Config{MaxBlocks: 3}, 3},
	}
	for _, tt := range tests {
		if got := tt.cfg.Max(); got != tt.want {
			t.Errorf("%+v.Max() = %d, want %d", tt.cfg, got, tt.want)
		}
	}
}

func TestAppendDoesNotAllocate(t *testing.T) {
	text := pattern(16<<10, 3, 1, 256)
	dst := make([]uint64, 0, 1024)
	seed := Seed("m", "")
	if n := testing.AllocsPerRun(10, func() { dst = Append(dst[:0], seed, text, Config{}) }); n != 0 {
		t.Errorf("Append allocates %v times per call", n)
	}
}

func benchmarkAppend(b *testing.B, size, bs int) {
	text := pattern(size, 7, 3, 251)
	dst := make([]uint64, 0, size/bs+1)
	seed := Seed("m", "")
	cfg := Config{BlockSize: bs, MaxBlocks: size / bs}
	b.SetBytes(int64(size))
	b.ReportAllocs()
	for b.Loop() {
		dst = Append(dst[:0], seed, text, cfg)
	}
}

func BenchmarkAppend16KiB(b *testing.B)          { benchmarkAppend(b, 16<<10, 64) }
func BenchmarkAppend512KiB(b *testing.B)         { benchmarkAppend(b, 512<<10, 64) }
func BenchmarkAppend512KiBBlock256(b *testing.B) { benchmarkAppend(b, 512<<10, 256) }
func BenchmarkSum64Whole512KiB(b *testing.B) {
	text := pattern(512<<10, 7, 3, 251)
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	for b.Loop() {
		xxhash.Sum64(text)
	}
}

// BenchmarkDigestPerBlock512KiB is the obvious implementation, one
// xxhash.Digest write of (previous hash, block) per block, kept as the
// baseline the README's ratios refer to.
func BenchmarkDigestPerBlock512KiB(b *testing.B) {
	text := pattern(512<<10, 7, 3, 251)
	dst := make([]uint64, 0, len(text)/64)
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	for b.Loop() {
		dst = dst[:0]
		h := Seed("m", "")
		for blk := text; len(blk) >= 64; blk = blk[64:] {
			var p [8]byte
			binary.LittleEndian.PutUint64(p[:], h)
			d := xxhash.New()
			d.Write(p[:])
			d.Write(blk[:64])
			h = d.Sum64()
			dst = append(dst, h)
		}
	}
}

func TestSalted(t *testing.T) {
	seed := Seed("m", "")
	if Salted(seed, "") != seed {
		t.Error("no salt changed the seed")
	}
	a, b := Salted(seed, "tenant-a"), Salted(seed, "tenant-b")
	if a == seed || b == seed || a == b || Salted(seed, "tenant-a") != a {
		t.Errorf("salted seeds %x, %x from %x: want distinct and stable", a, b, seed)
	}
	if Salted(Seed("n", ""), "tenant-a") == a {
		t.Error("the same salt on two models gave one seed")
	}
}
