package vllmsim

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
)

// The Anthropic Messages and OpenAI Responses APIs, served as vLLM serves
// them: each request is converted into a chat completions request, which
// is validated, rendered and run like any other. The conversions are
// written from vLLM's own (vllm/entrypoints/anthropic/serving.py and
// vllm/entrypoints/openai/responses/utils.py), over decoded JSON the way
// the Python does, independently of the filter's streaming converter
// (shared/prompt), so that a difference between the two shows as a lost
// prefix-cache hit.

type anthropicBlock struct {
	Type      string          `json:"type"`
	Text      *string         `json:"text"`
	Source    map[string]any  `json:"source"`
	ID        *string         `json:"id"`
	ToolUseID *string         `json:"tool_use_id"`
	Name      *string         `json:"name"`
	Input     json.RawMessage `json:"input"`
	Content   json.RawMessage `json:"content"`
	Thinking  *string         `json:"thinking"`
}

type anthropicMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

type anthropicTool struct {
	Name         string          `json:"name"`
	Description  *string         `json:"description"`
	InputSchema  json.RawMessage `json:"input_schema"`
	DeferLoading *bool           `json:"defer_loading"`
}

type messagesRequest struct {
	Model              *string            `json:"model"`
	Messages           []anthropicMessage `json:"messages"`
	MaxTokens          *int               `json:"max_tokens"`
	System             json.RawMessage    `json:"system"`
	Tools              []anthropicTool    `json:"tools"`
	Stream             *bool              `json:"stream"`
	ChatTemplateKwargs json.RawMessage    `json:"chat_template_kwargs"`
}

// chatMessage is a chat message as the conversions build it; key order
// does not matter to templates, and raw values keep their own.
type chatMessage map[string]any

func isNull(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) == 0 || string(t) == "null"
}

// imageURL is vLLM's _convert_image_source_to_url.
func imageURL(source map[string]any) string {
	if source["type"] == "url" {
		if u, ok := source["url"].(string); ok {
			return u
		}
		return ""
	}
	media, ok := source["media_type"]
	if !ok {
		media = "image/jpeg"
	}
	data, ok := source["data"]
	if !ok {
		data = ""
	}
	return fmt.Sprintf("data:%s;base64,%s", pyStr(media), pyStr(data))
}

// pyStr is an f-string's rendering of a JSON scalar.
func pyStr(v any) string {
	switch v := v.(type) {
	case nil:
		return "None"
	case string:
		return v
	}
	return fmt.Sprint(v)
}

func textBlocks(raw json.RawMessage) ([]string, error) {
	var blocks []anthropicBlock
	if err := json.Unmarshal(raw, &blocks); err != nil {
		return nil, err
	}
	var out []string
	for _, b := range blocks {
		if b.Type == "text" && b.Text != nil && *b.Text != "" && !strings.HasPrefix(*b.Text, "x-anthropic-billing-header") {
			out = append(out, *b.Text)
		}
	}
	return out, nil
}

// fromMessages converts an Anthropic Messages request to a chat request.
func (e *Engine) fromMessages(req *messagesRequest) (*genRequest, *apiError) {
	if len(req.Messages) == 0 {
		return nil, badRequest("messages must contain at least one item")
	}
	var msgs []chatMessage
	var system []string
	var sys string
	switch {
	case isNull(req.System):
	case json.Unmarshal(req.System, &sys) == nil:
		if sys != "" {
			system = append(system, sys)
		}
	default:
		parts, err := textBlocks(req.System)
		if err != nil {
			return nil, badRequest("system: %v", err)
		}
		system = append(system, parts...)
	}
	roles := map[string]string{"user": "user", "assistant": "assistant", "system": "system", "ctx": "user", "msg": "user"}
	for i := range req.Messages {
		m := &req.Messages[i]
		role, ok := roles[m.Role]
		if !ok {
			return nil, badRequest("messages.%d.role: Input should be 'user', 'assistant' or 'system'", i)
		}
		m.Role = role
		if role != "system" {
			continue
		}
		var s string
		if json.Unmarshal(m.Content, &s) == nil {
			system = append(system, s)
			continue
		}
		parts, err := textBlocks(m.Content)
		if err != nil {
			return nil, badRequest("messages.%d.content: %v", i, err)
		}
		system = append(system, parts...)
	}
	if len(system) > 0 {
		msgs = append(msgs, chatMessage{"role": "system", "content": strings.Join(system, "")})
	}
	for i, m := range req.Messages {
		if m.Role == "system" {
			continue
		}
		out := chatMessage{"role": m.Role}
		var s string
		if json.Unmarshal(m.Content, &s) == nil {
			out["content"] = s
			msgs = append(msgs, out)
			continue
		}
		var blocks []anthropicBlock
		if err := json.Unmarshal(m.Content, &blocks); err != nil {
			return nil, badRequest("messages.%d.content: %v", i, err)
		}
		if len(blocks) == 0 {
			return nil, badRequest("message content must not be empty")
		}
		var parts, calls []any
		reasoning := ""
		hasReasoning := false
		for _, b := range blocks {
			switch b.Type {
			case "text":
				if b.Text != nil && *b.Text != "" {
					parts = append(parts, map[string]any{"type": "text", "text": *b.Text})
				}
			case "image":
				if len(b.Source) > 0 {
					parts = append(parts, map[string]any{"type": "image_url", "image_url": map[string]any{"url": imageURL(b.Source)}})
				}
			case "thinking":
				if b.Thinking != nil {
					reasoning += *b.Thinking
					hasReasoning = true
				}
			case "tool_use":
				id := fmt.Sprintf("call_%d", time.Now().Unix())
				if b.ID != nil && *b.ID != "" {
					id = *b.ID
				}
				name := ""
				if b.Name != nil {
					name = *b.Name
				}
				args := "{}"
				if !isNull(b.Input) && string(bytes.TrimSpace(b.Input)) != "{}" {
					args = string(b.Input)
				}
				calls = append(calls, map[string]any{"id": id, "type": "function", "function": map[string]any{"name": name, "arguments": args}})
			case "tool_result":
				if m.Role == "user" {
					extra, err := toolResultMessages(&b)
					if err != nil {
						return nil, badRequest("messages.%d: %v", i, err)
					}
					msgs = append(msgs, extra...)
					continue
				}
				text := ""
				if !isNull(b.Content) {
					if json.Unmarshal(b.Content, &text) != nil {
						return nil, badRequest("the simulator prints no Python repr of a list tool result")
					}
				}
				parts = append(parts, map[string]any{"type": "text", "text": "Tool result: " + text})
			case "redacted_thinking", "tool_reference":
			default:
				return nil, badRequest("messages.%d: unknown content block type %q", i, b.Type)
			}
		}
		if hasReasoning {
			out["reasoning"] = reasoning
		}
		if len(calls) > 0 {
			out["tool_calls"] = calls
		}
		switch {
		case len(parts) == 1 && parts[0].(map[string]any)["type"] == "text":
			out["content"] = parts[0].(map[string]any)["text"]
		case len(parts) > 0:
			out["content"] = parts
		}
		if _, has := out["content"]; m.Role == "user" && !has {
			continue
		}
		msgs = append(msgs, out)
	}
	chat := &genRequest{Model: req.Model, MaxTokens: req.MaxTokens, ChatTemplateKwargs: req.ChatTemplateKwargs}
	var err error
	if chat.Messages, err = json.Marshal(msgs); err != nil {
		return nil, badRequest("%v", err)
	}
	if req.Tools != nil {
		tools := make([]any, 0, len(req.Tools))
		for _, t := range req.Tools {
			var schema map[string]json.RawMessage
			if err := json.Unmarshal(t.InputSchema, &schema); err != nil {
				return nil, badRequest("input_schema must be a dictionary")
			}
			params := t.InputSchema
			if _, ok := schema["type"]; !ok {
				// pydantic's validator sets the key, last in the dict.
				open := bytes.TrimSpace(params)
				open = bytes.TrimSpace(open[:len(open)-1]) // the closing brace
				sep := ","
				if len(schema) == 0 {
					sep = ""
				}
				params = json.RawMessage(string(open) + sep + `"type":"object"}`)
			}
			tools = append(tools, map[string]any{"type": "function", "function": map[string]any{
				"name": t.Name, "description": t.Description, "parameters": params, "defer_loading": t.DeferLoading}})
		}
		if chat.Tools, err = json.Marshal(tools); err != nil {
			return nil, badRequest("%v", err)
		}
	}
	return chat, nil
}

// toolResultMessages is vLLM's _convert_user_tool_result.
func toolResultMessages(b *anthropicBlock) ([]chatMessage, error) {
	text := ""
	var images []any
	if !isNull(b.Content) {
		var s string
		var items []map[string]any
		switch {
		case json.Unmarshal(b.Content, &s) == nil:
			text = s
		case json.Unmarshal(b.Content, &items) == nil:
			var texts []string
			for _, it := range items {
				switch it["type"] {
				case "text":
					t, _ := it["text"].(string)
					texts = append(texts, t)
				case "image":
					src, _ := it["source"].(map[string]any)
					if u := imageURL(src); u != "" {
						images = append(images, map[string]any{"type": "image_url", "image_url": map[string]any{"url": u}})
					}
				case "tool_reference":
					return nil, fmt.Errorf("the simulator renders no tool references")
				}
			}
			text = strings.Join(texts, "\n")
		default:
			return nil, fmt.Errorf("tool_result content is neither a string nor a list")
		}
	}
	id := ""
	if b.ToolUseID != nil {
		id = *b.ToolUseID
	}
	out := []chatMessage{{"role": "tool", "tool_call_id": id, "content": text}}
	if len(images) > 0 {
		out = append(out, chatMessage{"role": "user", "content": images})
	}
	return out, nil
}

type responsesRequest struct {
	Model              *string           `json:"model"`
	Input              json.RawMessage   `json:"input"`
	Instructions       *string           `json:"instructions"`
	MaxOutputTokens    *int              `json:"max_output_tokens"`
	Tools              []json.RawMessage `json:"tools"`
	PreviousResponseID *string           `json:"previous_response_id"`
	Stream             *bool             `json:"stream"`
}

// storedResponse is what a later request's previous_response_id brings
// back: the messages the response was generated from and its output.
type storedResponse struct {
	messages []any
	output   string
}

// responseStore keeps responses in the engine's memory, as vLLM's does:
// another engine knows none of them.
type responseStore struct {
	mu   sync.Mutex
	byID map[string]storedResponse
}

func (s *responseStore) get(id string) (storedResponse, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.byID[id]
	return r, ok
}

func (s *responseStore) put(id string, r storedResponse) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.byID == nil {
		s.byID = map[string]storedResponse{}
	}
	s.byID[id] = r
}

// fromResponses converts a Responses request to a chat request: vLLM's
// construct_input_messages over the stored previous response.
func (e *Engine) fromResponses(req *responsesRequest) (*genRequest, []any, *apiError) {
	var msgs []any
	if req.Instructions != nil && *req.Instructions != "" {
		msgs = append(msgs, chatMessage{"role": "system", "content": *req.Instructions})
	}
	if req.PreviousResponseID != nil {
		prev, ok := e.responses.get(*req.PreviousResponseID)
		if !ok {
			return nil, nil, &apiError{Message: fmt.Sprintf("Response with id '%s' not found.", *req.PreviousResponseID), Type: "invalid_request_error", Code: http.StatusNotFound}
		}
		for _, m := range prev.messages {
			if cm, ok := m.(chatMessage); ok && cm["role"] == "system" {
				continue
			}
			if raw, ok := m.(json.RawMessage); ok {
				var probe struct{ Role string }
				if json.Unmarshal(raw, &probe) == nil && probe.Role == "system" {
					continue
				}
			}
			msgs = append(msgs, m)
		}
		msgs = append(msgs, chatMessage{"role": "assistant", "content": prev.output})
	}
	var s string
	var items []json.RawMessage
	switch {
	case isNull(req.Input):
		return nil, nil, badRequest("Field required: input")
	case json.Unmarshal(req.Input, &s) == nil:
		msgs = append(msgs, chatMessage{"role": "user", "content": s})
	case json.Unmarshal(req.Input, &items) == nil:
		for i, raw := range items {
			var it struct {
				Type      string          `json:"type"`
				Role      string          `json:"role"`
				Content   json.RawMessage `json:"content"`
				CallID    string          `json:"call_id"`
				Name      string          `json:"name"`
				Arguments string          `json:"arguments"`
				Output    json.RawMessage `json:"output"`
			}
			if err := json.Unmarshal(raw, &it); err != nil {
				return nil, nil, badRequest("input.%d: %v", i, err)
			}
			var last chatMessage
			if n := len(msgs); n > 0 {
				if cm, ok := msgs[n-1].(chatMessage); ok && cm["role"] == "assistant" {
					last = cm
				}
			}
			switch {
			case it.Type == "function_call":
				call := map[string]any{"id": it.CallID, "function": map[string]any{"name": it.Name, "arguments": it.Arguments}, "type": "function"}
				if last != nil {
					calls, _ := last["tool_calls"].([]any)
					last["tool_calls"] = append(calls, call)
					continue
				}
				msgs = append(msgs, chatMessage{"role": "assistant", "tool_calls": []any{call}})
			case it.Type == "function_call_output":
				msgs = append(msgs, chatMessage{"role": "tool", "content": it.Output, "tool_call_id": it.CallID})
			case it.Type == "reasoning":
				if last != nil {
					if _, has := last["reasoning"]; !has {
						last["reasoning"] = ""
						continue
					}
				}
				msgs = append(msgs, chatMessage{"role": "assistant", "reasoning": ""})
			case it.Role == "assistant":
				text := ""
				var parts []map[string]any
				switch {
				case json.Unmarshal(it.Content, &text) == nil:
				case json.Unmarshal(it.Content, &parts) == nil && len(parts) > 0:
					text, _ = parts[0]["text"].(string)
				}
				if last != nil {
					if c, has := last["content"]; !has || c == nil {
						last["content"] = text
						continue
					}
				}
				msgs = append(msgs, chatMessage{"role": "assistant", "content": text})
			case it.Role != "":
				msgs = append(msgs, raw)
			default:
				return nil, nil, badRequest("input.%d: the simulator does not serve item type %q", i, it.Type)
			}
		}
	default:
		return nil, nil, badRequest("input must be a string or a list of items")
	}
	chat := &genRequest{Model: req.Model, MaxTokens: req.MaxOutputTokens}
	var err error
	if chat.Messages, err = json.Marshal(msgs); err != nil {
		return nil, nil, badRequest("%v", err)
	}
	var tools []any
	for _, raw := range req.Tools {
		var t map[string]json.RawMessage
		if err := json.Unmarshal(raw, &t); err != nil {
			return nil, nil, badRequest("tools: %v", err)
		}
		if string(t["type"]) != `"function"` {
			continue // built-in tools are not rendered
		}
		fn := orderedRaw(raw, "type")
		tools = append(tools, map[string]any{"type": "function", "function": fn})
	}
	if tools != nil {
		if chat.Tools, err = json.Marshal(tools); err != nil {
			return nil, nil, badRequest("%v", err)
		}
	}
	return chat, msgs, nil
}

// orderedRaw re-encodes the object raw without the key drop, keeping the
// order of the rest.
func orderedRaw(raw json.RawMessage, drop string) json.RawMessage {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.Token() // {
	var b bytes.Buffer
	b.WriteByte('{')
	n := 0
	for d.More() {
		k, _ := d.Token()
		var v json.RawMessage
		d.Decode(&v)
		if k == drop {
			continue
		}
		if n > 0 {
			b.WriteByte(',')
		}
		n++
		key, _ := json.Marshal(k)
		b.Write(key)
		b.WriteByte(':')
		b.Write(v)
	}
	b.WriteByte('}')
	return b.Bytes()
}

// runOne runs a validated one-prompt request, calling delta with each
// piece of text as it is generated; it returns the finish reason and the
// prompt and output token counts, or ok false when the client left or the
// engine stopped.
func (e *Engine) runOne(ctx context.Context, p *parsed, id string, delta func(text string) bool) (reason string, promptN, outN int, apiErr *apiError) {
	notify := make(chan struct{}, 1)
	r := e.newRequest(p, 0)
	r.id = id
	s := &stream{notify: notify, promptN: r.promptLen}
	r.out = s
	if err := e.enqueue(ctx, []*request{r}); err != nil {
		return "", 0, 0, &apiError{Message: err.Error(), Type: "ServiceUnavailableError", Code: http.StatusServiceUnavailable}
	}
	sent := 0
	for {
		toks, fin, why, _ := s.read(sent)
		if len(toks) > 0 {
			sent += len(toks)
			if !delta(e.tok.decode(toks)) {
				e.cancel(r)
				return "", 0, 0, nil
			}
		}
		if fin {
			if why == "abort" {
				return "", 0, 0, &apiError{Message: "the engine stopped before the request finished", Type: "InternalServerError", Code: http.StatusInternalServerError}
			}
			return why, s.promptN, sent, nil
		}
		select {
		case <-notify:
		case <-ctx.Done():
			e.cancel(r)
			return "", 0, 0, nil
		}
	}
}

// writeEvent writes one server-sent event.
func writeEvent(w http.ResponseWriter, event string, v any) bool {
	b, _ := json.Marshal(v)
	if _, err := fmt.Fprintf(w, "event: %s\ndata: %s\n\n", event, b); err != nil {
		return false
	}
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
	return true
}

func readBody(w http.ResponseWriter, hr *http.Request, v any) *apiError {
	body, err := io.ReadAll(http.MaxBytesReader(w, hr.Body, maxBody))
	if err != nil {
		return badRequest("reading request body: %v", err)
	}
	if err := strictJSON(body, v); err != nil {
		return badRequest("%v", err)
	}
	return nil
}

// handleMessages serves POST /v1/messages.
func (e *Engine) handleMessages(w http.ResponseWriter, hr *http.Request) {
	var req messagesRequest
	if apiErr := readBody(w, hr, &req); apiErr != nil {
		writeError(w, apiErr)
		return
	}
	if req.MaxTokens == nil {
		writeError(w, badRequest("Field required: max_tokens"))
		return
	}
	chat, apiErr := e.fromMessages(&req)
	if apiErr == nil {
		var p *parsed
		if p, apiErr = e.validate("/v1/chat/completions", chat); apiErr == nil {
			e.serveMessages(w, hr, p, req.Stream != nil && *req.Stream)
			return
		}
	}
	writeError(w, apiErr)
}

func (e *Engine) serveMessages(w http.ResponseWriter, hr *http.Request, p *parsed, stream bool) {
	id := newID("chatcmpl-")
	stop := map[string]string{"stop": "end_turn", "length": "max_tokens"}
	if !stream {
		var text strings.Builder
		reason, in, out, apiErr := e.runOne(hr.Context(), p, id, func(s string) bool { text.WriteString(s); return true })
		if apiErr != nil {
			writeError(w, apiErr)
			return
		}
		if reason == "" {
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"id": id, "type": "message", "role": "assistant",
			"content": []any{map[string]any{"type": "text", "text": text.String()}}, "model": p.model,
			"stop_reason": stop[reason], "stop_sequence": nil, "usage": map[string]int{"input_tokens": in, "output_tokens": out}})
		return
	}
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	started := false
	reason, in, out, _ := e.runOne(hr.Context(), p, id, func(s string) bool {
		if !started {
			started = true
			if !writeEvent(w, "message_start", map[string]any{"type": "message_start", "message": map[string]any{"id": id, "type": "message",
				"role": "assistant", "content": []any{}, "model": p.model, "usage": map[string]int{"input_tokens": len(p.prompts[0]), "output_tokens": 0}}}) ||
				!writeEvent(w, "content_block_start", map[string]any{"type": "content_block_start", "index": 0, "content_block": map[string]any{"type": "text", "text": ""}}) {
				return false
			}
		}
		return writeEvent(w, "content_block_delta", map[string]any{"type": "content_block_delta", "index": 0, "delta": map[string]any{"type": "text_delta", "text": s}})
	})
	if reason == "" {
		return
	}
	writeEvent(w, "content_block_stop", map[string]any{"type": "content_block_stop", "index": 0})
	writeEvent(w, "message_delta", map[string]any{"type": "message_delta", "delta": map[string]any{"stop_reason": stop[reason]},
		"usage": map[string]int{"input_tokens": in, "output_tokens": out}})
	writeEvent(w, "message_stop", map[string]any{"type": "message_stop"})
}

// responseBody is a Responses API response; its id comes first, as in
// vLLM's (and OpenAI's) JSON.
type responseBody struct {
	ID        string `json:"id"`
	Object    string `json:"object"`
	CreatedAt int64  `json:"created_at"`
	Model     string `json:"model"`
	Output    []any  `json:"output"`
	Status    string `json:"status"`
	Usage     any    `json:"usage"`
}

// handleResponses serves POST /v1/responses.
func (e *Engine) handleResponses(w http.ResponseWriter, hr *http.Request) {
	var req responsesRequest
	if apiErr := readBody(w, hr, &req); apiErr != nil {
		writeError(w, apiErr)
		return
	}
	chat, msgs, apiErr := e.fromResponses(&req)
	var p *parsed
	if apiErr == nil {
		p, apiErr = e.validate("/v1/chat/completions", chat)
	}
	if apiErr != nil {
		writeError(w, apiErr)
		return
	}
	resp := responseBody{ID: newID("resp_"), Object: "response", CreatedAt: time.Now().Unix(), Model: p.model, Output: []any{}, Status: "in_progress"}
	msgID := newID("msg_")
	stream := req.Stream != nil && *req.Stream
	seq := 0
	event := func(typ string, fields map[string]any) bool {
		fields["type"], fields["sequence_number"] = typ, seq
		seq++
		return writeEvent(w, typ, fields)
	}
	if stream {
		w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
		w.WriteHeader(http.StatusOK)
		if !event("response.created", map[string]any{"response": resp}) {
			return
		}
	}
	var text strings.Builder
	reason, in, out, apiErr := e.runOne(hr.Context(), p, resp.ID, func(s string) bool {
		text.WriteString(s)
		return !stream || event("response.output_text.delta", map[string]any{"item_id": msgID, "output_index": 0, "content_index": 0, "delta": s})
	})
	if apiErr != nil && !stream {
		writeError(w, apiErr)
		return
	}
	if reason == "" {
		return
	}
	e.responses.put(resp.ID, storedResponse{messages: msgs, output: text.String()})
	resp.Status = "completed"
	if reason == "length" {
		resp.Status = "incomplete"
	}
	resp.Output = []any{map[string]any{"id": msgID, "type": "message", "role": "assistant", "status": "completed",
		"content": []any{map[string]any{"type": "output_text", "text": text.String(), "annotations": []any{}}}}}
	resp.Usage = map[string]int{"input_tokens": in, "output_tokens": out, "total_tokens": in + out}
	if stream {
		event("response.completed", map[string]any{"response": resp})
		return
	}
	writeJSON(w, http.StatusOK, resp)
}
