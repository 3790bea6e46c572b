// Command burst runs the 618 burst simulation against the autoscaler's
// policy and writes its tables (Markdown, to stdout) and a plot of the sale
// day (SVG):
//
//	go run ./services/autoscaler/cmd/burst -o burst.svg
package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/shizu-gpu/shizu/services/autoscaler/burst"
)

func main() {
	out := flag.String("o", "burst.svg", "SVG plot to write; empty skips it")
	every := flag.Duration("every", 3*time.Hour, "period of the table's rows")
	flag.Parse()
	if err := run(*out, *every); err != nil {
		fmt.Fprintf(os.Stderr, "burst: %v\n", err)
		os.Exit(1)
	}
}

func run(out string, every time.Duration) error {
	day, err := burst.Run(burst.SaleDay())
	if err != nil {
		return err
	}
	fmt.Println("## Sale day only")
	if err := day.WriteSummary(os.Stdout); err != nil {
		return err
	}
	elastic, err := burst.Run(burst.SaleDay().WithoutPeakWindow())
	if err != nil {
		return err
	}
	fmt.Println("## Sale day, elastic only (no pre-warm of the whole peak around the spikes)")
	if err := elastic.WriteSummary(os.Stdout); err != nil {
		return err
	}
	res, err := burst.Run(burst.Sale618())
	if err != nil {
		return err
	}
	fmt.Println("## Three pre-warm days and the sale day")
	if err := res.WriteTable(os.Stdout, every); err != nil {
		return err
	}
	if out == "" {
		return nil
	}
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	if err := day.WriteSVG(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
