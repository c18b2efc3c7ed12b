// Package verify checks that an engine renders chat prompts byte for byte
// as the gateways do. Precise routing matches the block hashes of the
// filter's rendered text against the index of what the engine cached; after
// the first byte in which the two renders differ, no block matches, and
// routing quietly falls back to load alone while every dashboard looks
// healthy. So cachesync asks each engine to render a fixed set of probe
// conversations as it renders chat requests (vLLM's POST
// /v1/chat/completions/render, else its POST /tokenize with messages),
// decodes the tokens with the vocabulary the index uses, and compares the
// text with what shared/prompt renders under each template.
//
// Decoding with the index's vocabulary is the point: it is also how KV
// events become text, so an agreement here is an agreement of the hashes.
package verify

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/kvroute/kvroute/cachesync/internal/vocab"
	"github.com/kvroute/kvroute/shared/prompt"
)

// Probe is one conversation of the probe set: a chat request body without
// its model.
type Probe struct {
	Name string          `json:"name"`
	Body json.RawMessage `json:"body"`
}

// Probes are the conversations every engine renders (probes.json, which
// shared/prompt's Jinja2 reference script renders too). Together they reach
// each branch the known templates take: with and without a system prompt,
// earlier turns, tool definitions, calls and results, content given as
// parts, text that needs escaping, and a render without the generation
// prompt. Media parts are left out: their text is a placeholder of kvroute's
// own that no engine prints.
var Probes = mustProbes()

//go:embed probes.json
var probesJSON []byte

func mustProbes() []Probe {
	var ps []Probe
	if err := json.Unmarshal(probesJSON, &ps); err != nil {
		panic("verify: probes.json: " + err.Error())
	}
	return ps
}

// ErrUnsupported means the engine has no chat /tokenize: it cannot be
// checked, which is not the same as disagreeing.
var ErrUnsupported = errors.New("verify: engine does not tokenize chat messages")

// maxResponse bounds an engine's answer to one probe: the probes are a few
// hundred tokens each.
const maxResponse = 1 << 20

// Rendering is what an engine made of the probe set.
type Rendering struct {
	Model string
	// At is when the engine rendered it: templates that print today's date
	// are compared as of then.
	At time.Time
	// Texts holds the decoded text of each probe, in Probes order; nil
	// where the engine refused the probe (Refused says why).
	Texts   [][]byte
	Refused []string
	// NoBOS: the engine leaves the BOS a template prints out of its text,
	// since its tokenizer adds the token (llama.cpp); Compare leaves it
	// out of kvroute's render too.
	NoBOS bool
	// Path is the engine's path that rendered the probes: RenderPath,
	// TokenizePath or llama.cpp's /apply-template; "" when none could.
	Path string
}

// The paths of a vLLM engine that render chat messages to tokens.
const (
	// RenderPath renders a request as its chat completion would be:
	// for gpt-oss, through openai-harmony.
	RenderPath = "/v1/chat/completions/render"
	// TokenizePath applies the model's chat template, whatever the chat
	// completions path does: for gpt-oss, the Jinja template its chat
	// completions do not use.
	TokenizePath = "/tokenize"
)

// Fetch has the engine at baseURL (http://host:port) render every probe for
// model, and decodes the tokens with v. It asks RenderPath, which renders
// what a chat completion would, and an engine that does not serve it (vLLM
// before it, SGLang) its TokenizePath. A probe the engine answers with a
// client error is refused, not failed: templates may reject tool
// messages. Any other failure is returned, wrapped; ErrUnsupported when
// the engine serves neither.
func Fetch(ctx context.Context, client *http.Client, baseURL, model string, v *vocab.Vocab) (*Rendering, error) {
	path := RenderPath
	r, err := fetch(ctx, model, func(body []byte) ([]byte, string, error) {
		ids, refused, err := tokenize(ctx, client, baseURL+path, body)
		if errors.Is(err, ErrUnsupported) && path == RenderPath {
			path = TokenizePath
			ids, refused, err = tokenize(ctx, client, baseURL+path, body)
		}
		if err != nil || refused != "" {
			return nil, refused, err
		}
		text, _, err := v.Append(nil, v.Start(), ids)
		if err != nil {
			return nil, "", fmt.Errorf("decoding the engine's tokens: %w", err)
		}
		return text, "", nil
	})
	if r != nil {
		r.Path = path
	}
	return r, err
}

// FetchApplied is Fetch for an engine that renders chat prompts to text for
// the asking: llama.cpp's POST /apply-template, which runs the model's
// template through its own Jinja engine and answers with the prompt it
// would tokenize. No vocabulary is involved, so it needs none.
//
// llama.cpp strips the model's BOS from the front of the text, since its
// tokenizer adds it (NoBOS). By default (--prefill-assistant) it also
// leaves a final assistant message open for the model to continue, where
// vLLM closes it; the probe ending with one then differs, as requests
// ending so would.
func FetchApplied(ctx context.Context, client *http.Client, baseURL, model string) (*Rendering, error) {
	r, err := fetch(ctx, model, func(body []byte) ([]byte, string, error) {
		data, refused, err := post(ctx, client, baseURL+"/apply-template", body)
		if err != nil || refused != "" {
			return nil, refused, err
		}
		var out struct {
			Prompt *string `json:"prompt"`
		}
		if err := json.Unmarshal(data, &out); err != nil {
			return nil, "", fmt.Errorf("/apply-template answer: %w", err)
		}
		if out.Prompt == nil {
			return nil, "", ErrUnsupported
		}
		return []byte(*out.Prompt), "", nil
	})
	if r != nil {
		r.NoBOS, r.Path = true, "/apply-template"
	}
	return r, err
}

// fetch renders every probe for model with render, which is handed the
// request body and returns the engine's text or its refusal.
func fetch(ctx context.Context, model string, render func(body []byte) (text []byte, refused string, err error)) (*Rendering, error) {
	r := &Rendering{Model: model, At: time.Now(), Texts: make([][]byte, len(Probes)), Refused: make([]string, len(Probes))}
	modelJSON, _ := json.Marshal(model)
	for i, p := range Probes {
		body := make([]byte, 0, len(p.Body)+len(modelJSON)+16)
		body = append(append(append(body, `{"model":`...), modelJSON...), ',')
		body = append(body, bytes.TrimSpace(p.Body)[1:]...)
		text, refused, err := render(body)
		if err != nil {
			return nil, fmt.Errorf("verify: probe %s: %w", p.Name, err)
		}
		if refused != "" {
			r.Refused[i] = refused
			continue
		}
		r.Texts[i] = text
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if y, m, d := r.At.UTC().Date(); !sameDay(time.Now().UTC(), y, m, d) {
		// Some probes have one date and some the next: no template
		// would agree with all of them.
		return nil, errors.New("verify: the UTC day changed during the check")
	}
	return r, nil
}

func sameDay(t time.Time, y int, m time.Month, d int) bool {
	ty, tm, td := t.Date()
	return ty == y && tm == m && td == d
}

// tokenize posts one probe to a /tokenize or a render endpoint (whose
// answer names the tokens token_ids); refused is the engine's complaint
// about a request it rejected as a client error.
func tokenize(ctx context.Context, client *http.Client, url string, body []byte) (ids []uint32, refused string, err error) {
	data, refused, err := post(ctx, client, url, body)
	if err != nil || refused != "" {
		return nil, refused, err
	}
	var out struct {
		Tokens   []uint32 `json:"tokens"`
		TokenIDs []uint32 `json:"token_ids"`
	}
	if err := json.Unmarshal(data, &out); err != nil {
		return nil, "", fmt.Errorf("%s answer: %w", url, err)
	}
	if len(out.Tokens) == 0 {
		out.Tokens = out.TokenIDs
	}
	if len(out.Tokens) == 0 {
		// llama.cpp answers a /tokenize of messages with no tokens: it
		// tokenizes only "content".
		return nil, "", ErrUnsupported
	}
	return out.Tokens, "", nil
}

// post sends one probe and returns the answer; refused is the engine's
// complaint about a request it rejected as a client error, and
// ErrUnsupported means it serves no such path.
func post(ctx context.Context, client *http.Client, url string, body []byte) (data []byte, refused string, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	path := req.URL.Path
	data, err = io.ReadAll(io.LimitReader(resp.Body, maxResponse+1))
	if err != nil {
		return nil, "", fmt.Errorf("reading %s: %w", path, err)
	}
	switch {
	case resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusMethodNotAllowed:
		return nil, "", ErrUnsupported
	case resp.StatusCode >= 400 && resp.StatusCode < 500:
		return nil, excerpt(data, 0, 120), nil
	case resp.StatusCode != http.StatusOK:
		return nil, "", fmt.Errorf("%s: %s", path, resp.Status)
	case len(data) > maxResponse:
		return nil, "", fmt.Errorf("%s: answer over %d bytes", path, maxResponse)
	}
	return data, "", nil
}

// Agreement is how one template's renders compare with an engine's.
type Agreement struct {
	Template prompt.Template
	// Compared counts the probes both sides rendered; Exact those of them
	// that are byte for byte equal.
	Compared, Exact int
	// For the first probe that differs: its name, the bytes in common
	// before the first difference, and a few bytes of each side from there.
	Probe            string
	Common           int
	Engine, Rendered string
}

// Agrees reports whether every probe both sides rendered is equal, and at
// least one was.
func (a Agreement) Agrees() bool { return a.Compared > 0 && a.Exact == a.Compared }

// Disagrees reports whether some probe both sides rendered differs. An
// engine that refused every probe (one with no chat template, serving
// completions) neither agrees nor disagrees.
func (a Agreement) Disagrees() bool { return a.Exact < a.Compared }

// String describes the agreement for a log line.
func (a Agreement) String() string {
	switch {
	case a.Compared == 0:
		return a.Template.String() + ": no probe rendered by both"
	case a.Agrees():
		return a.Template.String() + ": " + strconv.Itoa(a.Exact) + " probes byte for byte"
	}
	return a.Template.String() + ": " + strconv.Itoa(a.Compared-a.Exact) + " of " + strconv.Itoa(a.Compared) +
		" probes differ; probe " + a.Probe + " after " + strconv.Itoa(a.Common) + " bytes: engine " + a.Engine + ", kvroute " + a.Rendered
}

// Compare renders the probe set under t and compares it with r. A probe
// the engine refused, or the template rejects, is not compared: the filter
// routes such a request by load, which is safe. custom is the template
// prompt.Custom renders with (nil: Custom agrees with nothing).
func Compare(r *Rendering, t prompt.Template, custom *prompt.Jinja) Agreement {
	a := Agreement{Template: t}
	var buf []byte
	rd := prompt.Renderer{Now: func() time.Time { return r.At }, Custom: custom}
	for i, p := range Probes {
		if i >= len(r.Texts) || r.Texts[i] == nil {
			continue
		}
		pr, err := rd.Render(buf[:0], p.Body, t)
		if err != nil {
			continue
		}
		buf = pr.Text
		a.Compared++
		engine, text := r.Texts[i], pr.Text
		if bos := t.BOS(); r.NoBOS && bos != "" && bytes.HasPrefix(text, []byte(bos)) && !bytes.HasPrefix(engine, []byte(bos)) {
			text = text[len(bos):]
		}
		if bytes.Equal(engine, text) {
			a.Exact++
			continue
		}
		if a.Probe == "" {
			n := commonPrefix(engine, text)
			a.Probe, a.Common = p.Name, n
			a.Engine, a.Rendered = excerpt(engine, n, 32), excerpt(text, n, 32)
		}
	}
	return a
}

// Matching returns the named templates whose renders agree with r.
func Matching(r *Rendering) []prompt.Template {
	var out []prompt.Template
	for _, t := range prompt.Templates() {
		if Compare(r, t, nil).Agrees() {
			out = append(out, t)
		}
	}
	return out
}

func commonPrefix(a, b []byte) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

// excerpt quotes up to n bytes of b from off, "<end>" past its end.
func excerpt(b []byte, off, n int) string {
	if off >= len(b) {
		return "<end>"
	}
	s := b[off:min(len(b), off+n)]
	return strconv.Quote(string(s))
}
