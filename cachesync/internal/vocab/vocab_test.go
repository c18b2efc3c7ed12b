package vocab

import (
	"encoding/json"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/pkoukk/tiktoken-go"
	tiktokenloader "github.com/pkoukk/tiktoken-go-loader"
)

// hfCase is one text of testdata/cases.json and the ids HuggingFace's
// tokenizers library encodes it to (see testdata/gen.py).
type hfCase struct {
	Text     string   `json:"text"`
	IDs      []uint32 `json:"ids"`
	HFDecode string   `json:"hf_decode"`
}

func loadCases(t *testing.T) map[string][]hfCase {
	t.Helper()
	b, err := os.ReadFile("testdata/cases.json")
	if err != nil {
		t.Fatal(err)
	}
	var cases map[string][]hfCase
	if err := json.Unmarshal(b, &cases); err != nil {
		t.Fatal(err)
	}
	return cases
}

// TestTokenizerJSON decodes what the real tokenizers library encoded, whole
// and cut into blocks of every size with the State carried across, and
// gets back the original text byte for byte, also where the library's own
// decode does not (the dummy prefix after a special token).
func TestTokenizerJSON(t *testing.T) {
	cases := loadCases(t)
	for _, fixture := range []string{"bytelevel", "llama2", "metaspace", "gemma", "unigram"} {
		t.Run(fixture, func(t *testing.T) {
			v, err := Load(filepath.Join("testdata", fixture+".json"))
			if err != nil {
				t.Fatal(err)
			}
			if len(cases[fixture]) == 0 {
				t.Fatal("no cases")
			}
			for _, c := range cases[fixture] {
				for size := 1; size <= len(c.IDs); size++ {
					var got []byte
					st := v.Start()
					for i := 0; i < len(c.IDs); i += size {
						got, st, err = v.Append(got, st, c.IDs[i:min(i+size, len(c.IDs))])
						if err != nil {
							t.Fatalf("%q: %v", c.Text, err)
						}
					}
					if string(got) != c.Text {
						t.Fatalf("blocks of %d ids: decoded %q, want %q (the library's decode: %q)", size, got, c.Text, c.HFDecode)
					}
				}
			}
		})
	}
}

// TestDummyPrefix pins where decoding drops the space a SentencePiece
// tokenizer inserted, by fixture.
func TestDummyPrefix(t *testing.T) {
	tests := []struct {
		fixture        string
		start, segment State
	}{
		{"bytelevel", 0, 0},
		{"llama2", 1, 1},    // Strip decoder; Prepend normalizer on every segment
		{"metaspace", 1, 0}, // prepend_scheme "first"
		{"gemma", 0, 0},
		{"unigram", 1, 1}, // prepend_scheme "always"
	}
	for _, tt := range tests {
		v, err := Load(filepath.Join("testdata", tt.fixture+".json"))
		if err != nil {
			t.Fatal(err)
		}
		if v.start != tt.start || v.segment != tt.segment {
			t.Errorf("%s: start %d segment %d, want %d %d", tt.fixture, v.start, v.segment, tt.start, tt.segment)
		}
	}
}

// tokenizerJSON returns a minimal tokenizer.json with the given decoder
// and model.
func tokenizerJSON(decoder, model string) []byte {
	return []byte(`{"added_tokens":[{"id":3,"content":"<s>","special":true,"normalized":false}],
		"normalizer":null,"pre_tokenizer":null,"decoder":` + decoder + `,"model":` + model + `}`)
}

const bpeModel = `{"type":"BPE","vocab":{"a":0,"▁b":1,"<0x0A>":2}}`

func TestTokenizerJSONDecoders(t *testing.T) {
	tests := []struct {
		name    string
		decoder string
		model   string
		want    string // decoding ids 3, 1, 0, 2, 1 from the start
		err     error
	}{
		{"sentencepiece", `{"type":"Sequence","decoders":[{"type":"Replace","pattern":{"String":"▁"},"content":" "},{"type":"ByteFallback"},{"type":"Fuse"},{"type":"Strip","content":" ","start":1,"stop":0}]}`, bpeModel, "<s> ba\n b", nil},
		{"no fallback", `{"type":"Sequence","decoders":[{"type":"Replace","pattern":{"String":"▁"},"content":" "},{"type":"Fuse"}]}`, bpeModel, "<s> ba<0x0A> b", nil},
		{"metaspace legacy", `{"type":"Metaspace","replacement":"▁","add_prefix_space":true}`, bpeModel, "<s> ba<0x0A> b", nil},
		{"unigram", `{"type":"Metaspace","replacement":"▁","prepend_scheme":"never"}`, `{"type":"Unigram","vocab":[["a",0],["▁b",-1.5],["<0x0A>",0]]}`, "<s> ba<0x0A> b", nil},
		{"byte level", `{"type":"ByteLevel"}`, `{"type":"BPE","vocab":{"a":0,"Ġb":1,"Ċ":2}}`, "<s> ba\n b", nil},
		{"no decoder", `null`, bpeModel, "", ErrUnsupported},
		{"wordpiece", `{"type":"WordPiece","prefix":"##"}`, bpeModel, "", ErrUnsupported},
		{"regex replace", `{"type":"Replace","pattern":{"Regex":"▁+"},"content":" "}`, bpeModel, "", ErrUnsupported},
		{"strip every token", `{"type":"Strip","content":" ","start":1,"stop":0}`, bpeModel, "", ErrUnsupported},
		{"strip the end", `{"type":"Sequence","decoders":[{"type":"Fuse"},{"type":"Strip","content":" ","start":0,"stop":1}]}`, bpeModel, "", ErrUnsupported},
		{"wordlevel model", `{"type":"ByteLevel"}`, `{"type":"WordLevel","vocab":{"a":0}}`, "", ErrUnsupported},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := ParseTokenizerJSON(tt.name, tokenizerJSON(tt.decoder, tt.model))
			if tt.err != nil {
				if !errors.Is(err, tt.err) {
					t.Fatalf("error %v, want %v", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got, _, err := v.Append(nil, v.Start(), []uint32{3, 1, 0, 2, 1})
			if err != nil || string(got) != tt.want {
				t.Fatalf("decoded %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

func TestMalformed(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, src := range []string{
		filepath.Join(dir, "missing.json"),
		write("truncated.json", `{"model":{"type":"BPE","vocab":{"a":`),
		write("badvocab.json", `{"decoder":{"type":"ByteLevel"},"model":{"type":"BPE","vocab":[1,2]}}`),
		write("empty.json", `{"decoder":{"type":"ByteLevel"},"model":{"type":"BPE","vocab":{}}}`),
		write("hugeid.json", `{"decoder":{"type":"ByteLevel"},"model":{"type":"BPE","vocab":{"a":4294967295}}}`),
		write("notbase64.tiktoken", "!!!! 0\n"),
		write("norank.tiktoken", "YQ==\n"),
		write("badrank.tiktoken", "YQ== -1\n"),
		write("empty.tiktoken", "\n\n"),
		dir, // a directory without tokenizer.json
	} {
		if v, err := Load(src); err == nil {
			t.Errorf("Load(%s) = %v, want an error", filepath.Base(src), v)
		}
	}
}

func TestLoadDirectoryAndTiktokenFile(t *testing.T) {
	dir := t.TempDir()
	src, err := os.ReadFile("testdata/gemma.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), src, 0o644); err != nil {
		t.Fatal(err)
	}
	v, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if b, ok := v.Token(2); !ok || string(b) != "<bos>" {
		t.Fatalf("token 2 = %q %v, want <bos>", b, ok)
	}

	// "a" rank 0, "b c" rank 1, a gap at 2, "\xff" rank 3.
	p := filepath.Join(dir, "tiny.tiktoken")
	if err := os.WriteFile(p, []byte("YQ== 0\r\nYiBj 1\n/w== 3"), 0o644); err != nil {
		t.Fatal(err)
	}
	v, err = Load(p)
	if err != nil {
		t.Fatal(err)
	}
	got, err := v.AppendBytes(nil, []uint32{1, 0, 3})
	if err != nil || string(got) != "b ca\xff" {
		t.Fatalf("decoded %q, %v", got, err)
	}
	if _, err := v.AppendBytes(nil, []uint32{2}); !errors.Is(err, ErrUnknownToken) {
		t.Fatalf("the gap decoded: %v", err)
	}
	if _, err := v.AppendBytes(nil, []uint32{4}); !errors.Is(err, ErrUnknownToken) {
		t.Fatalf("an id past the end decoded: %v", err)
	}
}

var (
	cl100k    *Vocab
	cl100kTik *tiktoken.Tiktoken
)

func loadCL100K(t testing.TB) (*Vocab, *tiktoken.Tiktoken) {
	t.Helper()
	if cl100k == nil {
		v, err := Load("cl100k_base")
		if err != nil {
			t.Fatal(err)
		}
		tiktoken.SetBpeLoader(tiktokenloader.NewOfflineLoader())
		tk, err := tiktoken.GetEncoding("cl100k_base")
		if err != nil {
			t.Fatal(err)
		}
		cl100k, cl100kTik = v, tk
	}
	return cl100k, cl100kTik
}

// TestCL100K decodes tiktoken-go's own encodings of varied texts, special
// tokens included, cut at every block size, and gets the texts back.
func TestCL100K(t *testing.T) {
	v, tk := loadCL100K(t)
	if v.Len() != 100277 {
		t.Fatalf("%d ids, want 100277", v.Len())
	}
	texts := []string{
		"Hello world",
		"<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
		"<|endoftext|>special tokens<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>",
		"naïve café — 東京 😀 👩‍💻 \t\r\n  spaces",
		strings.Repeat("The quick brown fox jumps over the lazy dog. ", 20),
	}
	r := rand.New(rand.NewPCG(1, 2))
	alphabet := []rune("abcXYZ019 \n\t.,;:'\"<>|_-éüß東京😀ꙮ\u200d")
	for range 50 {
		rs := make([]rune, r.IntN(200))
		for i := range rs {
			rs[i] = alphabet[r.IntN(len(alphabet))]
		}
		texts = append(texts, string(rs))
	}
	for _, text := range texts {
		ids := tk.Encode(text, []string{"all"}, nil)
		u := make([]uint32, len(ids))
		for i, id := range ids {
			u[i] = uint32(id)
		}
		for _, size := range []int{1, 3, 16, len(u) + 1} {
			var got []byte
			var err error
			for i := 0; i < len(u); i += size {
				if got, err = v.AppendBytes(got, u[i:min(i+size, len(u))]); err != nil {
					t.Fatal(err)
				}
			}
			if string(got) != text {
				t.Fatalf("blocks of %d: decoded %q, want %q", size, got, text)
			}
		}
		if !utf8.ValidString(text) {
			t.Fatal("bad test text")
		}
	}
}

func TestBuiltins(t *testing.T) {
	for name, special := range builtins {
		v, err := Load(name)
		if err != nil {
			t.Fatal(err)
		}
		for s, id := range special {
			if b, ok := v.Token(id); !ok || string(b) != s {
				t.Errorf("%s: token %d = %q, want %q", name, id, b, s)
			}
		}
	}
}

func TestAppendBytesAllocs(t *testing.T) {
	v, tk := loadCL100K(t)
	ids := tk.EncodeOrdinary(strings.Repeat("The quick brown fox jumps over the lazy dog. ", 4))
	u := make([]uint32, len(ids))
	for i, id := range ids {
		u[i] = uint32(id)
	}
	dst := make([]byte, 0, 4096)
	if n := testing.AllocsPerRun(100, func() {
		if _, err := v.AppendBytes(dst[:0], u); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Fatalf("%v allocations per decode", n)
	}
}

func BenchmarkAppendBytes(b *testing.B) {
	v, tk := loadCL100K(b)
	ids := tk.EncodeOrdinary(strings.Repeat("The quick brown fox jumps over the lazy dog. Prefix caches keep keys and values. ", 50))
	u := make([]uint32, len(ids))
	for i, id := range ids {
		u[i] = uint32(id)
	}
	dst := make([]byte, 0, 1<<16)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		dst, _ = v.AppendBytes(dst[:0], u)
	}
	b.ReportMetric(float64(len(u))*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
}
