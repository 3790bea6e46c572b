package app

import (
	"errors"
	"maps"
	"testing"

	"github.com/shizu-gpu/shizu/services/autoscaler/fleet"
	"github.com/shizu-gpu/shizu/services/autoscaler/provider"
	"github.com/shizu-gpu/shizu/services/autoscaler/provider/providertest"
)

// sellingRTX is a fleet section that sells one instance type.
func sellingRTX() fleet.Config {
	return fleet.Config{InstanceTypes: []fleet.InstanceType{{Name: "rtx-box", Profile: "rtx4090x8", Model: "RTX4090-24GB", GPUs: 8}}}
}

func TestTheFleetProviderIsChosenFromTheDeps(t *testing.T) {
	t.Parallel()
	injected, built := providertest.NewMemory(), providertest.NewMemory()
	var asked []map[string]string
	newProvider := func(profiles map[string]string) (provider.Provider, error) {
		asked = append(asked, profiles)
		return built, nil
	}
	for _, c := range []struct {
		name  string
		deps  Deps
		fleet fleet.Config
		want  provider.Provider
		asked int
	}{
		{"an injected provider wins over the constructor", Deps{Provider: injected, NewProvider: newProvider}, sellingRTX(), injected, 0},
		{"the constructor builds one when the fleet sells instance types", Deps{NewProvider: newProvider}, sellingRTX(), built, 1},
		{"no instance types, no provider and no call", Deps{NewProvider: newProvider}, fleet.Config{}, nil, 0},
		{"nothing injected and no node-agent binary is no provider", Deps{}, sellingRTX(), nil, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			asked = nil
			got, parts, err := fleetProvider(DefaultConfig(), c.deps, c.fleet)
			if err != nil || len(parts) != 0 {
				t.Fatalf("fleetProvider: %v, %d parts, %v", got, len(parts), err)
			}
			if got != c.want {
				t.Fatalf("provider %v, want %v", got, c.want)
			}
			if len(asked) != c.asked {
				t.Fatalf("constructor called %d times, want %d", len(asked), c.asked)
			}
			if c.asked > 0 && !maps.Equal(asked[0], map[string]string{"rtx-box": "rtx4090x8"}) {
				t.Fatalf("constructor given %v, want the instance type's profile", asked[0])
			}
		})
	}
}

func TestAConstructorThatFailsFailsTheStart(t *testing.T) {
	t.Parallel()
	boom := errors.New("no fleet")
	_, _, err := fleetProvider(DefaultConfig(), Deps{NewProvider: func(map[string]string) (provider.Provider, error) { return nil, boom }}, sellingRTX())
	if !errors.Is(err, boom) {
		t.Fatalf("fleetProvider: %v, want %v", err, boom)
	}
}
