package pgtest_test

import (
	"testing"
	"time"

	"github.com/inboxworker/inboxworker/internal/pgtest"
)

func TestSchemaSpeed(t *testing.T) {
	start := time.Now()
	for i := 0; i < 10; i++ {
		_, drop, err := pgtest.NewSchema()
		if err != nil {
			t.Fatal(err)
		}
		drop()
	}
	t.Logf("per schema: %s", time.Since(start)/10)
}
