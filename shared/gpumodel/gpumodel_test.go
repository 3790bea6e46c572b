package gpumodel_test

import (
	"strings"
	"testing"

	shizuv1 "github.com/shizu-gpu/shizu/proto/shizu/v1"
	"github.com/shizu-gpu/shizu/shared/gpumodel"
)

func TestEveryTokenIsASubjectTokenNamingItsMemory(t *testing.T) {
	t.Parallel()
	for _, m := range gpumodel.All() {
		if err := shizuv1.ValidToken(m.Token); err != nil {
			t.Errorf("%s: %v", m.Token, err)
		}
		if !strings.HasSuffix(m.Token, "GB") || m.VRAMMiB <= 0 || m.MemoryBandwidthGBps <= 0 {
			t.Errorf("%s: token must end in its memory size and facts must be set: %+v", m.Token, m)
		}
	}
	if _, ok := gpumodel.Lookup(gpumodel.H100SXM80); !ok {
		t.Fatal("H100 missing")
	}
	if _, ok := gpumodel.Lookup("h100-sxm"); ok {
		t.Fatal("a token that is not a model's was found")
	}
}
