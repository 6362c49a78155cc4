package notify

import "testing"

// TestMaskMessageID: a message id keeps its digits, a hash's or a counter's, but for a phone number,
// the recipient's in any of its forms shown as MaskPhone shows it, another as [number].
func TestMaskMessageID(t *testing.T) {
	t.Parallel()
	const to = "+8613800138000"
	masked := "86138****8000" // MaskPhone(to), the '+' the id's
	for _, tc := range []struct{ id, want string }{
		{"log-17333563ad1ca5ad", "log-17333563ad1ca5ad"},
		{"900619746936498440^0", "900619746936498440^0"},
		{"SM1234567890abcdef", "SM1234567890abcdef"},
		{"8613800138000-1", masked + "-1"},
		{"msg:13800138000:7", "msg:" + masked + ":7"},
		{"013800138000", masked},
		{"+8613800138000", "+" + masked},
		{"+8613900139000", "+[number]"},
		{"sms-8613900139000", "sms-[number]"},
		{"138001", "138001"},
	} {
		if got := maskMessageID(tc.id, to); got != tc.want {
			t.Errorf("maskMessageID(%q) = %q, want %q", tc.id, got, tc.want)
		}
	}
}
