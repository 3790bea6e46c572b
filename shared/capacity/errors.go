package capacity

import (
	"errors"
	"fmt"

	"github.com/shizu-gpu/shizu/shared/fault"
)

// The store's error taxonomy. Every error the store returns wraps one of
// these (test with errors.Is or the IsXxx helpers) and says which node,
// rental or GPU it is about. NotFound, Conflict, Invalid and Unavailable
// are the shared kinds of package fault, so every transport maps them the
// same way; Insufficient and Fenced are the store's own.
var (
	// ErrNotFound: the node or the allocation does not exist.
	ErrNotFound = fault.ErrNotFound
	// ErrConflict: the state moved under the caller — another replica won a
	// compare-and-set on the epoch, the node is draining, or it still holds
	// allocations. Re-read and retry.
	ErrConflict = fault.ErrConflict
	// ErrInsufficient: the node lacks the capacity asked for; the error is an
	// *InsufficientError that says which GPU and which resource.
	ErrInsufficient = errors.New("insufficient capacity")
	// ErrFenced: the node is dead or its epoch moved past the caller's; work
	// under the old epoch must stop.
	ErrFenced = errors.New("fenced")
	// ErrInvalid: the input failed validation; nothing was sent to Redis.
	ErrInvalid = fault.ErrInvalid
	// ErrUnavailable: Redis could not be reached or answered with an error.
	// A Reserve or Release that failed this way may or may not have been
	// applied; retrying the same rental id is safe.
	ErrUnavailable = fault.ErrUnavailable
)

// IsNotFound reports whether err wraps ErrNotFound.
func IsNotFound(err error) bool { return errors.Is(err, ErrNotFound) }

// IsConflict reports whether err wraps ErrConflict.
func IsConflict(err error) bool { return errors.Is(err, ErrConflict) }

// IsInsufficient reports whether err wraps ErrInsufficient.
func IsInsufficient(err error) bool { return errors.Is(err, ErrInsufficient) }

// IsFenced reports whether err wraps ErrFenced.
func IsFenced(err error) bool { return errors.Is(err, ErrFenced) }

// IsInvalid reports whether err wraps ErrInvalid.
func IsInvalid(err error) bool { return errors.Is(err, ErrInvalid) }

// IsUnavailable reports whether err wraps ErrUnavailable.
func IsUnavailable(err error) bool { return errors.Is(err, ErrUnavailable) }

// Resources named by InsufficientError.
const (
	ResourceCPU      = "cpu_milli"
	ResourceMemory   = "memory_mib"
	ResourceMilliGPU = "milli_gpu"
	ResourceVRAM     = "vram_mib"
	ResourceSharers  = "sharer_slots"
	// ResourceMIGInstance: the MIG instance named is held by another
	// allocation.
	ResourceMIGInstance = "mig_instance"
)

// InsufficientError says which resource of which GPU (or of the host) was
// short. It wraps ErrInsufficient.
type InsufficientError struct {
	Node     string
	GPU      int // -1 for the host's CPU and memory
	Resource string
	Free     int64
	Want     int64
}

func (e *InsufficientError) Error() string {
	where := fmt.Sprintf("node %s", e.Node)
	if e.GPU >= 0 {
		where = fmt.Sprintf("GPU %d of node %s", e.GPU, e.Node)
	}
	return fmt.Sprintf("%v: %s has %d %s free, want %d", ErrInsufficient, where, e.Free, e.Resource, e.Want)
}

// Unwrap returns ErrInsufficient.
func (e *InsufficientError) Unwrap() error { return ErrInsufficient }

// invalid wraps validation problems so that IsInvalid holds.
func invalid(problems ...error) error {
	if len(problems) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrInvalid, errors.Join(problems...))
}
