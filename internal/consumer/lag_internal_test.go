package consumer

import "testing"

// TestMemberHost: the host a partition's owner is shown with is the instance's address, whatever
// form the broker gives it in: Kafka's "/address", or the address and port of the connection.
func TestMemberHost(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"/10.0.0.7", "10.0.0.7"},
		{"127.0.0.1:56662", "127.0.0.1"},
		{"/10.0.0.7:40112", "10.0.0.7"},
		{"[::1]:9092", "::1"},
		{"/fe80::1", "fe80::1"},
		{"worker-3.example", "worker-3.example"},
		{"", ""},
	} {
		if got := memberHost(tc.in); got != tc.want {
			t.Errorf("memberHost(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
