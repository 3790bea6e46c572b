package gpu

import (
	"fmt"
	"regexp"
	"strings"
)

var (
	nonToken  = regexp.MustCompile(`[^A-Z0-9-]+`)
	dashes    = regexp.MustCompile(`-+`)
	hasMemory = regexp.MustCompile(`\d+GB`)
)

// ModelToken normalizes an NVML product name into the model token that
// prices, bills and placement use, e.g. "NVIDIA H100 80GB HBM3" ->
// "H100-SXM5-80GB", "NVIDIA A100-PCIE-40GB" -> "A100-PCIE-40GB",
// "NVIDIA GeForce RTX 4090" -> "RTX4090-24GB". The result is always a
// valid subject token (letters, digits and dashes). vramMiB supplies the
// memory size when the name has none.
func ModelToken(productName string, vramMiB int64) string {
	name := strings.ToUpper(strings.TrimSpace(productName))
	for _, prefix := range []string{"MOCK ", "NVIDIA ", "GEFORCE "} {
		name = strings.TrimPrefix(name, prefix)
	}
	gb := (vramMiB + 512) / 1024
	switch {
	case strings.HasPrefix(name, "H100") && strings.Contains(name, "PCIE"):
		return fmt.Sprintf("H100-PCIE-%dGB", gb)
	case strings.HasPrefix(name, "H100") && strings.Contains(name, "NVL"):
		return fmt.Sprintf("H100-NVL-%dGB", gb)
	case strings.HasPrefix(name, "H100"):
		return fmt.Sprintf("H100-SXM5-%dGB", gb)
	case strings.HasPrefix(name, "H200") && strings.Contains(name, "NVL"):
		return fmt.Sprintf("H200-NVL-%dGB", roundGB(gb))
	case strings.HasPrefix(name, "H200"):
		return fmt.Sprintf("H200-SXM5-%dGB", roundGB(gb))
	case strings.HasPrefix(name, "RTX "):
		name = "RTX" + strings.TrimPrefix(name, "RTX ")
	}
	tok := dashes.ReplaceAllString(nonToken.ReplaceAllString(strings.ReplaceAll(name, " ", "-"), "-"), "-")
	tok = strings.Trim(tok, "-")
	if !hasMemory.MatchString(tok) && gb > 0 {
		tok = fmt.Sprintf("%s-%dGB", tok, gb)
	}
	if tok == "" {
		return "UNKNOWN"
	}
	return tok
}

// roundGB maps NVML's memory size to the marketed one where they differ
// (an H200 reports 141 GiB less reserved memory as about 140).
func roundGB(gb int64) int64 {
	if gb >= 139 && gb <= 144 {
		return 141
	}
	return gb
}

// Capabilities lists what a GPU can do, for matching
// RentalSpec.required_capabilities: "bf16" and "tf32" from compute
// capability 8.0, "fp8" from 8.9, "rt-cores" on GeForce/RTX cards, "mig"
// when MIG is supported, "cc" when confidential computing is enabled.
func Capabilities(ccMajor, ccMinor int, geforce, mig, tee bool) []string {
	var caps []string
	if ccMajor >= 8 {
		caps = append(caps, "bf16", "tf32")
	}
	if ccMajor > 8 || (ccMajor == 8 && ccMinor >= 9) {
		caps = append(caps, "fp8")
	}
	if geforce {
		caps = append(caps, "rt-cores")
	}
	if mig {
		caps = append(caps, "mig")
	}
	if tee {
		caps = append(caps, "cc")
	}
	return caps
}
