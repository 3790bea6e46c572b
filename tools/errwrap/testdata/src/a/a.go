package a

import (
	"errors"
	"fmt"
)

func Invalid(format string, args ...any) error { return fmt.Errorf(format, args...) }

func Logf(format string, args ...any) {}

type myErr struct{}

func (myErr) Error() string { return "mine" }

func calls(err error, format string) {
	_ = Invalid("decode: %v", err)                  // want `Invalid formats an error with %v, which flattens its chain: use %w`
	_ = Invalid("rental %s: %s", "r1", err)         // want `Invalid formats an error with %s`
	_ = Invalid("%d%% of %s: %+v", 5, "x", myErr{}) // want `Invalid formats an error with %v`
	_ = Invalid("decode: %w", err)
	_ = Invalid("rental %s: %v", "r1", err.Error())
	_ = Invalid("%*d: %w", 3, 4, err)
	_ = Invalid("%[1]v", err) // explicit indexes are skipped
	_ = Invalid(format, err)  // a non-constant format is skipped
	_ = fmt.Errorf("%v", err) // errorlint's job
	Logf("failed: %v", err)   // returns no error: a log line, not a wrap
	_ = errors.New("x")
}
