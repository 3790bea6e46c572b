package capacity_test

import (
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/shizu-gpu/shizu/shared/capacity"
	"github.com/shizu-gpu/shizu/shared/capacity/capacitytest"
	"github.com/shizu-gpu/shizu/shared/testkit"
)

func TestRedisStoreKeepsTheCapacityContract(t *testing.T) {
	t.Parallel()
	rdb := testkit.StartRedis(t).Client(t)
	var n atomic.Int64
	capacitytest.Run(t, func(t *testing.T) capacity.Interface {
		s, err := capacity.New(rdb, capacity.WithPrefix(fmt.Sprintf("contract:%d", n.Add(1))))
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}
