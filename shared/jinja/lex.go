package jinja

import (
	"strconv"
	"strings"
)

type tokKind uint8

const (
	tData   tokKind = iota // template text, already whitespace-controlled
	tBlock                 // {% ... %}: the tokens up to tEnd
	tVar                   // {{ ... }}: the tokens up to tEnd
	tEnd                   // closes a tag
	tName                  // identifier or keyword
	tString                // string literal, unescaped
	tInt                   // integer literal
	tFloat                 // float literal
	tOp                    // operator or punctuation
	tEOF
)

type token struct {
	kind tokKind
	s    string // text, name, unescaped string or operator
	line int
}

// lex splits src into tokens the way Jinja2 does with trim_blocks and
// lstrip_blocks on, as transformers configures it: a block or comment tag
// alone on its line takes the line's indentation and its newline with it.
func lex(src string) ([]token, error) {
	src = strings.ReplaceAll(src, "\r\n", "\n")
	var toks []token
	line := 1
	// lineStart says the last lexeme consumed ended a line, so text up to
	// the next tag starts one (Jinja2's line_starting).
	lineStart := true
	pos := 0
	for pos < len(src) {
		start := nextTag(src, pos)
		if start < 0 {
			toks = append(toks, token{kind: tData, s: src[pos:], line: line})
			break
		}
		text := src[pos:start]
		open := src[start+1]
		sign := byte(0)
		if start+2 < len(src) && (src[start+2] == '-' || src[start+2] == '+') {
			sign = src[start+2]
		}
		switch {
		case sign == '-':
			text = strings.TrimRight(text, " \t\n\r\f\v")
		case sign != '+' && open != '{':
			l := strings.LastIndexByte(text, '\n') + 1
			if (l > 0 || lineStart) && l < len(text) && strings.Trim(text[l:], " \t") == "" {
				text = text[:l]
			}
		}
		if text != "" {
			toks = append(toks, token{kind: tData, s: text, line: line})
		}
		line += strings.Count(src[pos:start], "\n")
		pos = start + 2
		if sign != 0 {
			pos++
		}
		end := ""
		switch open {
		case '#':
			i := strings.Index(src[pos:], "#}")
			if i < 0 {
				return nil, errAt(line, "unclosed comment")
			}
			line += strings.Count(src[pos:pos+i], "\n")
			if i > 0 && (src[pos+i-1] == '-' || src[pos+i-1] == '+') {
				i--
			}
			pos = trimAfter(src, pos+i, "#", &lineStart, &line)
			continue
		case '%':
			toks = append(toks, token{kind: tBlock, line: line})
			end = "%"
		default:
			toks = append(toks, token{kind: tVar, line: line})
			end = "}"
		}
		var err error
		toks, pos, err = lexExpr(toks, src, pos, end[0], &line)
		if err != nil {
			return nil, err
		}
		if toks[len(toks)-2].kind == tBlock && toks[len(toks)-1].s == "raw" {
			// {% raw %}...{% endraw %}: the text in between, untouched.
			toks = toks[:len(toks)-2]
			pos = trimAfter(src, pos, end, &lineStart, &line)
			i := strings.Index(src[pos:], "endraw")
			j := strings.LastIndex(src[pos:pos+max(i, 0)], "{%")
			if i < 0 || j < 0 {
				return nil, errAt(line, "unclosed raw block")
			}
			raw := src[pos : pos+j]
			if strings.HasPrefix(src[pos+j:], "{%-") {
				raw = strings.TrimRight(raw, " \t\n\r\f\v")
			}
			toks = append(toks, token{kind: tData, s: raw, line: line})
			k := strings.Index(src[pos+i:], "%}")
			if k < 0 {
				return nil, errAt(line, "unclosed raw block")
			}
			line += strings.Count(src[pos:pos+i+k], "\n")
			pos = trimAfter(src, pos+i+k, "%", &lineStart, &line)
			continue
		}
		toks = append(toks, token{kind: tEnd, line: line})
		pos = trimAfter(src, pos, end, &lineStart, &line)
	}
	return append(toks, token{kind: tEOF, line: line}), nil
}

// nextTag returns where the next "{{", "{%" or "{#" starts, or -1.
func nextTag(src string, pos int) int {
	for {
		i := strings.IndexByte(src[pos:], '{')
		if i < 0 || pos+i+1 >= len(src) {
			return -1
		}
		switch src[pos+i+1] {
		case '{', '%', '#':
			return pos + i
		}
		pos += i + 1
	}
}

// trimAfter consumes a tag's closing delimiter at src[pos:] (an optional
// "-" or "+", then end and "}") and the whitespace control that follows.
func trimAfter(src string, pos int, end string, lineStart *bool, line *int) int {
	start := pos
	defer func() { *line += strings.Count(src[start:pos], "\n") }()
	sign := src[pos]
	if sign == '-' || sign == '+' {
		pos++
	}
	pos += len(end) + 1
	switch {
	case sign == '-':
		for pos < len(src) && strings.IndexByte(" \t\n\r\f\v", src[pos]) >= 0 {
			pos++
		}
	case sign != '+' && end != "}" && pos < len(src) && src[pos] == '\n':
		pos++
	}
	*lineStart = pos > 0 && src[pos-1] == '\n'
	return pos
}

var operators = []string{"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">", "=", "(", ")", "[", "]", "{", "}", ",", ".", ":", "|"}

// lexExpr lexes the inside of a tag up to its closing delimiter, leaving
// pos at the delimiter (or at its "-" or "+").
func lexExpr(toks []token, src string, pos int, end byte, line *int) ([]token, int, error) {
	depth := 0
	for {
		for pos < len(src) && strings.IndexByte(" \t\n\r", src[pos]) >= 0 {
			if src[pos] == '\n' {
				*line++
			}
			pos++
		}
		if pos >= len(src) {
			return nil, pos, errAt(*line, "unclosed tag")
		}
		rest := src[pos:]
		if depth == 0 {
			r := rest
			if r[0] == '-' || r[0] == '+' {
				r = r[1:]
			}
			if len(r) >= 2 && r[0] == end && r[1] == '}' {
				return toks, pos, nil
			}
		}
		c := rest[0]
		switch {
		case c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z':
			n := 1
			for n < len(rest) && (rest[n] == '_' || rest[n] >= 'a' && rest[n] <= 'z' || rest[n] >= 'A' && rest[n] <= 'Z' || rest[n] >= '0' && rest[n] <= '9') {
				n++
			}
			toks = append(toks, token{kind: tName, s: rest[:n], line: *line})
			pos += n
		case c >= '0' && c <= '9':
			n, float := 0, false
			for n < len(rest) && (rest[n] >= '0' && rest[n] <= '9' || rest[n] == '_') {
				n++
			}
			if n+1 < len(rest) && rest[n] == '.' && rest[n+1] >= '0' && rest[n+1] <= '9' {
				float = true
				n++
				for n < len(rest) && (rest[n] >= '0' && rest[n] <= '9' || rest[n] == '_') {
					n++
				}
			}
			if n < len(rest) && (rest[n] == 'e' || rest[n] == 'E') {
				m := n + 1
				if m < len(rest) && (rest[m] == '+' || rest[m] == '-') {
					m++
				}
				if m < len(rest) && rest[m] >= '0' && rest[m] <= '9' {
					float = true
					for m < len(rest) && rest[m] >= '0' && rest[m] <= '9' {
						m++
					}
					n = m
				}
			}
			kind := tInt
			if float {
				kind = tFloat
			}
			toks = append(toks, token{kind: kind, s: strings.ReplaceAll(rest[:n], "_", ""), line: *line})
			pos += n
		case c == '\'' || c == '"':
			s, n, err := unquote(rest)
			if err != nil {
				return nil, pos, errAt(*line, err.Error())
			}
			*line += strings.Count(rest[:n], "\n")
			toks = append(toks, token{kind: tString, s: s, line: *line})
			pos += n
		default:
			op := ""
			for _, o := range operators {
				if strings.HasPrefix(rest, o) {
					op = o
					break
				}
			}
			if op == "" {
				return nil, pos, errAt(*line, "unexpected character "+strconv.QuoteRune(rune(c)))
			}
			switch op {
			case "(", "[", "{":
				depth++
			case ")", "]", "}":
				depth--
			}
			toks = append(toks, token{kind: tOp, s: op, line: *line})
			pos += len(op)
		}
	}
}

// unquote reads the string literal at the start of s, with Python's
// escapes (Jinja2 decodes literals with "unicode-escape"), and returns it
// with the literal's length.
func unquote(s string) (string, int, error) {
	q := s[0]
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		c := s[i]
		switch {
		case c == q:
			return b.String(), i + 1, nil
		case c != '\\':
			b.WriteByte(c)
			continue
		}
		i++
		if i >= len(s) {
			break
		}
		switch e := s[i]; e {
		case 'n':
			b.WriteByte('\n')
		case 't':
			b.WriteByte('\t')
		case 'r':
			b.WriteByte('\r')
		case '0':
			b.WriteByte(0)
		case 'a':
			b.WriteByte(7)
		case 'b':
			b.WriteByte(8)
		case 'f':
			b.WriteByte(12)
		case 'v':
			b.WriteByte(11)
		case '\n':
		case 'x', 'u', 'U':
			n := 2
			switch e {
			case 'u':
				n = 4
			case 'U':
				n = 8
			}
			if i+n >= len(s) {
				return "", 0, errors("truncated escape in string literal")
			}
			v, err := strconv.ParseUint(s[i+1:i+1+n], 16, 32)
			if err != nil {
				return "", 0, errors("bad escape in string literal")
			}
			b.WriteRune(rune(v))
			i += n
		case '\\', '\'', '"':
			b.WriteByte(e)
		default:
			b.WriteByte('\\')
			b.WriteByte(e)
		}
	}
	return "", 0, errors("unterminated string literal")
}
