package errdetail

import (
	"errors"
	"testing"
)

var errSentinel = errors.New("thing: broken")

func TestError(t *testing.T) {
	err := New(errSentinel, "byte 7")
	if !errors.Is(err, errSentinel) || err.Error() != "thing: broken: byte 7" {
		t.Errorf("New: %v, Is %v", err, errors.Is(err, errSentinel))
	}
	p := Prefix("record 3: ", err)
	if !errors.Is(p, errSentinel) || p.Error() != "thing: broken: record 3: byte 7" {
		t.Errorf("Prefix: %v", p)
	}
	if plain := errors.New("plain"); Prefix("x: ", plain) != plain {
		t.Error("Prefix changed an error without a detail")
	}
}
