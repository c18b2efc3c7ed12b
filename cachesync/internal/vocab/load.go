package vocab

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"github.com/pkoukk/tiktoken-go-loader/assets"
)

// maxFile bounds the size of a vocabulary file: the largest tokenizer.json
// files in use are a few tens of megabytes.
const maxFile = 256 << 20

// builtins are the tiktoken encodings shipped with
// github.com/pkoukk/tiktoken-go-loader, with their special tokens as
// github.com/pkoukk/tiktoken-go defines them.
var builtins = map[string]map[string]uint32{
	"cl100k_base": {"<|endoftext|>": 100257, "<|fim_prefix|>": 100258, "<|fim_middle|>": 100259, "<|fim_suffix|>": 100260, "<|endofprompt|>": 100276},
	"o200k_base":  {"<|endoftext|>": 199999, "<|endofprompt|>": 200018},
	"p50k_base":   {"<|endoftext|>": 50256},
	"r50k_base":   {"<|endoftext|>": 50256},
}

// Load loads a vocabulary: a built-in tiktoken encoding by name
// ("cl100k_base", "o200k_base", "p50k_base", "r50k_base"), a HuggingFace
// tokenizer.json, a model directory holding one, or a tiktoken file (one
// base64 token and its rank per line; such a file lists no special tokens,
// see ParseTiktoken).
func Load(src string) (*Vocab, error) {
	if special, ok := builtins[src]; ok {
		data, err := assets.Assets.ReadFile(src + ".tiktoken")
		if err != nil {
			return nil, fmt.Errorf("vocab %s: built-in encoding: %w", src, err)
		}
		return ParseTiktoken(src, data, special)
	}
	path := src
	if st, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("vocab: %w (want a file, a model directory or one of cl100k_base, o200k_base, p50k_base, r50k_base)", err)
	} else if st.IsDir() {
		path = filepath.Join(path, "tokenizer.json")
	}
	data, err := readFile(path)
	if err != nil {
		return nil, err
	}
	if t := bytes.TrimLeft(data, " \t\r\n\ufeff"); len(t) > 0 && t[0] == '{' {
		return ParseTokenizerJSON(src, data)
	}
	return ParseTiktoken(src, data, nil)
}

func readFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("vocab: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxFile+1))
	if err != nil {
		return nil, fmt.Errorf("vocab: read %s: %w", path, err)
	}
	if len(data) > maxFile {
		return nil, fmt.Errorf("vocab: %s is larger than %d bytes", path, maxFile)
	}
	return data, nil
}

// ParseTiktoken loads a tiktoken vocabulary: lines of a base64-encoded token,
// a space and its rank, which is its id. special adds tokens that decode to
// their literal content (the file format has no place for them). name labels
// the vocabulary in errors and logs.
func ParseTiktoken(name string, data []byte, special map[string]uint32) (*Vocab, error) {
	b := &builder{name: name}
	var tok []byte
	for n := 1; len(data) > 0; n++ {
		line := data
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			line, data = data[:i], data[i+1:]
		} else {
			data = nil
		}
		line = bytes.TrimRight(line, "\r")
		if len(line) == 0 {
			continue
		}
		enc, rank, ok := bytes.Cut(line, []byte{' '})
		if !ok {
			return nil, fmt.Errorf("vocab %s: line %d: want a base64 token, a space and a rank", name, n)
		}
		id, err := strconv.ParseUint(string(rank), 10, 32)
		if err != nil {
			return nil, fmt.Errorf("vocab %s: line %d: rank: %w", name, n, err)
		}
		tok = tok[:0]
		tok, err = base64.StdEncoding.AppendDecode(tok, enc)
		if err != nil {
			return nil, fmt.Errorf("vocab %s: line %d: token: %w", name, n, err)
		}
		if err := b.set(uint32(id), bytes.Clone(tok), false); err != nil {
			return nil, err
		}
	}
	for s, id := range special {
		if err := b.set(id, []byte(s), true); err != nil {
			return nil, err
		}
	}
	return b.build(0, 0)
}
