package ledger

import "time"

// Parking is what metering does with a placement whose start or stop it
// has merged but whose RentalScheduled (what the run is priced by) it has
// not seen.
type Parking int

// The parkings.
const (
	// NotParked: the segment is scheduled, or no start or stop is known.
	NotParked Parking = iota
	// Parked: it waits for its schedule, within the grace.
	Parked
	// GiveUp: the grace has passed; it cannot be billed.
	GiveUp
)

// ParkedSince is the latest billing time a parked segment's events name
// (the start, the stop's started_at and stopped_at, by the node's clock),
// and whether the segment is parked at all.
func ParkedSince(st SegmentState) (time.Time, bool) {
	if st.Scheduled {
		return time.Time{}, false
	}
	var since time.Time
	for _, t := range []time.Time{st.StartedAt, st.StoppedStartedAt, st.StoppedAt} {
		if t.After(since) {
			since = t
		}
	}
	return since, !since.IsZero()
}

// ParkingOf says whether st is parked and whether to give up on it.
// cutoff is Cutoff(now, watermark): every rental event stored before it
// has been handled. The scheduler publishes a RentalScheduled before the
// node is told to start, so it is stored before the start, and the stop
// comes after both; once cutoff is grace past the parked events' times the
// schedule would have been handled if the stream held it. The grace also
// absorbs how far the nodes' clocks run ahead of the NATS server's.
func ParkingOf(st SegmentState, cutoff time.Time, grace time.Duration) Parking {
	since, parked := ParkedSince(st)
	switch {
	case !parked:
		return NotParked
	case cutoff.Before(since.Add(grace)):
		return Parked
	}
	return GiveUp
}
