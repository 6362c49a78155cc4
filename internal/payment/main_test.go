package payment_test

import (
	"testing"

	"github.com/inboxworker/inboxworker/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }
