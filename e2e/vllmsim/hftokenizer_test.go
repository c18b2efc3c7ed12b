package vllmsim

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestHFTokenizerMatchesSimulator: HuggingFace's tokenizers library, loading
// the directory WriteHFTokenizer writes, encodes texts into exactly the
// token ids the simulator counts: English, code, whitespace runs, numbers,
// non-ASCII, and random words of the kind benchmark clients generate.
func TestHFTokenizerMatchesSimulator(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Fatal("python3 is not on PATH: run make setup (pip install -r e2e/requirements.txt)")
	}
	dir := t.TempDir()
	if err := WriteHFTokenizer(dir); err != nil {
		t.Fatal(err)
	}
	texts := []string{
		"Hello, world!", "  leading spaces and\ttabs\nnewlines\r\n\r\n", "naïve café 日本語 emoji 🚀 ’quotes’ «guillemets»",
		"x := 123456789 + 42; // code\n\tfmt.Println(\"hi\")\n}\n", "It's they'll we've I'm you'd SHE'S",
		strings.Repeat("The quick brown fox jumps over the lazy dog. ", 20), "    \n\n   \t  trailing   ",
	}
	tk, err := loadTokenizer()
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 20 { // decoded random ids: what a generator of N-token prompts sends
		ids := make([]int, 200)
		for i := range ids {
			ids[i] = r.IntN(100000)
		}
		texts = append(texts, tk.decode(ids))
	}
	in, _ := json.Marshal(texts)
	cmd := exec.Command(py, "testdata/hftok.py", dir)
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("hftok.py: %v\n%s", err, stderr.String())
	}
	var got [][]int
	if err := json.Unmarshal(out, &got); err != nil || len(got) != len(texts) {
		t.Fatalf("hftok.py printed %d encodings (%v)", len(got), err)
	}
	for i, s := range texts {
		if want := tk.encode(s); !slices.Equal(got[i], want) {
			t.Errorf("%q:\n simulator %v\n tokenizers %v", s, want, got[i])
		}
	}
}
