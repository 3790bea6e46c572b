// Package fault is Shizu's small error taxonomy. Domain code wraps one of the
// sentinel kinds; each transport maps a kind to its outcome in one place
// (the bus: ack, nak with delay, or terminate and dead-letter; the CLI: exit
// code and message).
package fault

import (
	"errors"
	"fmt"
)

// The kinds. Wrap them with %w (or use the constructors) and test with Is*.
var (
	// ErrNotFound: the thing named does not exist.
	ErrNotFound = errors.New("not found")
	// ErrConflict: the state moved under the caller (epoch, revision); re-read and retry.
	ErrConflict = errors.New("conflict")
	// ErrInvalid: the input is wrong and retrying it cannot help.
	ErrInvalid = errors.New("invalid input")
	// ErrUnavailable: a dependency is down or overloaded; retrying later may help.
	ErrUnavailable = errors.New("unavailable")
)

// NotFound returns an error of kind ErrNotFound with the formatted detail.
func NotFound(format string, args ...any) error { return wrap(ErrNotFound, format, args) }

// Conflict returns an error of kind ErrConflict with the formatted detail.
func Conflict(format string, args ...any) error { return wrap(ErrConflict, format, args) }

// Invalid returns an error of kind ErrInvalid with the formatted detail.
func Invalid(format string, args ...any) error { return wrap(ErrInvalid, format, args) }

// Unavailable returns an error of kind ErrUnavailable with the formatted detail.
func Unavailable(format string, args ...any) error { return wrap(ErrUnavailable, format, args) }

// IsNotFound reports whether err is of kind ErrNotFound.
func IsNotFound(err error) bool { return errors.Is(err, ErrNotFound) }

// IsConflict reports whether err is of kind ErrConflict.
func IsConflict(err error) bool { return errors.Is(err, ErrConflict) }

// IsInvalid reports whether err is of kind ErrInvalid.
func IsInvalid(err error) bool { return errors.Is(err, ErrInvalid) }

// IsUnavailable reports whether err is of kind ErrUnavailable.
func IsUnavailable(err error) bool { return errors.Is(err, ErrUnavailable) }

func wrap(kind error, format string, args []any) error {
	return &kinded{kind: kind, err: fmt.Errorf(format, args...)}
}

// kinded prints only its detail (the kind is for programs, the detail for people).
type kinded struct {
	kind error
	err  error
}

func (k *kinded) Error() string   { return k.err.Error() }
func (k *kinded) Unwrap() []error { return []error{k.kind, k.err} }
