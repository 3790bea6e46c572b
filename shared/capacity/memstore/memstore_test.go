package memstore_test

import (
	"testing"

	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/capacity/capacitytest"
	"github.com/shizu-gpu/shizu/shared/capacity/memstore"
)

func TestMemstoreKeepsTheCapacityContract(t *testing.T) {
	t.Parallel()
	capacitytest.Run(t, func(*testing.T) capacity.Interface { return memstore.New() })
}
