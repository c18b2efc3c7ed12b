package prompt

import (
	"strconv"
	"time"
	"unicode/utf8"
)

// This file holds one renderer per template family. Each follows its
// template in e2e/vllmsim/templates statement by statement; the comments
// quote the template where the behaviour is not obvious.

// joined appends m's content as vLLM hands it to a template that expects a
// string: the parts' texts (and media markers) joined with "\n".
func (r *Renderer) joined(dst []byte, m *message) []byte {
	switch m.kind {
	case contentString:
		return r.s.appendStr(dst, m.text)
	case contentParts:
		for i := m.p0; i < m.p1; i++ {
			if i > m.p0 {
				dst = append(dst, '\n')
			}
			dst = r.appendPart(dst, &r.parts[i])
		}
	}
	return dst
}

func (r *Renderer) appendPart(dst []byte, p *part) []byte {
	if p.media {
		return appendMarker(dst, p.digest)
	}
	return r.s.appendStr(dst, p.text)
}

// appendMarker appends the text that stands for a media part.
func appendMarker(dst []byte, digest uint64) []byte {
	const hexdigits = "0123456789abcdef"
	dst = append(dst, "<|media:"...)
	for shift := 60; shift >= 0; shift -= 4 {
		dst = append(dst, hexdigits[digest>>uint(shift)&15])
	}
	return append(dst, "|>"...)
}

// trimmed appends m's joined content with Jinja's trim, Python's str.strip.
func (r *Renderer) trimmed(dst []byte, m *message) []byte {
	start := len(dst)
	return trimFrom(r.joined(dst, m), start)
}

// trimFrom strips Python whitespace from both ends of dst[start:].
func trimFrom(dst []byte, start int) []byte {
	end := len(dst)
	for end > start {
		c, n := utf8.DecodeLastRune(dst[start:end])
		if !isPySpace(c) {
			break
		}
		end -= n
	}
	i := start
	for i < end {
		c, n := utf8.DecodeRune(dst[i:end])
		if !isPySpace(c) {
			break
		}
		i += n
	}
	if i > start {
		copy(dst[start:], dst[i:end])
	}
	return dst[:start+end-i]
}

// isPySpace reports whether Python's str.isspace holds for c.
func isPySpace(c rune) bool {
	switch {
	case c <= ' ':
		return c == ' ' || ('\t' <= c && c <= '\r') || (0x1c <= c && c <= 0x1f)
	case c < 0x85:
		return false
	}
	switch c {
	case 0x85, 0xa0, 0x1680, 0x2028, 0x2029, 0x202f, 0x205f, 0x3000:
		return true
	}
	return 0x2000 <= c && c <= 0x200a
}

func (r *Renderer) appendRole(dst []byte, m *message) []byte {
	return r.s.appendStr(dst, m.roleName)
}

// qwenSystem is Qwen2.5's default system prompt.
const qwenSystem = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."

// chatml renders Qwen2.5-Instruct's template.
func (r *Renderer) chatml(dst []byte) ([]byte, error) {
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
			dst = r.joined(dst, &msgs[0])
		} else {
			dst = append(dst, qwenSystem...)
		}
		if dst, err = r.appendQwenTools(append(dst, "\n\n"...)); err != nil {
			return dst, err
		}
	case sysFirst:
		dst = append(dst, "<|im_start|>system\n"...)
		dst = append(r.joined(dst, &msgs[0]), "<|im_end|>\n"...)
	default:
		dst = append(dst, "<|im_start|>system\n"+qwenSystem+"<|im_end|>\n"...)
	}
	for i := range msgs {
		m := &msgs[i]
		ncalls, err := r.countCalls(m)
		if err != nil {
			return dst, err
		}
		switch {
		case m.role == roleUser || (m.role == roleSystem && i > 0) || (m.role == roleAssistant && ncalls == 0):
			dst = append(dst, "<|im_start|>"...)
			dst = append(r.appendRole(dst, m), '\n')
			dst = append(r.joined(dst, m), "<|im_end|>\n"...)
		case m.role == roleAssistant:
			dst = append(dst, "<|im_start|>assistant"...)
			mark := len(dst)
			if dst = r.joined(append(dst, '\n'), m); len(dst) == mark+1 {
				dst = dst[:mark] // {%- if message.content %}
			}
			err = r.eachCall(m, func(_ int, c call) error {
				var err error
				dst, err = r.appendQwenCall(append(dst, '\n'), c)
				return err
			})
			if err != nil {
				return dst, err
			}
			dst = append(dst, "<|im_end|>\n"...)
		case m.role == roleTool:
			dst = r.appendQwenToolResponse(dst, i)
		}
		// Any other role (developer, a leading system) renders nothing here.
	}
	if !r.req.noGen {
		dst = append(dst, "<|im_start|>assistant\n"...)
	}
	return dst, nil
}

// appendQwenCall appends a tool call as the Qwen templates print it.
func (r *Renderer) appendQwenCall(dst []byte, c call) ([]byte, error) {
	dst = append(dst, "<tool_call>\n{\"name\": \""...)
	dst = append(r.s.appendStr(dst, c.name), "\", \"arguments\": "...)
	dst, err := r.appendArgs(dst, c.args)
	return append(dst, "}\n</tool_call>"...), err
}

// appendQwenToolResponse appends tool message i as the Qwen templates
// print it: a run of tool messages shares one user turn.
func (r *Renderer) appendQwenToolResponse(dst []byte, i int) []byte {
	msgs := r.msgs
	if i == 0 || msgs[i-1].role != roleTool {
		dst = append(dst, "<|im_start|>user"...)
	}
	dst = append(dst, "\n<tool_response>\n"...)
	dst = append(r.joined(dst, &msgs[i]), "\n</tool_response>"...)
	if i == len(msgs)-1 || msgs[i+1].role != roleTool {
		dst = append(dst, "<|im_end|>\n"...)
	}
	return dst
}

// appendQwenTools appends the Qwen templates' tool list, from "# Tools" to
// the end of the system turn.
func (r *Renderer) appendQwenTools(dst []byte) ([]byte, error) {
	dst = append(dst, "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>"...)
	err := r.eachTool(func(_ int, tool raw) error {
		dst = append(dst, '\n')
		var err error
		dst, err = r.appendTool(dst, tool, 0)
		return err
	})
	if err != nil {
		return dst, err
	}
	return append(dst, "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n"...), nil
}

// llama3 renders the Llama 3.1/3.3 Instruct template, with its defaults:
// tools in the first user message and "Today Date: 26 Jul 2024"; with
// today, the Llama 3.2 template, which prints strftime_now("%d %b %Y")
// there instead; either prints chat_template_kwargs.date_string when given.
func (r *Renderer) llama3(dst []byte, today bool) ([]byte, error) {
	msgs := r.msgs
	dst = append(dst, "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"...)
	if r.toolsSet() {
		dst = append(dst, "Environment: ipython\n"...)
	}
	dst = append(dst, "Cutting Knowledge Date: December 2023\nToday Date: "...)
	switch {
	case r.req.dateSet && r.req.dateBad:
		// "Today Date: " + date_string with a non-string: a TypeError.
		return dst, rejected("chat_template_kwargs.date_string is not a string")
	case r.req.dateSet:
		dst = r.s.appendStr(dst, r.req.date)
	case today:
		dst = appendDate(dst, r.now())
	default:
		dst = append(dst, "26 Jul 2024"...)
	}
	dst = append(dst, "\n\n"...)
	if msgs[0].role == roleSystem {
		dst = r.trimmed(dst, &msgs[0])
		msgs = msgs[1:]
	}
	dst = append(dst, "<|eot_id|>"...)
	if r.toolsSet() {
		if len(msgs) == 0 {
			return dst, rejected("Cannot put tools in the first user message when there's no first user message!")
		}
		dst = append(dst, "<|start_header_id|>user<|end_header_id|>\n\n"+
			"Given the following functions, please respond with a JSON for a function call "+
			"with its proper arguments that best answers the given prompt.\n\n"+
			`Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.`+
			"Do not use variables.\n\n"...)
		err := r.eachTool(func(_ int, tool raw) error {
			var err error
			dst, err = r.appendTool(dst, tool, 4)
			dst = append(dst, "\n\n"...)
			return err
		})
		if err != nil {
			return dst, err
		}
		dst = append(r.trimmed(dst, &msgs[0]), "<|eot_id|>"...)
		msgs = msgs[1:]
	}
	for i := range msgs {
		m := &msgs[i]
		isTool := m.role == roleTool || r.s.equalStr(m.roleName, "ipython")
		switch {
		case m.role == roleAssistant && m.calls.ok: // {%- elif 'tool_calls' in message %}
			n, err := r.countCalls(m)
			if err != nil {
				return dst, err
			}
			if n != 1 {
				return dst, rejected("This model only supports single tool-calls at once!")
			}
			err = r.eachCall(m, func(_ int, c call) error {
				dst = append(dst, "<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \""...)
				dst = append(r.s.appendStr(dst, c.name), "\", \"parameters\": "...)
				var err error
				dst, err = r.appendArgs(dst, c.args)
				dst = append(dst, "}<|eot_id|>"...)
				return err
			})
			if err != nil {
				return dst, err
			}
		case isTool:
			// message.content is a string, and strings are iterable, so the
			// template prints it through tojson: quoted.
			dst = append(dst, "<|start_header_id|>ipython<|end_header_id|>\n\n"...)
			r.tmp = r.joined(r.tmp[:0], m)
			dst = append(appendPyQuoted(dst, r.tmp), "<|eot_id|>"...)
		default:
			dst = append(dst, "<|start_header_id|>"...)
			dst = append(r.appendRole(dst, m), "<|end_header_id|>\n\n"...)
			dst = append(r.trimmed(dst, m), "<|eot_id|>"...)
		}
	}
	if !r.req.noGen {
		dst = append(dst, "<|start_header_id|>assistant<|end_header_id|>\n\n"...)
	}
	return dst, nil
}

// appendPyQuoted appends json.dumps(s, ensure_ascii=False) of decoded text.
func appendPyQuoted(dst, s []byte) []byte {
	dst = append(dst, '"')
	for len(s) > 0 {
		i := 0
		for i < len(s) && s[i] >= 0x20 && s[i] != '"' && s[i] != '\\' {
			i++
		}
		dst = append(dst, s[:i]...)
		if i == len(s) {
			break
		}
		dst = appendPyRune(dst, rune(s[i]))
		s = s[i+1:]
	}
	return append(dst, '"')
}

// mistral renders Mistral-Nemo-Instruct-2407's template, which has no
// generation prompt: a conversation ends with [/INST].
func (r *Renderer) mistral(dst []byte) ([]byte, error) {
	var system *message
	loop := r.msgs
	if loop[0].role == roleSystem {
		system, loop = &loop[0], loop[1:]
	}
	lastUser, index := -1, 0
	for i := range loop {
		m := &loop[i]
		if m.role == roleUser {
			lastUser = i
		}
		if m.role == roleTool || r.s.equalStr(m.roleName, "tool_results") || (m.role == roleAssistant && m.calls.ok) {
			continue
		}
		if (m.role == roleUser) != (index%2 == 0) {
			return dst, rejected("After the optional system message, conversation roles must alternate user/assistant/user/assistant/...")
		}
		index++
	}
	dst = append(dst, "<s>"...)
	for i := range loop {
		m := &loop[i]
		switch {
		case m.role == roleUser:
			if r.toolsSet() && r.sameUser(m, &loop[lastUser]) { // message == user_messages[-1]
				var err error
				if dst, err = r.mistralTools(dst); err != nil {
					return dst, err
				}
			}
			dst = append(dst, "[INST]"...)
			if i == len(loop)-1 && system != nil {
				dst = append(r.joined(dst, system), "\n\n"...)
			}
			dst = append(r.joined(dst, m), "[/INST]"...)
		case m.role == roleAssistant && m.calls.ok:
			dst = append(dst, "[TOOL_CALLS]["...)
			n, err := r.countCalls(m)
			if err != nil {
				return dst, err
			}
			err = r.eachCall(m, func(i int, c call) error {
				// {%- set out = tool_call.function|tojson %}{{- out[:-1] }}
				var err error
				if dst, err = r.appendFunction(dst, c); err != nil {
					return err
				}
				if !c.id.ok || r.runeCount(c.id) != 9 {
					return rejected("Tool call IDs should be alphanumeric strings with length 9!")
				}
				dst = append(dst, `, "id": "`...)
				dst = append(r.s.appendStr(dst, c.id), `"}`...)
				if i < n-1 {
					dst = append(dst, ", "...)
				} else {
					dst = append(dst, "]</s>"...)
				}
				return nil
			})
			if err != nil {
				return dst, err
			}
		case m.role == roleAssistant:
			dst = append(r.joined(dst, m), "</s>"...)
		case m.role == roleTool:
			dst = append(dst, `[TOOL_RESULTS]{"content": `...)
			dst = append(r.joined(dst, m), ", "...)
			if !m.callID.ok || r.runeCount(m.callID) != 9 {
				return dst, rejected("Tool call IDs should be alphanumeric strings with length 9!")
			}
			dst = append(dst, `"call_id": "`...)
			dst = append(r.s.appendStr(dst, m.callID), `"}[/TOOL_RESULTS]`...)
		default: // tool_results never carries a tool_call_id through vLLM
			if r.s.equalStr(m.roleName, "tool_results") {
				return dst, rejected("Tool call IDs should be alphanumeric strings with length 9!")
			}
			return dst, rejected("Only user and assistant roles are supported, with the exception of an initial optional system message!")
		}
	}
	return dst, nil
}

// sameUser reports whether user messages a and b are equal as Python dicts:
// same content and same name.
func (r *Renderer) sameUser(a, b *message) bool {
	if a == b {
		return true
	}
	if a.name.ok != b.name.ok || (a.name.ok && !equalDecoded(&r.s, a.name, b.name)) {
		return false
	}
	r.tmp = r.joined(r.tmp[:0], a)
	n := len(r.tmp)
	r.tmp = r.joined(r.tmp, b)
	return string(r.tmp[:n]) == string(r.tmp[n:])
}

// mistralTools appends the [AVAILABLE_TOOLS] block. String values print raw
// ('"' + key + '": "' + val + '"'), others through tojson.
func (r *Renderer) mistralTools(dst []byte) ([]byte, error) {
	n, err := r.countTools()
	if err != nil {
		return dst, err
	}
	dst = append(dst, "[AVAILABLE_TOOLS]["...)
	err = r.eachTool(func(i int, tool raw) error {
		fn0, ext0, err := r.normalize(tool)
		if err != nil {
			return err
		}
		dst = append(dst, `{"type": "function", "function": {`...)
		first := true
		for j := fn0; j < ext0; j++ {
			kv := &r.kv[j]
			if kv.lit == "" && r.s.equalStr(kv.key, "return") {
				continue
			}
			if !first {
				dst = append(dst, ", "...)
			}
			first = false
			dst = append(dst, '"')
			if kv.lit != "" {
				dst = append(dst, kv.lit...)
			} else {
				dst = r.s.appendStr(dst, kv.key)
			}
			dst = append(dst, `": `...)
			if kv.val.ok && r.s.b[kv.val.off] == '"' {
				v, _ := r.sub(kv.val).str()
				dst = append(r.s.appendStr(append(dst, '"'), v), '"')
			} else if dst, err = r.appendVal(dst, kv.val, 0, 0); err != nil {
				return err
			}
		}
		dst = append(dst, "}}"...)
		if i < n-1 {
			dst = append(dst, ", "...)
		} else {
			dst = append(dst, ']')
		}
		return nil
	})
	return append(dst, "[/AVAILABLE_TOOLS]"...), err
}

// appendFunction appends tojson of a tool call's function object without its
// closing brace, arguments parsed as vLLM parses them (and added as {} at
// the end when missing).
func (r *Renderer) appendFunction(dst []byte, c call) ([]byte, error) {
	dst = append(dst, '{')
	n, haveArgs := 0, false
	fs := r.sub(c.fn)
	err := fs.object(5, func(key str) error {
		if n > 0 {
			dst = append(dst, ", "...)
		}
		n++
		dst = append(appendPyString(dst, r.s.b[key.off:key.end]), ": "...)
		if fs.equalStr(key, "arguments") {
			haveArgs = true
			v := r.valueAt(fs, 6)
			if r.err != nil {
				return r.err
			}
			var err error
			dst, err = r.appendArgs(dst, v)
			return err
		}
		var err error
		dst, err = appendPyJSON(dst, fs, 0, 0, 6)
		return err
	})
	if !haveArgs {
		if n > 0 {
			dst = append(dst, ", "...)
		}
		dst = append(dst, `"arguments": {}`...)
	}
	return dst, err
}

// gemma renders the Gemma 3 -it template. vLLM hands this template content
// as a list of parts (it loops over message['content']), so a string content
// is one text part and absent content is no part.
func (r *Renderer) gemma(dst []byte) ([]byte, error) {
	loop := r.msgs
	var prefix *message
	if loop[0].role == roleSystem {
		// first_user_prefix = messages[0]['content'][0]['text'] + '\n\n'
		m := &loop[0]
		if m.kind == contentNone || (m.kind == contentParts && (m.p0 == m.p1 || r.parts[m.p0].media)) {
			return dst, rejected("the system message's first part has no text")
		}
		prefix, loop = m, loop[1:]
	}
	dst = append(dst, "<bos>"...)
	for i := range loop {
		m := &loop[i]
		if (m.role == roleUser) != (i%2 == 0) {
			return dst, rejected("Conversation roles must alternate user/assistant/user/assistant/...")
		}
		dst = append(dst, "<start_of_turn>"...)
		if m.role == roleAssistant {
			dst = append(dst, "model"...)
		} else {
			dst = r.appendRole(dst, m)
		}
		dst = append(dst, '\n')
		if i == 0 && prefix != nil {
			if prefix.kind == contentString {
				dst = r.s.appendStr(dst, prefix.text)
			} else {
				dst = r.s.appendStr(dst, r.parts[prefix.p0].text)
			}
			dst = append(dst, "\n\n"...)
		}
		switch m.kind {
		case contentString:
			start := len(dst)
			dst = trimFrom(r.s.appendStr(dst, m.text), start)
		case contentParts:
			for j := m.p0; j < m.p1; j++ {
				start := len(dst)
				dst = trimFrom(r.appendPart(dst, &r.parts[j]), start)
			}
		}
		dst = append(dst, "<end_of_turn>\n"...)
	}
	if !r.req.noGen {
		dst = append(dst, "<start_of_turn>model\n"...)
	}
	return dst, nil
}

// plain renders the template-free form documented on Plain.
func (r *Renderer) plain(dst []byte) ([]byte, error) {
	if r.toolsSet() {
		dst = append(dst, "tools: "...)
		err := r.eachTool(func(i int, tool raw) error {
			if i > 0 {
				dst = append(dst, '\n')
			}
			var err error
			dst, err = r.appendVal(dst, tool, 0, 0)
			return err
		})
		if err != nil {
			return dst, err
		}
		dst = append(dst, '\n')
	}
	for i := range r.msgs {
		m := &r.msgs[i]
		dst = r.appendRole(dst, m)
		if m.name.ok {
			dst = append(r.s.appendStr(append(dst, " ("...), m.name), ')')
		}
		dst = append(r.joined(append(dst, ": "...), m), '\n')
		if m.role != roleAssistant || !m.calls.ok {
			continue
		}
		err := r.eachCall(m, func(_ int, c call) error {
			dst = append(r.s.appendStr(append(dst, "tool_call: "...), c.name), ' ')
			if c.args.ok && r.s.b[c.args.off] == '"' {
				v, _ := r.sub(c.args).str()
				dst = r.s.appendStr(dst, v)
			} else if c.args.ok {
				var err error
				if dst, err = r.appendVal(dst, c.args, 0, 0); err != nil {
					return err
				}
			}
			dst = append(dst, '\n')
			return nil
		})
		if err != nil {
			return dst, err
		}
	}
	return dst, nil
}

func (r *Renderer) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

var monthAbbr = [...]string{"Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"}

// appendDate appends t's UTC date as strftime("%d %b %Y") prints it in the
// C locale: "01 Dec 2026".
func appendDate(dst []byte, t time.Time) []byte {
	y, m, d := t.UTC().Date()
	dst = append(dst, byte('0'+d/10), byte('0'+d%10), ' ')
	dst = append(dst, monthAbbr[m-1]...)
	dst = append(dst, ' ')
	return strconv.AppendInt(dst, int64(y), 10)
}
