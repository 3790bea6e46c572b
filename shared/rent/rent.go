// Package rent is the vocabulary every Shizu service describes a GPU
// rental in: the Market a node (or a rental's requirement) is bought on,
// the Class a rental's plan gives it, the Health of a GPU, and money in
// micro-units, each with its one mapping to and from the event contract
// (proto/shizu/v1). Shizu (时租) is "rent by the hour"; these are the terms
// of renting, so the package is named after it.
//
// It is pure: it imports only the generated protobuf types, never NATS,
// Redis or the OTel SDK, so decision packages may use it.
package rent

import (
	"fmt"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
)

// Market is how a node is bought from its provider; as a rental's
// requirement, AnyMarket means either.
type Market string

// Markets.
const (
	AnyMarket Market = ""
	OnDemand  Market = "on-demand"
	Spot      Market = "spot"
)

// ParseMarket reads a market name ("on-demand" or "spot").
func ParseMarket(s string) (Market, error) {
	switch m := Market(s); m {
	case OnDemand, Spot:
		return m, nil
	}
	return AnyMarket, fmt.Errorf("market %q: want %q or %q", s, OnDemand, Spot)
}

// MarketOf is the event contract's market in these terms; an unset (or
// unknown) one is AnyMarket.
func MarketOf(m shizuv1.Market) Market {
	switch m {
	case shizuv1.Market_MARKET_ON_DEMAND:
		return OnDemand
	case shizuv1.Market_MARKET_SPOT:
		return Spot
	}
	return AnyMarket
}

// Proto is m in the event contract's terms; AnyMarket is unset.
func (m Market) Proto() shizuv1.Market {
	switch m {
	case OnDemand:
		return shizuv1.Market_MARKET_ON_DEMAND
	case Spot:
		return shizuv1.Market_MARKET_SPOT
	}
	return shizuv1.Market_MARKET_UNSPECIFIED
}

// Plan is the plan of a rental bought on m: spot on Spot, else on-demand.
func (m Market) Plan() shizuv1.Plan {
	if m == Spot {
		return shizuv1.Plan_PLAN_SPOT
	}
	return shizuv1.Plan_PLAN_ON_DEMAND
}

// Class is a rental's pricing class, from its plan. A higher class is
// placed first, moved first in a storm and preempted last; ClassUnknown
// (an unset plan) is below them all.
type Class int

// Classes, lowest first.
const (
	ClassUnknown Class = iota
	ClassSpot
	ClassOnDemand
	ClassReserved
)

// ClassOf is the class of a rental on plan p.
func ClassOf(p shizuv1.Plan) Class {
	switch p {
	case shizuv1.Plan_PLAN_SPOT:
		return ClassSpot
	case shizuv1.Plan_PLAN_ON_DEMAND:
		return ClassOnDemand
	case shizuv1.Plan_PLAN_RESERVED:
		return ClassReserved
	}
	return ClassUnknown
}

func (c Class) String() string {
	switch c {
	case ClassSpot:
		return "spot"
	case ClassOnDemand:
		return "on-demand"
	case ClassReserved:
		return "reserved"
	}
	return "unknown"
}

// ParsePlan reads a plan name as a tenant writes it: "on-demand" (also
// "ondemand", "on_demand"), "reserved" or "spot", any case.
func ParsePlan(s string) (shizuv1.Plan, error) {
	switch lower(s) {
	case "on-demand", "ondemand", "on_demand":
		return shizuv1.Plan_PLAN_ON_DEMAND, nil
	case "reserved":
		return shizuv1.Plan_PLAN_RESERVED, nil
	case "spot":
		return shizuv1.Plan_PLAN_SPOT, nil
	}
	return shizuv1.Plan_PLAN_UNSPECIFIED, fmt.Errorf("plan %q: want on-demand, reserved or spot", s)
}

func lower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c >= 'A' && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

// Health is whether a GPU takes new work, as its node agent last reported.
type Health string

// Healths. A GPU that was never reported on is Healthy.
const (
	Healthy  Health = "healthy"
	Degraded Health = "degraded"
	Failed   Health = "failed"
)

// HealthOf is the event contract's health in these terms; an unset or
// unknown one is not a health (false).
func HealthOf(h shizuv1.Health) (Health, bool) {
	switch h {
	case shizuv1.Health_HEALTH_HEALTHY:
		return Healthy, true
	case shizuv1.Health_HEALTH_DEGRADED:
		return Degraded, true
	case shizuv1.Health_HEALTH_FAILED:
		return Failed, true
	}
	return "", false
}

// Proto is h in the event contract's terms.
func (h Health) Proto() shizuv1.Health {
	switch h {
	case Healthy:
		return shizuv1.Health_HEALTH_HEALTHY
	case Degraded:
		return shizuv1.Health_HEALTH_DEGRADED
	case Failed:
		return shizuv1.Health_HEALTH_FAILED
	}
	return shizuv1.Health_HEALTH_UNSPECIFIED
}
