package app

import "testing"

// A webhook never reaches the platform's own network: the dial guard
// refuses every non-public address it is handed (the resolved one, so a
// name cannot route around it), loopback only where it is allowed.
func TestAWebhookDialReachesPublicAddressesOnly(t *testing.T) {
	t.Parallel()
	cases := []struct {
		address       string
		allowLoopback bool
		refused       bool
	}{
		{"93.184.216.34:443", false, false},
		{"[2606:2800:220:1:248:1893:25c8:1946]:443", false, false},
		{"127.0.0.1:8080", false, true},
		{"127.0.0.1:8080", true, false},
		{"[::1]:443", false, true},
		{"10.0.0.5:443", false, true},
		{"172.16.3.4:443", true, true},
		{"192.168.1.1:443", false, true},
		{"169.254.169.254:80", false, true}, // cloud metadata
		{"[fe80::1]:443", false, true},
		{"[fd00::1]:443", false, true},
		{"0.0.0.0:443", false, true},
		{"[::ffff:10.1.2.3]:443", false, true},
		{"224.0.0.1:443", false, true},
		{"not-an-address", false, true},
	}
	for _, c := range cases {
		err := hookDialGuard(c.allowLoopback)("tcp", c.address, nil)
		if (err != nil) != c.refused {
			t.Errorf("dial %s (loopback allowed %v): %v, want refused %v", c.address, c.allowLoopback, err, c.refused)
		}
	}
}
