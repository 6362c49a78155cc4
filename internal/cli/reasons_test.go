package cli

import "github.com/inboxworker/inboxworker/inboxtype"

// Reasons of the bundled routes' domains, as tests of this package give them.
const (
	reasonUnknownOrder     inboxtype.Reason = "unknown_order"
	reasonProviderRejected inboxtype.Reason = "provider_rejected"
)
