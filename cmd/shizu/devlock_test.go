package main

import (
	"io"
	"os"
	"strconv"
	"strings"
	"testing"
)

func TestASecondShizuDevOnTheSameDataFolderIsRefused(t *testing.T) {
	dir := t.TempDir()
	first := newDevStack(t.Context(), devOptions{dataDir: dir}, io.Discard)
	if err := first.openDataDir(t.Context()); err != nil {
		t.Fatal(err)
	}
	second := newDevStack(t.Context(), devOptions{dataDir: dir}, io.Discard)
	err := second.openDataDir(t.Context())
	second.close()
	if err == nil {
		first.close()
		t.Fatal("a second shizu dev opened a data folder in use")
	}
	for _, want := range []string{dir, "in use by another shizu dev", "process " + strconv.Itoa(os.Getpid()), "-data"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	// Once the first stops, the folder is free again.
	first.close()
	third := newDevStack(t.Context(), devOptions{dataDir: dir}, io.Discard)
	if err := third.openDataDir(t.Context()); err != nil {
		t.Fatalf("after the first stopped: %v", err)
	}
	third.close()
}
