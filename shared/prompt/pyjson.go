package prompt

import (
	"math"
	"strconv"
	"unicode/utf8"

	"github.com/kvroute/kvroute/shared/jinja"
)

// This file prints JSON values as the templates' tojson filter does:
// transformers' tojson is Python's json.dumps(x, ensure_ascii=False,
// indent=indent), applied to what json.loads made of the request. So objects
// print as {"k": v, "k2": v2} (or one member per line with indent), non-ASCII
// stays as UTF-8, control characters print as \n, \t, ... or \u00XX, "\/"
// loses its backslash, integers keep their digits and other numbers print as
// Python's float repr ("1e2" prints "100.0").

// appendPyJSON reads one value at s and appends its json.dumps form. indent
// is 0 for the single-line form; level is the current indentation level.
func appendPyJSON(dst []byte, s *scanner, indent, level, depth int) ([]byte, error) {
	if depth >= maxDepth {
		return dst, ErrMalformed
	}
	var err error
	switch c := s.ws(); c {
	case '"':
		v, err := s.str()
		if err != nil {
			return dst, err
		}
		return appendPyString(dst, s.b[v.off:v.end]), nil
	case '{':
		dst = append(dst, '{')
		n := 0
		err = s.object(depth, func(key str) error {
			dst = pySeparator(dst, n, indent, level+1)
			n++
			dst = appendPyString(dst, s.b[key.off:key.end])
			dst = append(dst, ": "...)
			var err error
			dst, err = appendPyJSON(dst, s, indent, level+1, depth+1)
			return err
		})
		return pyClose(dst, n, '}', indent, level), err
	case '[':
		dst = append(dst, '[')
		n := 0
		err = s.array(depth, func() error {
			dst = pySeparator(dst, n, indent, level+1)
			n++
			var err error
			dst, err = appendPyJSON(dst, s, indent, level+1, depth+1)
			return err
		})
		return pyClose(dst, n, ']', indent, level), err
	case 't', 'f', 'n':
		start := s.pos
		lit := "null"
		if c == 't' {
			lit = "true"
		} else if c == 'f' {
			lit = "false"
		}
		err = s.literal(lit)
		return append(dst, s.b[start:s.pos]...), err
	}
	start := s.pos
	isInt, err := s.number()
	if err != nil {
		return dst, err
	}
	return appendPyNumber(dst, s.b[start:s.pos], isInt), nil
}

// pySeparator starts member n of a container: json.dumps separates members
// with ", ", or with "," and a newline plus indentation when indenting.
func pySeparator(dst []byte, n, indent, level int) []byte {
	if n > 0 {
		dst = append(dst, ',')
		if indent == 0 {
			dst = append(dst, ' ')
		}
	}
	if indent > 0 {
		dst = append(dst, '\n')
		for i := 0; i < indent*level; i++ {
			dst = append(dst, ' ')
		}
	}
	return dst
}

// pyClose ends a container of n members: an empty one stays "{}" or "[]"
// even when indenting.
func pyClose(dst []byte, n int, close byte, indent, level int) []byte {
	if n > 0 && indent > 0 {
		dst = append(dst, '\n')
		for i := 0; i < indent*level; i++ {
			dst = append(dst, ' ')
		}
	}
	return append(dst, close)
}

// appendPyString appends a JSON string's raw contents re-escaped the way
// json.dumps(ensure_ascii=False) escapes the decoded string.
func appendPyString(dst, raw []byte) []byte {
	dst = append(dst, '"')
	for i := 0; i < len(raw); {
		j := i
		for j < len(raw) && raw[j] != '\\' {
			j++
		}
		dst = append(dst, raw[i:j]...)
		if j >= len(raw) {
			break
		}
		i = j
		switch raw[i+1] {
		case 'u':
			var r rune
			r, i = unicodeEscape(raw, i)
			dst = appendPyRune(dst, r)
		case '/':
			dst = append(dst, '/')
			i += 2
		default: // '"', '\\', 'b', 'f', 'n', 'r', 't' keep their escape
			dst = append(dst, raw[i:i+2]...)
			i += 2
		}
	}
	return append(dst, '"')
}

func appendPyRune(dst []byte, r rune) []byte {
	switch r {
	case '"':
		return append(dst, `\"`...)
	case '\\':
		return append(dst, `\\`...)
	case '\b':
		return append(dst, `\b`...)
	case '\f':
		return append(dst, `\f`...)
	case '\n':
		return append(dst, `\n`...)
	case '\r':
		return append(dst, `\r`...)
	case '\t':
		return append(dst, `\t`...)
	}
	if r < 0x20 {
		const hexdigits = "0123456789abcdef"
		return append(dst, '\\', 'u', '0', '0', hexdigits[r>>4], hexdigits[r&15])
	}
	return utf8.AppendRune(dst, r)
}

// appendPyNumber appends what json.dumps(json.loads(num)) prints.
func appendPyNumber(dst, num []byte, isInt bool) []byte {
	if isInt {
		if string(num) == "-0" {
			return append(dst, '0')
		}
		return append(dst, num...)
	}
	f, _ := strconv.ParseFloat(string(num), 64)
	return appendPyFloat(dst, f)
}

// appendPyFloat appends what json.dumps prints for f.
func appendPyFloat(dst []byte, f float64) []byte {
	switch {
	case math.IsInf(f, 1):
		return append(dst, "Infinity"...)
	case math.IsInf(f, -1):
		return append(dst, "-Infinity"...)
	}
	return jinja.AppendFloat(dst, f)
}
