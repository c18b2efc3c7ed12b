package jinja

import (
	"math"
	"sort"
	"strconv"
	"time"
	"unicode/utf8"
)

// jsonWriter prints values as Python's json.dumps does, which is what
// transformers' tojson calls.
type jsonWriter struct {
	itemSep, keySep string
	indent          int // -1: all on one line
	sortKeys, ascii bool
}

func (j *jsonWriter) write(dst []byte, v Value, level int) ([]byte, error) {
	if level > 512 {
		return nil, errors("tojson: value nests too deeply")
	}
	switch x := v.(type) {
	case nil:
		return append(dst, "null"...), nil
	case bool:
		if x {
			return append(dst, "true"...), nil
		}
		return append(dst, "false"...), nil
	case int64:
		return strconv.AppendInt(dst, x, 10), nil
	case bigInt:
		return append(dst, x...), nil
	case float64:
		switch {
		case math.IsNaN(x):
			return append(dst, "NaN"...), nil
		case math.IsInf(x, 1):
			return append(dst, "Infinity"...), nil
		case math.IsInf(x, -1):
			return append(dst, "-Infinity"...), nil
		}
		return appendPyFloat(dst, x), nil
	case string:
		return j.str(dst, x), nil
	case *List:
		if x.generator {
			break
		}
		if len(x.Items) == 0 {
			return append(dst, "[]"...), nil
		}
		dst = append(dst, '[')
		for i, it := range x.Items {
			dst = j.sep(dst, i, level+1)
			var err error
			if dst, err = j.write(dst, it, level+1); err != nil {
				return nil, err
			}
		}
		return append(j.newline(dst, level), ']'), nil
	case *Dict:
		if len(x.keys) == 0 {
			return append(dst, "{}"...), nil
		}
		order := make([]int, len(x.keys))
		for i := range order {
			order[i] = i
		}
		if j.sortKeys {
			sort.SliceStable(order, func(a, b int) bool { return str(x.keys[order[a]]) < str(x.keys[order[b]]) })
		}
		dst = append(dst, '{')
		for i, k := range order {
			dst = j.sep(dst, i, level+1)
			dst = j.key(dst, x.keys[k])
			dst = append(dst, j.keySep...)
			var err error
			if dst, err = j.write(dst, x.vals[k], level+1); err != nil {
				return nil, err
			}
		}
		return append(j.newline(dst, level), '}'), nil
	}
	return nil, errors("Object of type " + typeName(v) + " is not JSON serializable")
}

// key prints a dict key as json.dumps does: numbers, booleans and None
// become strings.
func (j *jsonWriter) key(dst []byte, k Value) []byte {
	switch x := k.(type) {
	case string:
		return j.str(dst, x)
	case nil:
		return append(dst, `"null"`...)
	case bool:
		if x {
			return append(dst, `"true"`...)
		}
		return append(dst, `"false"`...)
	}
	return j.str(dst, str(k))
}

func (j *jsonWriter) sep(dst []byte, i, level int) []byte {
	if i > 0 {
		dst = append(dst, j.itemSep...)
	}
	return j.newline(dst, level)
}

func (j *jsonWriter) newline(dst []byte, level int) []byte {
	if j.indent < 0 {
		return dst
	}
	dst = append(dst, '\n')
	for i := 0; i < level*j.indent; i++ {
		dst = append(dst, ' ')
	}
	return dst
}

// AppendJSONString appends s quoted as Python's json.dumps(s,
// ensure_ascii=False) prints it, which escapes what Rust's serde_json
// escapes: '"', '\\' and the control characters.
func AppendJSONString(dst []byte, s string) []byte {
	var j jsonWriter
	return j.str(dst, s)
}

func (j *jsonWriter) str(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	for _, r := range s {
		switch {
		case r == '"':
			dst = append(dst, `\"`...)
		case r == '\\':
			dst = append(dst, `\\`...)
		case r == '\n':
			dst = append(dst, `\n`...)
		case r == '\r':
			dst = append(dst, `\r`...)
		case r == '\t':
			dst = append(dst, `\t`...)
		case r == '\b':
			dst = append(dst, `\b`...)
		case r == '\f':
			dst = append(dst, `\f`...)
		case r < 0x20 || j.ascii && r > 0x7e:
			if r > 0xffff {
				r -= 0x10000
				hi, lo := 0xd800+(r>>10), 0xdc00+(r&0x3ff)
				dst = append(dst, '\\', 'u', hex[hi>>12], hex[hi>>8&15], hex[hi>>4&15], hex[hi&15])
				r = lo
			}
			dst = append(dst, '\\', 'u', hex[r>>12], hex[r>>8&15], hex[r>>4&15], hex[r&15])
		default:
			dst = utf8.AppendRune(dst, r)
		}
	}
	return append(dst, '"')
}

var (
	weekdays = [...]string{"Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"}
	months   = [...]string{"January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December"}
)

// strftime formats t as Python's strftime does in the C locale, for the
// directives templates use.
func strftime(f string, t time.Time) (string, error) {
	var b []byte
	pad := func(n, width int) {
		s := strconv.Itoa(n)
		for i := len(s); i < width; i++ {
			b = append(b, '0')
		}
		b = append(b, s...)
	}
	for i := 0; i < len(f); i++ {
		if f[i] != '%' || i+1 == len(f) {
			b = append(b, f[i])
			continue
		}
		i++
		switch f[i] {
		case 'd':
			pad(t.Day(), 2)
		case 'e':
			if t.Day() < 10 {
				b = append(b, ' ')
			}
			pad(t.Day(), 1)
		case 'm':
			pad(int(t.Month()), 2)
		case 'Y':
			pad(t.Year(), 4)
		case 'y':
			pad(t.Year()%100, 2)
		case 'H':
			pad(t.Hour(), 2)
		case 'I':
			pad((t.Hour()+11)%12+1, 2)
		case 'M':
			pad(t.Minute(), 2)
		case 'S':
			pad(t.Second(), 2)
		case 'p':
			if t.Hour() < 12 {
				b = append(b, "AM"...)
			} else {
				b = append(b, "PM"...)
			}
		case 'j':
			pad(t.YearDay(), 3)
		case 'b', 'h':
			b = append(b, months[t.Month()-1][:3]...)
		case 'B':
			b = append(b, months[t.Month()-1]...)
		case 'a':
			b = append(b, weekdays[t.Weekday()][:3]...)
		case 'A':
			b = append(b, weekdays[t.Weekday()]...)
		case 'w':
			pad(int(t.Weekday()), 1)
		case '%':
			b = append(b, '%')
		default:
			return "", errors("strftime_now: unsupported directive %" + string(f[i]))
		}
	}
	return string(b), nil
}
