package prompt

import (
	"bytes"
	"encoding/binary"
	"math/bits"
	"unicode/utf16"
	"unicode/utf8"
)

// maxDepth bounds how deeply arrays and objects may nest anywhere in a body.
// Real requests nest a dozen levels at most (tool JSON schemas); the bound
// keeps every walk over a body iterative or shallowly recursive.
const maxDepth = 128

// scanner walks one JSON document strictly (RFC 8259) in a single pass.
// Rendering reads the body this way, rather than through gjson, because the
// body is the filter's dominant cost: gjson validates a 512 KiB body at about
// 110 MB/s under wazero, while this scanner finds string ends eight bytes at
// a time and copies contents without escapes straight into the output.
type scanner struct {
	b   []byte
	pos int
}

// str is the contents of a JSON string (between the quotes) as offsets into
// the scanned document; esc says whether it holds escapes.
type str struct {
	off, end int32
	esc      bool
	ok       bool // the value was present and a string
}

func (s str) empty() bool { return s.end == s.off }

func isSpace(c byte) bool { return c == ' ' || c == '\n' || c == '\r' || c == '\t' }

// ws skips whitespace and returns the next byte, or 0 at the end.
func (s *scanner) ws() byte {
	for s.pos < len(s.b) {
		c := s.b[s.pos]
		if !isSpace(c) {
			return c
		}
		s.pos++
	}
	return 0
}

// expect consumes c after optional whitespace.
func (s *scanner) expect(c byte) error {
	if s.ws() != c {
		return ErrInvalidJSON
	}
	s.pos++
	return nil
}

const (
	lsb = 0x0101010101010101
	msb = 0x8080808080808080
)

// special marks, in the high bit of each byte, the bytes of w that end a run
// of plain string bytes: '"', '\\' and control characters. Only the lowest
// mark is exact, which is the one used.
func special(w uint64) uint64 {
	q := w ^ (lsb * '"')
	b := w ^ (lsb * '\\')
	return ((q-lsb)&^q | (b-lsb)&^b | (w-lsb*0x20)&^w) & msb
}

// str reads a string at the current position (after whitespace).
func (s *scanner) str() (str, error) {
	if s.ws() != '"' {
		return str{}, ErrInvalidJSON
	}
	s.pos++
	out := str{off: int32(s.pos), ok: true}
	b, i := s.b, s.pos
	for {
		for i+8 <= len(b) {
			if m := special(binary.LittleEndian.Uint64(b[i:])); m != 0 {
				i += bits.TrailingZeros64(m) >> 3
				break
			}
			i += 8
		}
		for i < len(b) && b[i] != '"' && b[i] != '\\' && b[i] >= 0x20 {
			i++
		}
		if i >= len(b) || b[i] < 0x20 {
			return str{}, ErrInvalidJSON
		}
		if b[i] == '"' {
			out.end = int32(i)
			s.pos = i + 1
			return out, nil
		}
		out.esc = true
		n, ok := escapeLen(b[i:])
		if !ok {
			return str{}, ErrInvalidJSON
		}
		i += n
	}
}

// escapeLen returns the length of the escape sequence at the start of b.
func escapeLen(b []byte) (int, bool) {
	if len(b) < 2 {
		return 0, false
	}
	switch b[1] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		return 2, true
	case 'u':
		if len(b) < 6 {
			return 0, false
		}
		for _, c := range b[2:6] {
			if hexVal(c) < 0 {
				return 0, false
			}
		}
		return 6, true
	}
	return 0, false
}

func hexVal(c byte) int {
	switch {
	case '0' <= c && c <= '9':
		return int(c - '0')
	case 'a' <= c && c <= 'f':
		return int(c-'a') + 10
	case 'A' <= c && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}

func hex4(b []byte) rune {
	return rune(hexVal(b[0])<<12 | hexVal(b[1])<<8 | hexVal(b[2])<<4 | hexVal(b[3]))
}

// appendUnescaped appends the decoded contents of a validated JSON string.
// A lone UTF-16 surrogate decodes to U+FFFD, as in encoding/json.
func appendUnescaped(dst, raw []byte) []byte {
	for len(raw) > 0 {
		i := bytes.IndexByte(raw, '\\')
		if i < 0 {
			return append(dst, raw...)
		}
		dst = append(dst, raw[:i]...)
		raw = raw[i:]
		var r rune
		switch raw[1] {
		case 'u':
			r, raw = hex4(raw[2:6]), raw[6:]
			if utf16.IsSurrogate(r) {
				r2 := rune(-1)
				if len(raw) >= 6 && raw[0] == '\\' && raw[1] == 'u' {
					r2 = hex4(raw[2:6])
				}
				if d := utf16.DecodeRune(r, r2); d != utf8.RuneError {
					r, raw = d, raw[6:]
				} else {
					r = utf8.RuneError
				}
			}
			dst = utf8.AppendRune(dst, r)
			continue
		case 'b':
			r = '\b'
		case 'f':
			r = '\f'
		case 'n':
			r = '\n'
		case 'r':
			r = '\r'
		case 't':
			r = '\t'
		default: // '"', '\\', '/'
			r = rune(raw[1])
		}
		dst = append(dst, byte(r))
		raw = raw[2:]
	}
	return dst
}

// appendStr appends the decoded contents of s, a string of the scanned
// document: a plain copy when it holds no escapes.
func (s *scanner) appendStr(dst []byte, v str) []byte {
	if !v.esc {
		return append(dst, s.b[v.off:v.end]...)
	}
	return appendUnescaped(dst, s.b[v.off:v.end])
}

// equalStr reports whether string v decodes to lit.
func (s *scanner) equalStr(v str, lit string) bool {
	raw := s.b[v.off:v.end]
	if !v.esc {
		return string(raw) == lit
	}
	var buf [64]byte
	if len(raw) > len(buf) {
		return false // no literal compared against is that long
	}
	return string(appendUnescaped(buf[:0], raw)) == lit
}

// number reads a number and reports whether it is an integer.
func (s *scanner) number() (isInt bool, err error) {
	b, i := s.b, s.pos
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && '1' <= b[i] && b[i] <= '9':
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
	default:
		return false, ErrInvalidJSON
	}
	isInt = true
	if i < len(b) && b[i] == '.' {
		isInt = false
		i++
		j := i
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
		if i == j {
			return false, ErrInvalidJSON
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		isInt = false
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := i
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
		if i == j {
			return false, ErrInvalidJSON
		}
	}
	s.pos = i
	return isInt, nil
}

func (s *scanner) literal(lit string) error {
	if len(s.b)-s.pos < len(lit) || string(s.b[s.pos:s.pos+len(lit)]) != lit {
		return ErrInvalidJSON
	}
	s.pos += len(lit)
	return nil
}

// skip validates and passes over one value. depth is the nesting depth of
// the container holding it.
func (s *scanner) skip(depth int) error {
	// stack holds one bit per open container: 1 for an object.
	var stack [maxDepth / 64]uint64
	top := 0
	push := func(obj bool) error {
		if depth+top >= maxDepth {
			return ErrMalformed
		}
		if obj {
			stack[top>>6] |= 1 << (top & 63)
		} else {
			stack[top>>6] &^= 1 << (top & 63)
		}
		top++
		return nil
	}
	inObj := func() bool { return stack[(top-1)>>6]&(1<<((top-1)&63)) != 0 }
	for {
		// A value.
		switch c := s.ws(); c {
		case '"':
			if _, err := s.str(); err != nil {
				return err
			}
		case '{':
			s.pos++
			if err := push(true); err != nil {
				return err
			}
			if s.ws() == '}' {
				s.pos++
				top--
				break
			}
			if _, err := s.str(); err != nil {
				return err
			}
			if err := s.expect(':'); err != nil {
				return err
			}
			continue
		case '[':
			s.pos++
			if err := push(false); err != nil {
				return err
			}
			if s.ws() == ']' {
				s.pos++
				top--
				break
			}
			continue
		case 't':
			if err := s.literal("true"); err != nil {
				return err
			}
		case 'f':
			if err := s.literal("false"); err != nil {
				return err
			}
		case 'n':
			if err := s.literal("null"); err != nil {
				return err
			}
		default:
			if _, err := s.number(); err != nil {
				return err
			}
		}
		// After a value: close containers or move to the next element.
		for {
			if top == 0 {
				return nil
			}
			c := s.ws()
			if c == ',' {
				s.pos++
				if inObj() {
					if _, err := s.str(); err != nil {
						return err
					}
					if err := s.expect(':'); err != nil {
						return err
					}
				}
				break
			}
			if (c == '}' && inObj()) || (c == ']' && !inObj()) {
				s.pos++
				top--
				continue
			}
			return ErrInvalidJSON
		}
	}
}

// object calls field for each member of the object at the current position,
// with the scanner placed at the member's value; field must consume it.
func (s *scanner) object(depth int, field func(key str) error) error {
	if err := s.expect('{'); err != nil {
		return err
	}
	if depth >= maxDepth {
		return ErrMalformed
	}
	if s.ws() == '}' {
		s.pos++
		return nil
	}
	for {
		key, err := s.str()
		if err != nil {
			return err
		}
		if err := s.expect(':'); err != nil {
			return err
		}
		if err := field(key); err != nil {
			return err
		}
		switch s.ws() {
		case ',':
			s.pos++
		case '}':
			s.pos++
			return nil
		default:
			return ErrInvalidJSON
		}
	}
}

// array calls elem for each element of the array at the current position,
// with the scanner placed at the element; elem must consume it.
func (s *scanner) array(depth int, elem func() error) error {
	if err := s.expect('['); err != nil {
		return err
	}
	if depth >= maxDepth {
		return ErrMalformed
	}
	if s.ws() == ']' {
		s.pos++
		return nil
	}
	for {
		if err := elem(); err != nil {
			return err
		}
		switch s.ws() {
		case ',':
			s.pos++
		case ']':
			s.pos++
			return nil
		default:
			return ErrInvalidJSON
		}
	}
}
