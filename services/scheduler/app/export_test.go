package app

// SetAfterReserve installs the failpoint between a round's reservations
// and the record of their outcomes (see Scheduler.afterReserve).
func SetAfterReserve(s *Scheduler, hook func(rentals []string) error) { s.afterReserve = hook }
