package records_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/shizu-gpu/shizu/services/scheduler/ports"
	"github.com/shizu-gpu/shizu/services/scheduler/ports/porttest"
	"github.com/shizu-gpu/shizu/services/scheduler/records"
	"github.com/shizu-gpu/shizu/shared/testkit"
)

func TestTheRedisRecordsKeepTheOutcomeRecordsContract(t *testing.T) {
	t.Parallel()
	srv := testkit.StartRedis(t)
	n := 0
	porttest.RunOutcomeRecordsContract(t, func(t *testing.T) ports.OutcomeRecords {
		n++
		return records.New(srv.Client(t), fmt.Sprintf("contract%d", n), time.Hour)
	})
}
