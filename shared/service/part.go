package service

import "context"

// PartFunc adapts a stop function to a Part: the function finishes the
// part's in-flight work within ctx.
type PartFunc func(ctx context.Context) error

// Stop calls f.
func (f PartFunc) Stop(ctx context.Context) error { return f(ctx) }
