package bus

// Carried returns the event type of every Shizu subject.
func Carried() []SubjectEvent { return append([]SubjectEvent(nil), carried...) }
