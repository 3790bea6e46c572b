package main

import (
	"testing"

	"golang.org/x/tools/go/analysis/analysistest"
)

func TestAnErrorFormattedWithoutWIsReportedAndOneWrappedIsNot(t *testing.T) {
	analysistest.Run(t, analysistest.TestData(), Analyzer, "a")
}
