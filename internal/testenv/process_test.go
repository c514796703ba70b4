package testenv

import "testing"

// FreePort never hands out a port twice within portHold, though nothing
// binds them: 300 random draws from its 10,000 ports would repeat one
// with a probability of about 99%.
func TestFreePortNotHandedOutTwice(t *testing.T) {
	seen := map[int]bool{}
	for range 300 {
		port, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		if port < freePortLow || port >= freePortHigh {
			t.Fatalf("FreePort returned %d, outside [%d, %d)", port, freePortLow, freePortHigh)
		}
		if seen[port] {
			t.Fatalf("FreePort handed out port %d twice", port)
		}
		seen[port] = true
	}
}
