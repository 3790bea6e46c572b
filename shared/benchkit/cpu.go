package benchkit

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ProcessCPU is the CPU seconds this process has used so far, user and
// system.
func ProcessCPU() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// RedisCPU is the CPU seconds the env's redis-server has used so far,
// user and system (INFO cpu).
func (e *Env) RedisCPU(ctx context.Context) (float64, error) {
	info, err := e.Redis.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, fmt.Errorf("redis INFO cpu: %w", err)
	}
	var total float64
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (k != "used_cpu_sys" && k != "used_cpu_user") {
			continue
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, fmt.Errorf("redis INFO cpu %s: %w", k, err)
		}
		total += f
	}
	return total, nil
}

// CPUMeter measures the CPU of one phase: this process and redis-server.
type CPUMeter struct {
	env             *Env
	start           time.Time
	process, redis0 float64
}

// StartCPU starts measuring a phase.
func (e *Env) StartCPU(ctx context.Context) (*CPUMeter, error) {
	r, err := e.RedisCPU(ctx)
	if err != nil {
		return nil, err
	}
	return &CPUMeter{env: e, start: time.Now(), process: ProcessCPU(), redis0: r}, nil
}

// Stop ends the phase, which handled items.
func (m *CPUMeter) Stop(ctx context.Context, items int) (CPU, error) {
	wall := time.Since(m.start).Seconds()
	process := ProcessCPU() - m.process
	r, err := m.env.RedisCPU(ctx)
	if err != nil {
		return CPU{}, err
	}
	return CPU{Items: items, WallSeconds: wall, ProcessSeconds: process, RedisSeconds: r - m.redis0}, nil
}
