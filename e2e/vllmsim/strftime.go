package vllmsim

import (
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/ardanlabs/jinja"
)

// strftimeNow is transformers' strftime_now(format): the engine process's
// local time (UTC here, as in a container without TZ) printed by Python's
// strftime in the C locale. at zero means the time of the call.
func strftimeNow(at time.Time) jinja.Value {
	return jinja.NewCallable("strftime_now", func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		if len(args) != 1 || !args[0].IsString() {
			return jinja.Undefined(), errors.New("strftime_now takes one format string")
		}
		t := at
		if t.IsZero() {
			t = time.Now()
		}
		s, err := strftime(args[0].AsString(), t.UTC())
		if err != nil {
			return jinja.Undefined(), err
		}
		return jinja.NewString(s), nil
	})
}

// strftime supports the directives chat templates use.
func strftime(format string, t time.Time) (string, error) {
	var b strings.Builder
	two := func(n int) {
		b.WriteByte(byte('0' + n/10))
		b.WriteByte(byte('0' + n%10))
	}
	for i := 0; i < len(format); i++ {
		if format[i] != '%' || i+1 == len(format) {
			b.WriteByte(format[i])
			continue
		}
		i++
		switch format[i] {
		case 'd':
			two(t.Day())
		case 'm':
			two(int(t.Month()))
		case 'y':
			two(t.Year() % 100)
		case 'Y':
			b.WriteString(strconv.Itoa(t.Year()))
		case 'b':
			b.WriteString(t.Month().String()[:3])
		case 'B':
			b.WriteString(t.Month().String())
		case 'a':
			b.WriteString(t.Weekday().String()[:3])
		case 'A':
			b.WriteString(t.Weekday().String())
		case 'H':
			two(t.Hour())
		case 'M':
			two(t.Minute())
		case 'S':
			two(t.Second())
		case '%':
			b.WriteByte('%')
		default:
			return "", errors.New("strftime_now: unsupported directive %" + string(format[i]))
		}
	}
	return b.String(), nil
}
