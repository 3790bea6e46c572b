package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// parseFlags parses args into fs. A mistake (an unknown flag, a bad value,
// a missing argument) is one line on stderr naming it, with the closest
// flag when one is near and where the help is, never the whole usage:
//
//	shizu rent: flag provided but not defined: -gpuz; did you mean -gpus? (see 'shizu rent -h')
//
// -h prints fs.Usage and returns flag.ErrHelp; a mistake returns its
// error; the caller exits 0 on help and 2 on a mistake.
func parseFlags(fs *flag.FlagSet, args []string, stderr io.Writer) error {
	usage := fs.Usage
	if usage == nil {
		usage = fs.PrintDefaults
	}
	fs.Usage = func() {}
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	fs.Usage = usage
	fs.SetOutput(stderr)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, flag.ErrHelp):
		usage()
		return err
	}
	fmt.Fprintf(stderr, "%s: %s%s %s\n", fs.Name(), err, didYouMean(fs, err), helpHint(fs.Name()))
	return err
}

// helpHint says where the flags of command are explained.
func helpHint(command string) string { return fmt.Sprintf("(see '%s -h')", command) }

// flagExit is the exit status of a parseFlags error: 0 for help, 2 for a
// mistake.
func flagExit(err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	return exitUsage
}

// didYouMean names the defined flag closest to the unknown one err names
// ("; did you mean -gpus?"), or "" when none is close.
func didYouMean(fs *flag.FlagSet, err error) string {
	name, ok := strings.CutPrefix(err.Error(), "flag provided but not defined: ")
	if !ok {
		return ""
	}
	name = strings.TrimLeft(name, "-")
	var names []string
	fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
	if best := closest(name, names); best != "" {
		return "; did you mean -" + best + "?"
	}
	return ""
}

// closest is the word of words nearest to w: within two edits, one that
// w is a prefix of, or a one-letter word w starts with ("-file" for "-f");
// "" when none is.
func closest(w string, words []string) string {
	// Scores are twice the edit distance, so the one-letter case ranks
	// after any word two edits away.
	best, bestDist := "", 6
	for _, c := range words {
		d := 2 * editDistance(w, c)
		if len(w) >= 2 && strings.HasPrefix(c, w) {
			d = min(d, 2)
		}
		if len(c) == 1 && strings.HasPrefix(w, c) {
			d = min(d, 5)
		}
		if d < bestDist {
			best, bestDist = c, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance of a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
