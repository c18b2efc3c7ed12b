package vllmsim

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// maxBody caps request bodies; a 128k-token prompt is well under it.
const maxBody = 64 << 20

func (e *Engine) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", e.handleGenerate)
	mux.HandleFunc("POST /v1/completions", e.handleGenerate)
	mux.HandleFunc("POST /v1/messages", e.handleMessages)
	mux.HandleFunc("POST /v1/responses", e.handleResponses)
	mux.HandleFunc("GET /v1/models", e.handleModels)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {})
	mux.HandleFunc("GET /metrics", e.handleMetrics)
	if !e.cfg.NoTokenize {
		mux.HandleFunc("POST /tokenize", e.handleTokenize)
	}
	if !e.cfg.NoTokenize && !e.cfg.NoRender {
		mux.HandleFunc("POST /v1/completions/render", e.handleRender("/v1/completions"))
		mux.HandleFunc("POST /v1/chat/completions/render", e.handleRender("/v1/chat/completions"))
	}
	mux.HandleFunc("POST /detokenize", e.handleDetokenize)
	mux.HandleFunc("POST /reset_prefix_cache", func(w http.ResponseWriter, r *http.Request) {
		if !e.ResetPrefixCache(r.URL.Query().Get("reset_external") == "true") {
			e.log.Warn("reset_prefix_cache refused: requests hold blocks")
		}
	})
	return mux
}

// apiError is vLLM's ErrorResponse body: {"error": {...}}.
type apiError struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}

func badRequest(format string, args ...any) *apiError {
	return &apiError{Message: fmt.Sprintf(format, args...), Type: "BadRequestError", Code: http.StatusBadRequest}
}

func writeError(w http.ResponseWriter, e *apiError) {
	writeJSON(w, e.Code, map[string]*apiError{"error": e})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

// genRequest is the union of the chat and completions request fields the
// simulator reads; the rest (sampling parameters) do not change timing or
// caching and are accepted and ignored.
type genRequest struct {
	Model                *string         `json:"model"`
	Messages             json.RawMessage `json:"messages"`
	Prompt               json.RawMessage `json:"prompt"`
	MaxTokens            *int            `json:"max_tokens"`
	MaxCompletionTokens  *int            `json:"max_completion_tokens"`
	Stream               *bool           `json:"stream"`
	StreamOptions        *streamOptions  `json:"stream_options"`
	N                    *int            `json:"n"`
	Echo                 bool            `json:"echo"`
	Tools                json.RawMessage `json:"tools"`
	AddGenerationPrompt  *bool           `json:"add_generation_prompt"`
	ContinueFinalMessage bool            `json:"continue_final_message"`
	AddSpecialTokens     *bool           `json:"add_special_tokens"`
	ChatTemplateKwargs   json.RawMessage `json:"chat_template_kwargs"`
	ReasoningEffort      json.RawMessage `json:"reasoning_effort"`
	CacheSalt            *string         `json:"cache_salt"`
	VLLMXargs            map[string]any  `json:"vllm_xargs"` // vLLM's SamplingParams.extra_args
	Tokens               []int           `json:"tokens"`     // /detokenize
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// parsed is a validated generation request.
type parsed struct {
	chat      bool
	model     string // as the client named it
	loraName  string
	loraID    int
	prompts   [][]int
	maxOutput []int
	reason    string // finish reason at maxOutput
	stream    bool
	usage     bool // stream_options.include_usage
	salt      string
	// reportAll: vllm_xargs kv_cache_report_mode "full" asks vLLM 0.33 to
	// announce the prefix-cache blocks a request reuses, not only new ones.
	reportAll bool
	// tokenize: the request is a /tokenize, which applies the chat
	// template even where chat completions do not (gpt-oss).
	tokenize bool
}

// decodeBody reads a JSON request body.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) *apiError {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return &apiError{Message: fmt.Sprintf("request body exceeds %d bytes", maxBody), Type: "BadRequestError", Code: http.StatusRequestEntityTooLarge}
		}
		return badRequest("reading request body: %v", err)
	}
	if err := strictJSON(body, v); err != nil {
		return badRequest("%v", err)
	}
	return nil
}

func strictJSON(body []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(body))
	if err := d.Decode(v); err != nil {
		return fmt.Errorf("invalid JSON body: %w", err)
	}
	if d.More() {
		return errors.New("invalid JSON body: trailing data")
	}
	return nil
}

// parse validates a request body for path as vLLM's OpenAI server would.
func (e *Engine) parse(path string, body []byte) (*parsed, *apiError) {
	var req genRequest
	if err := strictJSON(body, &req); err != nil {
		return nil, badRequest("%v", err)
	}
	return e.validate(path, &req)
}

func (e *Engine) validate(path string, req *genRequest) (*parsed, *apiError) {
	p := &parsed{chat: path == "/v1/chat/completions"}
	if apiErr := e.resolveModel(req.Model, p); apiErr != nil {
		return nil, apiErr
	}
	if req.N != nil && *req.N != 1 {
		return nil, badRequest("n=%d: the simulator generates one choice per prompt", *req.N)
	}
	if req.Echo {
		return nil, badRequest("echo is not supported by the simulator")
	}
	if req.Stream != nil {
		p.stream = *req.Stream
	}
	if req.StreamOptions != nil {
		if !p.stream {
			return nil, badRequest("Stream options can only be defined when `stream=True`.")
		}
		p.usage = req.StreamOptions.IncludeUsage
	}
	if req.CacheSalt != nil {
		if *req.CacheSalt == "" {
			return nil, badRequest("Parameter 'cache_salt' must be a non-empty string if provided.")
		}
		p.salt = *req.CacheSalt
	}
	switch mode := req.VLLMXargs["kv_cache_report_mode"]; mode {
	case nil, "incremental":
	case "full":
		p.reportAll = true
	default:
		return nil, badRequest("kv_cache_report_mode %v: want incremental or full", mode)
	}
	maxTokens := req.MaxTokens
	if req.MaxCompletionTokens != nil {
		maxTokens = req.MaxCompletionTokens
	}
	if maxTokens != nil && *maxTokens < 1 {
		return nil, badRequest("max_tokens must be at least 1, got %d.", *maxTokens)
	}

	var apiErr *apiError
	if p.chat {
		apiErr = e.chatPrompt(req, p)
	} else {
		apiErr = e.completionPrompts(req, p)
	}
	if apiErr != nil {
		return nil, apiErr
	}

	limit := e.cfg.MaxModelLen
	p.reason = "length"
	for _, toks := range p.prompts {
		n := len(toks)
		if n >= limit {
			return nil, badRequest("This model's maximum context length is %d tokens. However, your request has %d input tokens. Please reduce the length of the input messages.", limit, n)
		}
		out := 0
		switch {
		case maxTokens != nil:
			out = *maxTokens
			if n+out > limit {
				return nil, badRequest("This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.", limit, n+out, n, out)
			}
		case p.chat:
			// No max_tokens: the model runs until its end of sequence,
			// which the simulator places after DefaultOutputTokens.
			out = min(e.cfg.DefaultOutputTokens, limit-n)
			p.reason = "stop"
		default:
			out = min(16, limit-n) // the OpenAI completions default
		}
		p.maxOutput = append(p.maxOutput, out)
	}
	return p, nil
}

// resolveModel checks the model name against the served name and the LoRA
// adapters; an absent model means the served one.
func (e *Engine) resolveModel(model *string, p *parsed) *apiError {
	if model == nil || *model == "" || *model == e.cfg.Model {
		p.model = e.cfg.Model
		return nil
	}
	for i, m := range e.cfg.LoRAModules {
		if m.Name == *model {
			p.model, p.loraName, p.loraID = m.Name, m.Name, i+1
			return nil
		}
	}
	return &apiError{Message: fmt.Sprintf("The model `%s` does not exist.", *model), Type: "NotFoundError", Code: http.StatusNotFound}
}

func (e *Engine) chatPrompt(req *genRequest, p *parsed) *apiError {
	tpl := e.tpl.Load()
	if tpl == nil {
		return badRequest("As of transformers v4.44, default chat template is no longer allowed, so you must provide a chat template if the tokenizer does not define one.")
	}
	if len(req.Messages) == 0 {
		return badRequest("Field required: messages")
	}
	if e.harmony() && !p.tokenize {
		text, err := harmonyPrompt(req)
		if err != nil {
			return badRequest("%v", err)
		}
		p.prompts = [][]int{e.tok.encode(text)}
		return nil
	}
	agp := true
	if req.AddGenerationPrompt != nil {
		agp = *req.AddGenerationPrompt
	}
	if agp && req.ContinueFinalMessage {
		return badRequest("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
	}
	text, err := tpl.render(chatRender{
		messages:            req.Messages,
		tools:               req.Tools,
		addGenerationPrompt: agp,
		continueFinal:       req.ContinueFinalMessage,
		kwargs:              req.ChatTemplateKwargs,
	})
	if err != nil {
		return badRequest("%v", err)
	}
	if req.AddSpecialTokens != nil && *req.AddSpecialTokens && tpl.fam.addBOS {
		text = tpl.fam.bos + text
	}
	p.prompts = [][]int{e.tok.encode(text)}
	return nil
}

// completionPrompts accepts what vLLM accepts as "prompt": a string, a list
// of strings, a list of token ids, or a list of lists of token ids.
func (e *Engine) completionPrompts(req *genRequest, p *parsed) *apiError {
	raw := bytes.TrimSpace(req.Prompt)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return badRequest("Field required: prompt")
	}
	bos := ""
	if tpl := e.tpl.Load(); tpl != nil && tpl.fam.addBOS && (req.AddSpecialTokens == nil || *req.AddSpecialTokens) {
		// vLLM tokenizes completion text with add_special_tokens=True.
		bos = tpl.fam.bos
	}
	text := func(s string) *apiError {
		if s == "" {
			return badRequest("Prompt cannot be empty")
		}
		p.prompts = append(p.prompts, e.tok.encode(bos+s))
		return nil
	}
	ids := func(t []int) *apiError {
		if len(t) == 0 {
			return badRequest("Prompt cannot be empty")
		}
		if err := e.tok.validate(t); err != nil {
			return badRequest("%v", err)
		}
		p.prompts = append(p.prompts, t)
		return nil
	}
	var s string
	var ss []string
	var t []int
	var tt [][]int
	switch {
	case json.Unmarshal(raw, &s) == nil:
		return text(s)
	case json.Unmarshal(raw, &t) == nil:
		return ids(t)
	case json.Unmarshal(raw, &ss) == nil && len(ss) > 0:
		for _, s := range ss {
			if err := text(s); err != nil {
				return err
			}
		}
	case json.Unmarshal(raw, &tt) == nil && len(tt) > 0:
		for _, t := range tt {
			if err := ids(t); err != nil {
				return err
			}
		}
	default:
		return badRequest("prompt must be a string, a list of strings, a list of token ids or a list of lists of token ids")
	}
	return nil
}

// newRequest builds the engine request for prompt i of p.
func (e *Engine) newRequest(p *parsed, i int) *request {
	toks := p.prompts[i]
	r := &request{
		tokens:    append(make([]int, 0, len(toks)+p.maxOutput[i]), toks...),
		promptLen: len(toks),
		maxOutput: p.maxOutput[i],
		reason:    p.reason,
		meta:      storeMeta{loraID: p.loraID, loraName: p.loraName, salt: p.salt, reportAll: p.reportAll},
	}
	return r
}

func newID(prefix string) string {
	var b [16]byte
	rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// handleGenerate serves /v1/chat/completions and /v1/completions.
func (e *Engine) handleGenerate(w http.ResponseWriter, hr *http.Request) {
	var req genRequest
	if apiErr := decodeBody(w, hr, &req); apiErr != nil {
		writeError(w, apiErr)
		return
	}
	p, apiErr := e.validate(hr.URL.Path, &req)
	if apiErr != nil {
		writeError(w, apiErr)
		return
	}
	id := newID("cmpl-")
	if p.chat {
		id = newID("chatcmpl-")
	}
	notify := make(chan struct{}, 1)
	rs := make([]*request, len(p.prompts))
	streams := make([]*stream, len(p.prompts))
	for i := range p.prompts {
		rs[i] = e.newRequest(p, i)
		rs[i].id = fmt.Sprintf("%s-%d", id, i)
		streams[i] = &stream{notify: notify, promptN: rs[i].promptLen}
		rs[i].out = streams[i]
	}
	ctx := hr.Context()
	if err := e.enqueue(ctx, rs); err != nil {
		writeError(w, &apiError{Message: err.Error(), Type: "ServiceUnavailableError", Code: http.StatusServiceUnavailable})
		return
	}
	resp := &responder{e: e, w: w, p: p, id: id, created: time.Now().Unix(), streams: streams, notify: notify}
	if p.stream {
		resp.stream(ctx, rs)
	} else {
		resp.whole(ctx, rs)
	}
}

// responder writes one generation response.
type responder struct {
	e       *Engine
	w       http.ResponseWriter
	p       *parsed
	id      string
	created int64
	streams []*stream
	notify  chan struct{}
}

// wait blocks until a stream moves; on a dropped client it aborts the
// requests and returns false.
func (rp *responder) wait(ctx context.Context, rs []*request) bool {
	select {
	case <-rp.notify:
		return true
	case <-ctx.Done():
		for _, r := range rs {
			rp.e.cancel(r)
		}
		return false
	}
}

type usage struct {
	PromptTokens        int           `json:"prompt_tokens"`
	TotalTokens         int           `json:"total_tokens"`
	CompletionTokens    int           `json:"completion_tokens"`
	PromptTokensDetails *tokenDetails `json:"prompt_tokens_details"`
}

type tokenDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

func (rp *responder) usage() *usage {
	var u usage
	cached := 0
	for _, s := range rp.streams {
		toks, _, _, c := s.read(0)
		u.PromptTokens += s.promptN
		u.CompletionTokens += len(toks)
		cached += c
	}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	if rp.e.cfg.EnablePromptTokensDetails {
		u.PromptTokensDetails = &tokenDetails{CachedTokens: cached}
	}
	return &u
}

func (rp *responder) whole(ctx context.Context, rs []*request) {
	for {
		all := true
		for _, s := range rp.streams {
			if _, fin, _, _ := s.read(0); !fin {
				all = false
			}
		}
		if all {
			break
		}
		if !rp.wait(ctx, rs) {
			return
		}
	}
	choices := make([]map[string]any, len(rp.streams))
	for i, s := range rp.streams {
		toks, _, reason, _ := s.read(0)
		if reason == "abort" {
			writeError(rp.w, &apiError{Message: "the engine stopped before the request finished", Type: "InternalServerError", Code: http.StatusInternalServerError})
			return
		}
		text := rp.e.tok.decode(toks)
		if rp.p.chat {
			choices[i] = map[string]any{"index": i, "message": map[string]any{"role": "assistant", "content": text, "tool_calls": []any{}},
				"logprobs": nil, "finish_reason": reason, "stop_reason": nil}
		} else {
			choices[i] = map[string]any{"index": i, "text": text, "logprobs": nil, "finish_reason": reason, "stop_reason": nil}
		}
	}
	object := "text_completion"
	if rp.p.chat {
		object = "chat.completion"
	}
	writeJSON(rp.w, http.StatusOK, map[string]any{
		"id": rp.id, "object": object, "created": rp.created, "model": rp.p.model,
		"choices": choices, "usage": rp.usage(),
	})
}

func (rp *responder) stream(ctx context.Context, rs []*request) {
	h := rp.w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	rp.w.WriteHeader(http.StatusOK)
	flusher, _ := rp.w.(http.Flusher)
	object := "text_completion"
	if rp.p.chat {
		object = "chat.completion.chunk"
	}
	send := func(choices []map[string]any, u *usage) bool {
		chunk := map[string]any{"id": rp.id, "object": object, "created": rp.created, "model": rp.p.model, "choices": choices}
		if u != nil {
			chunk["usage"] = u
		}
		b, _ := json.Marshal(chunk)
		if _, err := fmt.Fprintf(rp.w, "data: %s\n\n", b); err != nil {
			return false
		}
		if flusher != nil {
			flusher.Flush()
		}
		return true
	}
	if rp.p.chat {
		for i := range rp.streams {
			if !send([]map[string]any{{"index": i, "delta": map[string]any{"role": "assistant", "content": ""}, "logprobs": nil, "finish_reason": nil}}, nil) {
				return
			}
		}
	}
	sent := make([]int, len(rp.streams))
	closed := make([]bool, len(rp.streams))
	for open := len(rp.streams); open > 0; {
		for i, s := range rp.streams {
			if closed[i] {
				continue
			}
			toks, fin, reason, _ := s.read(sent[i])
			if len(toks) == 0 && !fin {
				continue
			}
			if fin && reason == "abort" {
				send([]map[string]any{{"index": i, "error": "the engine stopped before the request finished"}}, nil)
				return
			}
			sent[i] += len(toks)
			var fr any
			if fin {
				fr, closed[i] = reason, true
				open--
			}
			text := rp.e.tok.decode(toks)
			choice := map[string]any{"index": i, "logprobs": nil, "finish_reason": fr}
			if rp.p.chat {
				choice["delta"] = map[string]any{"content": text}
			} else {
				choice["text"] = text
				choice["stop_reason"] = nil
			}
			if !send([]map[string]any{choice}, nil) {
				for _, r := range rs {
					rp.e.cancel(r)
				}
				return
			}
		}
		if open > 0 && !rp.wait(ctx, rs) {
			return
		}
	}
	if rp.p.usage {
		send([]map[string]any{}, rp.usage())
	}
	fmt.Fprint(rp.w, "data: [DONE]\n\n")
	if flusher != nil {
		flusher.Flush()
	}
}

func (e *Engine) handleModels(w http.ResponseWriter, r *http.Request) {
	now := time.Now().Unix()
	card := func(id, root string, parent any) map[string]any {
		return map[string]any{"id": id, "object": "model", "created": now, "owned_by": "vllm", "root": root,
			"parent": parent, "max_model_len": e.cfg.MaxModelLen, "permission": []any{}}
	}
	data := []map[string]any{card(e.cfg.Model, e.cfg.Model, nil)}
	for _, m := range e.cfg.LoRAModules {
		data = append(data, card(m.Name, m.Path, e.cfg.Model))
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": data})
}

func (e *Engine) handleMetrics(w http.ResponseWriter, r *http.Request) {
	e.mu.Lock()
	reg := e.metrics.reg
	e.mu.Unlock()
	promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(w, r)
}

// handleTokenize serves vLLM's /tokenize for a prompt or chat messages.
func (e *Engine) handleTokenize(w http.ResponseWriter, hr *http.Request) {
	var req genRequest
	if apiErr := decodeBody(w, hr, &req); apiErr != nil {
		writeError(w, apiErr)
		return
	}
	p := &parsed{chat: len(req.Messages) > 0, tokenize: true}
	if apiErr := e.resolveModel(req.Model, p); apiErr != nil {
		writeError(w, apiErr)
		return
	}
	var apiErr *apiError
	if p.chat {
		apiErr = e.chatPrompt(&req, p)
	} else {
		apiErr = e.completionPrompts(&req, p)
	}
	if apiErr != nil {
		writeError(w, apiErr)
		return
	}
	var toks []int
	for _, t := range p.prompts {
		toks = append(toks, t...)
	}
	writeJSON(w, http.StatusOK, map[string]any{"count": len(toks), "max_model_len": e.cfg.MaxModelLen, "tokens": toks, "token_strs": nil})
}

// generateRequest is the part of vLLM's GenerateRequest (the token-in
// request its render endpoints return) a router reads.
type generateRequest struct {
	RequestID      string         `json:"request_id"`
	TokenIDs       []int          `json:"token_ids"`
	Features       any            `json:"features"`
	SamplingParams map[string]any `json:"sampling_params"`
	Model          string         `json:"model"`
}

// handleRender serves vLLM's render endpoints for path: the request
// validated and rendered as generation would, returned as token ids (one
// GenerateRequest per prompt for completions, one for chat) without running
// it.
func (e *Engine) handleRender(path string) http.HandlerFunc {
	return func(w http.ResponseWriter, hr *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, hr.Body, maxBody))
		if err != nil {
			writeError(w, badRequest("reading request body: %v", err))
			return
		}
		p, apiErr := e.parse(path, body)
		if apiErr != nil {
			writeError(w, apiErr)
			return
		}
		out := make([]generateRequest, len(p.prompts))
		for i, toks := range p.prompts {
			out[i] = generateRequest{RequestID: fmt.Sprintf("render-%d", e.renders.Add(1)), TokenIDs: toks,
				SamplingParams: map[string]any{"max_tokens": p.maxOutput[i]}, Model: p.model}
		}
		if p.chat {
			writeJSON(w, http.StatusOK, out[0])
			return
		}
		writeJSON(w, http.StatusOK, out)
	}
}

// handleDetokenize serves vLLM's /detokenize.
func (e *Engine) handleDetokenize(w http.ResponseWriter, hr *http.Request) {
	var req genRequest
	if apiErr := decodeBody(w, hr, &req); apiErr != nil {
		writeError(w, apiErr)
		return
	}
	if apiErr := e.resolveModel(req.Model, &parsed{}); apiErr != nil {
		writeError(w, apiErr)
		return
	}
	if err := e.tok.validate(req.Tokens); err != nil {
		writeError(w, badRequest("%v", err))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"prompt": e.tok.decode(req.Tokens)})
}
