package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// docBlocks returns the code blocks of a markdown file fenced with lang,
// in order.
func docBlocks(t *testing.T, path, lang string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range regexp.MustCompile("(?ms)^```"+lang+"\n(.*?)^```").FindAllSubmatch(b, -1) {
		out = append(out, string(m[1]))
	}
	if len(out) == 0 {
		t.Fatalf("%s has no %s blocks", path, lang)
	}
	return out
}

// TestIntegratorsDocRunsAgainstShizuDev runs docs/integrators.md's curl
// (every sh block, in order, as one script) and Python examples against a
// fresh shizu dev, from a folder whose .shizu is its data folder, as the
// page says; each must succeed and rent, follow, stop and read a rental.
func TestIntegratorsDocRunsAgainstShizuDev(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	for _, tool := range []string{"bash", "curl", "python3"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is needed to run docs/integrators.md's examples: apt-get install %s", tool, tool)
		}
	}
	if out, err := exec.Command("python3", "-c", "import requests").CombinedOutput(); err != nil {
		t.Fatalf("python3 cannot import requests (apt-get install python3-requests): %v\n%s", err, out)
	}
	doc := filepath.Join("..", "..", "docs", "integrators.md")
	sh := "set -eu\n" + strings.Join(docBlocks(t, doc, "sh"), "\n")
	py := strings.Join(docBlocks(t, doc, "python"), "\n")

	d := startDev(t, "-ephemeral", "-fleet", "rtx4090x8:1")
	work := t.TempDir()
	if err := os.Symlink(d.dir, filepath.Join(work, ".shizu")); err != nil {
		t.Fatal(err)
	}
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + work, "LANG=C.UTF-8"}
	runScript := func(name string, args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, args[0], args[1:]...)
		cmd.Dir, cmd.Env = work, env
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			t.Fatalf("docs/integrators.md's %s examples failed: %v\n%s", name, err, out.String())
		}
		t.Logf("%s examples:\n%s", name, out.String())
		return out.String()
	}
	out := runScript("curl", "bash", "-c", sh)
	for _, want := range []string{"rented r-", `"state":"stopped"`, `"field":"gpu_count"`, `"amount_micros"`, "model,plan,milli_gpu_seconds"} {
		if !strings.Contains(out, want) {
			t.Errorf("the curl examples' output does not say %q", want)
		}
	}
	// The Python example reads the URL and key from the environment, as
	// an integrator's program would; here from shizu dev's env file.
	vals := readEnvFile(filepath.Join(d.dir, "env"))
	env = append(env, envAPIURL+"="+vals[envAPIURL], envAPIKey+"="+vals[envAPIKey])
	out = runScript("Python", "python3", "-c", py)
	for _, want := range []string{"rented r-", "  running rtx4090x8-1", "ran on rtx4090x8-1 for", " stopped\n", "billed ", " USD"} {
		if !strings.Contains(out, want) {
			t.Errorf("the Python example's output does not say %q", want)
		}
	}
}
