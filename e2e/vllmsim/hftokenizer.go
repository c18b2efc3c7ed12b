package vllmsim

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	tiktokenloader "github.com/pkoukk/tiktoken-go-loader"
)

// cl100kPattern is cl100k_base's pre-tokenisation regex, as tiktoken and
// HuggingFace's GPT-4 conversions write it.
const cl100kPattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`

// cl100kSpecial are cl100k_base's special tokens.
var cl100kSpecial = map[string]int{
	"<|endoftext|>": 100257, "<|fim_prefix|>": 100258, "<|fim_middle|>": 100259,
	"<|fim_suffix|>": 100260, "<|endofprompt|>": 100276,
}

// WriteHFTokenizer writes the simulator's vocabulary (cl100k_base) as a
// HuggingFace tokenizer directory, tokenizer.json and
// tokenizer_config.json, that transformers' AutoTokenizer loads offline:
// tools that size prompts in tokens (a benchmark client) then count what
// the simulated engines count.
//
// The BPE merges are recovered from the ranks as transformers'
// TikTokenConverter does: each token of two or more bytes is what BPE over
// the lower-ranked tokens merges its bytes into, and that last merge is its
// rule.
func WriteHFTokenizer(dir string) error {
	ranks, err := tiktokenloader.NewOfflineLoader().LoadTiktokenBpe("https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken")
	if err != nil {
		return fmt.Errorf("vllmsim: load cl100k_base: %w", err)
	}
	byRank := make([]string, len(ranks))
	for tok, r := range ranks {
		if r < 0 || r >= len(byRank) || byRank[r] != "" {
			return fmt.Errorf("vllmsim: cl100k_base ranks are not 0..%d", len(ranks)-1)
		}
		byRank[r] = tok
	}
	enc := byteEncoder()
	visible := func(s string) string {
		out := make([]rune, 0, len(s))
		for i := 0; i < len(s); i++ {
			out = append(out, enc[s[i]])
		}
		return string(out)
	}
	vocab := make(map[string]int, len(ranks))
	var merges [][2]string
	for r, tok := range byRank {
		vocab[visible(tok)] = r
		if len(tok) < 2 {
			continue
		}
		parts := bpeParts(ranks, tok, r)
		if len(parts) != 2 {
			return fmt.Errorf("vllmsim: token %d (%q) does not come from one merge (%d parts)", r, tok, len(parts))
		}
		merges = append(merges, [2]string{visible(parts[0]), visible(parts[1])})
	}
	type added struct {
		ID         int    `json:"id"`
		Content    string `json:"content"`
		SingleWord bool   `json:"single_word"`
		LStrip     bool   `json:"lstrip"`
		RStrip     bool   `json:"rstrip"`
		Normalized bool   `json:"normalized"`
		Special    bool   `json:"special"`
	}
	var specials []added
	for s, id := range cl100kSpecial {
		specials = append(specials, added{ID: id, Content: s, Special: true})
	}
	slices.SortFunc(specials, func(a, b added) int { return a.ID - b.ID })
	tj := map[string]any{
		"version":        "1.0",
		"truncation":     nil,
		"padding":        nil,
		"added_tokens":   specials,
		"normalizer":     nil,
		"post_processor": nil,
		"pre_tokenizer": map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": cl100kPattern}, "behavior": "Removed", "invert": true},
			map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
		}},
		"decoder": map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
		"model": map[string]any{
			"type": "BPE", "dropout": nil, "unk_token": nil, "continuing_subword_prefix": "", "end_of_word_suffix": "",
			"fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
			"vocab": vocab, "merges": merges,
		},
	}
	config := map[string]any{
		"tokenizer_class":              "PreTrainedTokenizerFast",
		"model_max_length":             DefaultMaxModelLen,
		"bos_token":                    "<|endoftext|>",
		"eos_token":                    "<|endoftext|>",
		"unk_token":                    "<|endoftext|>",
		"clean_up_tokenization_spaces": false,
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for name, v := range map[string]any{"tokenizer.json": tj, "tokenizer_config.json": config} {
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			return fmt.Errorf("vllmsim: write %s: %w", name, err)
		}
	}
	return nil
}

// bpeParts runs byte-pair merging over tok with the merges of tokens ranked
// below maxRank, lowest rank first, and returns the parts it ends with.
func bpeParts(ranks map[string]int, tok string, maxRank int) []string {
	parts := make([]string, len(tok))
	for i := range len(tok) { // bytes, not runes
		parts[i] = tok[i : i+1]
	}
	for {
		best, at := maxRank, -1
		for i := 0; i+1 < len(parts); i++ {
			if r, ok := ranks[parts[i]+parts[i+1]]; ok && r < best {
				best, at = r, i
			}
		}
		if at < 0 {
			return parts
		}
		parts[at] += parts[at+1]
		parts = append(parts[:at+1], parts[at+2:]...)
	}
}

// byteEncoder is GPT-2's map from bytes to printable runes, which
// byte-level BPE vocabularies are written in.
func byteEncoder() [256]rune {
	var enc [256]rune
	n := 0
	for b := range 256 {
		if b >= '!' && b <= '~' || b >= 0xa1 && b <= 0xac || b >= 0xae {
			enc[b] = rune(b)
		} else {
			enc[b] = rune(256 + n)
			n++
		}
	}
	return enc
}
