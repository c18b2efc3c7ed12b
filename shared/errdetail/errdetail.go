// Package errdetail attaches a detail to a sentinel error: callers branch
// on the sentinel with errors.Is and read the detail in the message. It
// needs no fmt, so the Wasm filter can link it.
package errdetail

import "errors"

// Error is a sentinel error with a detail.
type Error struct {
	Kind   error  // the sentinel, which errors.Is matches
	Detail string // what exactly went wrong
}

// New returns kind with detail.
func New(kind error, detail string) error { return &Error{kind, detail} }

// Error returns the sentinel's message, a colon and the detail.
func (e *Error) Error() string { return e.Kind.Error() + ": " + e.Detail }

// Unwrap returns the sentinel.
func (e *Error) Unwrap() error { return e.Kind }

// Prefix returns err with prefix put before its detail, keeping its
// sentinel; an err without a detail is returned as it is.
func Prefix(prefix string, err error) error {
	var d *Error
	if !errors.As(err, &d) {
		return err
	}
	return &Error{d.Kind, prefix + d.Detail}
}
