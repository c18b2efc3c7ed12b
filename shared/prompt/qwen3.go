package prompt

import "bytes"

// qwen3 renders Qwen3's template (the hybrid thinking models, Qwen3-0.6B to
// Qwen3-235B-A22B): ChatML without a default system prompt; an assistant
// turn after the last real user query keeps its reasoning in a <think>
// block (the final one gets an empty block when it has none), earlier turns
// lose theirs; and chat_template_kwargs.enable_thinking false closes an
// empty think block after the generation prompt.
func (r *Renderer) qwen3(dst []byte) ([]byte, error) {
	msgs := r.msgs
	ntools, err := r.countTools()
	if err != nil {
		return dst, err
	}
	sysFirst := msgs[0].role == roleSystem
	switch {
	case ntools > 0: // {%- if tools %}
		dst = append(dst, "<|im_start|>system\n"...)
		if sysFirst {
			dst = append(r.joined(dst, &msgs[0]), "\n\n"...)
		}
		if dst, err = r.appendQwenTools(dst); err != nil {
			return dst, err
		}
	case sysFirst:
		dst = append(dst, "<|im_start|>system\n"...)
		dst = append(r.joined(dst, &msgs[0]), "<|im_end|>\n"...)
	}
	// ns.last_query_index: the last user message that is not a wrapped
	// tool response.
	lastQuery := len(msgs) - 1
	for i := len(msgs) - 1; i >= 0; i-- {
		if msgs[i].role != roleUser {
			continue
		}
		c := r.joined(r.scratch[:0], &msgs[i])
		r.scratch = c
		if !(bytes.HasPrefix(c, []byte("<tool_response>")) && bytes.HasSuffix(c, []byte("</tool_response>"))) {
			lastQuery = i
			break
		}
	}
	for i := range msgs {
		m := &msgs[i]
		switch {
		case m.role == roleUser || (m.role == roleSystem && i > 0):
			dst = append(dst, "<|im_start|>"...)
			dst = append(r.appendRole(dst, m), '\n')
			dst = append(r.joined(dst, m), "<|im_end|>\n"...)
		case m.role == roleAssistant:
			c := r.joined(r.scratch[:0], m)
			r.scratch = c
			content, reasoning := c, []byte(nil)
			if first := bytes.Index(c, []byte("</think>")); first >= 0 {
				content = bytes.TrimLeft(c[bytes.LastIndex(c, []byte("</think>"))+len("</think>"):], "\n")
				reasoning = bytes.TrimRight(c[:first], "\n")
				if open := bytes.LastIndex(reasoning, []byte("<think>")); open >= 0 {
					reasoning = reasoning[open+len("<think>"):]
				}
				reasoning = bytes.TrimLeft(reasoning, "\n")
			}
			dst = append(dst, "<|im_start|>assistant\n"...)
			if i > lastQuery && (i == len(msgs)-1 || len(reasoning) > 0) {
				dst = append(dst, "<think>\n"...)
				dst = append(dst, bytes.Trim(reasoning, "\n")...)
				dst = append(dst, "\n</think>\n\n"...)
				dst = append(dst, bytes.TrimLeft(content, "\n")...)
			} else {
				dst = append(dst, content...)
			}
			if m.calls.ok {
				hasContent := len(content) > 0
				err = r.eachCall(m, func(j int, c call) error {
					if j > 0 || hasContent {
						dst = append(dst, '\n')
					}
					var err error
					dst, err = r.appendQwenCall(dst, c)
					return err
				})
				if err != nil {
					return dst, err
				}
			}
			dst = append(dst, "<|im_end|>\n"...)
		case m.role == roleTool:
			dst = r.appendQwenToolResponse(dst, i)
		}
		// Any other role (developer, a leading system) renders nothing here.
	}
	if !r.req.noGen {
		dst = append(dst, "<|im_start|>assistant\n"...)
		if r.req.noThinking {
			dst = append(dst, "<think>\n\n</think>\n\n"...)
		}
	}
	return dst, nil
}
