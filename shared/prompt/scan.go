package prompt

import (
	"encoding/binary"
	"math/bits"
	"slices"
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
	b     []byte
	pos   int
	arena []byte // texts decoded while scanning (see text)
}

// str is the contents of a JSON string (between the quotes) as offsets into
// the scanned document; esc says whether it holds escapes.
type str struct {
	off, end   int32
	aoff, aend int32 // where text decoded it in the scanner's arena
	esc        bool
	dec        bool // decoded in the arena
	ok         bool // the value was present and a string
}

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

// atEnd reports whether only whitespace is left. (ws's 0 cannot tell the
// end from a NUL byte.)
func (s *scanner) atEnd() bool {
	s.ws()
	return s.pos == len(s.b)
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
				goto found
			}
			i += 8
		}
		for i < len(b) && b[i] != '"' && b[i] != '\\' && b[i] >= 0x20 {
			i++
		}
		if i >= len(b) {
			return str{}, ErrInvalidJSON
		}
	found:
		switch b[i] {
		case '"':
			out.end = int32(i)
			s.pos = i + 1
			return out, nil
		case '\\':
			out.esc = true
			if i+1 < len(b) && simpleEscape[b[i+1]] {
				i += 2
				continue
			}
			n, ok := escapeLen(b[i:])
			if !ok {
				return str{}, ErrInvalidJSON
			}
			i += n
		default: // a control character
			return str{}, ErrInvalidJSON
		}
	}
}

// simpleEscape marks the bytes that may follow a backslash on their own.
var simpleEscape = [256]bool{'"': true, '\\': true, '/': true, 'b': true, 'f': true, 'n': true, 'r': true, 't': true}

// text reads a string like str and, when it holds escapes, also decodes it
// into the arena in the same pass, so that rendering it is one copy. Message
// texts are most of a body; reading escaped ones twice (once to find their
// end, once to decode them) costs a third of the speed under wazero.
func (s *scanner) text() (str, error) {
	if s.ws() != '"' {
		return str{}, ErrInvalidJSON
	}
	s.pos++
	v := str{off: int32(s.pos), ok: true}
	b, i := s.b, s.pos
	// Up to the first escape, only look.
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
	switch {
	case i >= len(b) || b[i] < 0x20:
		return str{}, ErrInvalidJSON
	case b[i] == '"':
		v.end = int32(i)
		s.pos = i + 1
		return v, nil
	}
	// From there on, copy while looking. Decoding never lengthens text, so
	// the rest of the document bounds the space needed (plus one word of
	// slack for the word-sized stores).
	v.esc, v.dec = true, true
	a := slices.Grow(s.arena, len(b)-int(v.off)+8)
	w := len(a)
	v.aoff = int32(w)
	a = a[:cap(a)]
	w += copy(a[w:], b[v.off:i])
	for {
		// b[i] is a backslash.
		if i+1 >= len(b) {
			return str{}, ErrInvalidJSON
		}
		if d := unescape[b[i+1]]; d != 0 {
			a[w] = d
			w, i = w+1, i+2
		} else {
			r, n := decodeU(b[i:])
			if n == 0 {
				return str{}, ErrInvalidJSON
			}
			w += utf8.EncodeRune(a[w:], r)
			i += n
		}
		for i+8 <= len(b) {
			x := binary.LittleEndian.Uint64(b[i:])
			binary.LittleEndian.PutUint64(a[w:], x)
			if m := special(x); m != 0 {
				k := bits.TrailingZeros64(m) >> 3
				i, w = i+k, w+k
				goto found
			}
			i, w = i+8, w+8
		}
		for i < len(b) && b[i] != '"' && b[i] != '\\' && b[i] >= 0x20 {
			a[w] = b[i]
			i, w = i+1, w+1
		}
		if i >= len(b) {
			return str{}, ErrInvalidJSON
		}
	found:
		switch b[i] {
		case '"':
			v.end, v.aend = int32(i), int32(w)
			s.pos = i + 1
			s.arena = a[:w]
			return v, nil
		case '\\':
		default:
			return str{}, ErrInvalidJSON
		}
	}
}

// unescape maps the byte after a backslash to what the escape stands for,
// for every escape but \u; 0 means none.
var unescape = [256]byte{'"': '"', '\\': '\\', '/': '/', 'b': '\b', 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t'}

// decodeU decodes the \uXXXX escape at the start of b, and the low
// surrogate's escape after it when the first is a high surrogate; a lone
// surrogate decodes to U+FFFD. n is the bytes consumed, 0 if b does not
// start with a valid \u escape.
func decodeU(b []byte) (r rune, n int) {
	if l, ok := escapeLen(b); !ok || l != 6 {
		return 0, 0
	}
	r = hex4(b[2:6])
	if !utf16.IsSurrogate(r) {
		return r, 6
	}
	if l, ok := escapeLen(b[6:]); ok && l == 6 && b[7] == 'u' {
		if d := utf16.DecodeRune(r, hex4(b[8:12])); d != utf8.RuneError {
			return d, 12
		}
	}
	return utf8.RuneError, 6
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
// A lone UTF-16 surrogate decodes to U+FFFD, as in encoding/json. Decoding
// never lengthens a string, so it writes into space grown once up front; it
// copies eight bytes at a time while looking for the next backslash, which
// runs half again as fast under wazero as IndexByte and copy.
func appendUnescaped(dst, raw []byte) []byte {
	w := len(dst)
	dst = slices.Grow(dst, len(raw)+8)[:w+len(raw)+8]
	i := 0
	for {
		for i+8 <= len(raw) {
			x := binary.LittleEndian.Uint64(raw[i:])
			binary.LittleEndian.PutUint64(dst[w:], x)
			x ^= lsb * '\\'
			if m := (x - lsb) &^ x & msb; m != 0 {
				k := bits.TrailingZeros64(m) >> 3
				i, w = i+k, w+k
				goto escape
			}
			i, w = i+8, w+8
		}
		for i < len(raw) && raw[i] != '\\' {
			dst[w] = raw[i]
			i, w = i+1, w+1
		}
		if i >= len(raw) {
			return dst[:w]
		}
	escape:
		c := raw[i+1]
		switch c {
		case 'u':
			var r rune
			r, i = unicodeEscape(raw, i)
			w += utf8.EncodeRune(dst[w:], r)
			continue
		case 'b':
			c = '\b'
		case 'f':
			c = '\f'
		case 'n':
			c = '\n'
		case 'r':
			c = '\r'
		case 't':
			c = '\t'
		}
		dst[w] = c // '"', '\\' and '/' stand for themselves
		w++
		i += 2
	}
}

// appendStr appends the decoded contents of s, a string of the scanned
// document: a plain copy when it holds no escapes or was decoded already.
func (s *scanner) appendStr(dst []byte, v str) []byte {
	switch {
	case !v.esc:
		return append(dst, s.b[v.off:v.end]...)
	case v.dec:
		return append(dst, s.arena[v.aoff:v.aend]...)
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

// count reads any value where a token count belongs: a positive integer
// below a billion is returned, anything else (null, a string, a fraction,
// a huge number) is skipped and counts as 0, for the engine to judge.
func (s *scanner) count() (int, error) {
	if c := s.ws(); c < '0' || c > '9' {
		return 0, s.skip(1)
	}
	start := s.pos
	isInt, err := s.number()
	if err != nil || !isInt || s.pos-start > 9 {
		return 0, err
	}
	n := 0
	for _, c := range s.b[start:s.pos] {
		n = 10*n + int(c-'0')
	}
	return n, nil
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

// unicodeEscape decodes the \uXXXX escape at raw[i:], with the low half of a
// surrogate pair after it, and returns the rune (U+FFFD for a lone
// surrogate) and the index after what it consumed.
func unicodeEscape(raw []byte, i int) (rune, int) {
	r := hex4(raw[i+2 : i+6])
	i += 6
	if !utf16.IsSurrogate(r) {
		return r, i
	}
	r2 := rune(-1)
	if i+6 <= len(raw) && raw[i] == '\\' && raw[i+1] == 'u' {
		r2 = hex4(raw[i+2 : i+6])
	}
	if d := utf16.DecodeRune(r, r2); d != utf8.RuneError {
		return d, i + 6
	}
	return utf8.RuneError, i
}
