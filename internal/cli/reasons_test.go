package cli

import "github.com/inboxworker/inboxworker/internal/fault"

// Reasons of the bundled routes' domains, as tests of this package give them.
const (
	reasonUnknownOrder     fault.Reason = "unknown_order"
	reasonProviderRejected fault.Reason = "provider_rejected"
)
