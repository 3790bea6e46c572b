package app

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/shizu-gpu/shizu/services/scheduler/placement"
)

// offers reads the instance types the autoscaler may provision from its
// policy file (the autoscaler's -policy, the same file): the fleet
// section's instance_types, each with its model, GPUs per node and zones
// (fleet.default_zone when it names none). Only those fields are read; the
// autoscaler validates the rest. No file: no offers, and a request is
// judged against the registered nodes alone.
func (c Config) offers() ([]placement.Offer, error) {
	if c.FleetPolicyPath == "" {
		return nil, nil
	}
	data, err := os.ReadFile(c.FleetPolicyPath)
	if err != nil {
		return nil, fmt.Errorf("scheduler.fleet-policy: %w", err)
	}
	var f struct {
		Fleet struct {
			InstanceTypes []struct {
				Name  string   `json:"name"`
				Model string   `json:"model"`
				GPUs  int      `json:"gpus"`
				Zones []string `json:"zones"`
			} `json:"instance_types"`
			DefaultZone string `json:"default_zone"`
		} `json:"fleet"`
	}
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("scheduler.fleet-policy %s: %w", c.FleetPolicyPath, err)
	}
	out := make([]placement.Offer, 0, len(f.Fleet.InstanceTypes))
	for i, t := range f.Fleet.InstanceTypes {
		zones := t.Zones
		if len(zones) == 0 && f.Fleet.DefaultZone != "" {
			zones = []string{f.Fleet.DefaultZone}
		}
		if t.Model == "" || t.GPUs < 1 || len(zones) == 0 {
			return nil, fmt.Errorf("scheduler.fleet-policy %s: fleet.instance_types[%d] (%q) needs a model, gpus >= 1 and a zone",
				c.FleetPolicyPath, i, t.Name)
		}
		out = append(out, placement.Offer{Name: t.Name, Model: t.Model, GPUs: t.GPUs, Zones: zones})
	}
	return out, nil
}
