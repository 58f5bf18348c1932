package fleet

import (
	"fmt"
	"testing"
	"time"
)

// FuzzGrants builds members from the fuzzer's bytes (minimum, whole-resident
// budget, activity, priority, keep-alive, last use, current grant) and a
// budget, and checks the grants against the package's rules: every member
// its minimum and at most what keeps it whole; together within the budget;
// a member idle past its keep-alive at its minimum; and no kept idle member
// above its minimum while an active one is below its whole (the active
// come first), whatever the order or the numbers.
func FuzzGrants(f *testing.F) {
	f.Add([]byte{3, 10, 1, 1, 0, 0, 5, 20, 0, 1, 1, 3}, uint64(25))
	f.Add([]byte{1, 2, 0, 2, 1, 9, 1, 2, 1, 2, 0, 0, 1, 9, 1, 1, 0, 0}, uint64(4))
	f.Fuzz(func(t *testing.T, data []byte, budget uint64) {
		now := time.Unix(1000, 0)
		fl := New(0, Options{Now: func() time.Time { return now }})
		var need uint64
		for i := 0; i+6 <= len(data) && len(fl.members) < 8; i += 6 {
			b := data[i : i+6]
			m := &member{m: Model{Name: fmt.Sprint(i), Priority: 1 + float64(b[3]%3)}, min: uint64(b[0]) << 20}
			m.full = m.min + uint64(b[1])<<20
			m.active = int(b[2] % 2)
			m.m.KeepAlive = time.Duration(int(b[4]%4)-1) * time.Second // -1 s (forever), 0, 1 s, 2 s
			if m.m.KeepAlive == 0 {
				m.m.KeepAlive = time.Second
			}
			m.lastUse = now.Add(-time.Duration(b[5]%4) * time.Second)
			m.grant = m.min + uint64(b[5])<<18
			fl.members = append(fl.members, m)
			need += m.min
		}
		if len(fl.members) == 0 {
			return
		}
		fl.budget = need + budget%(64<<20)
		g := fl.grantsLocked()
		var sum uint64
		kept := func(m *member) bool {
			return m.active > 0 || m.m.KeepAlive < 0 || now.Sub(m.lastUse) < m.m.KeepAlive
		}
		starved := false
		for i, m := range fl.members {
			sum += g[i]
			if g[i] < m.min || g[i] > max(m.full, m.min) {
				t.Fatalf("member %d: grant %d outside [%d, %d]", i, g[i], m.min, m.full)
			}
			if !kept(m) && g[i] != m.min {
				t.Fatalf("member %d idle past its keep-alive holds %d above its minimum %d", i, g[i], m.min)
			}
			if m.active > 0 && g[i] < m.full {
				starved = true
			}
		}
		if sum > fl.budget {
			t.Fatalf("grants %d above the budget %d", sum, fl.budget)
		}
		if starved {
			for i, m := range fl.members {
				if m.active == 0 && g[i] > m.min {
					t.Fatalf("idle member %d holds %d above its minimum while an active one is short", i, g[i]-m.min)
				}
			}
		} else if sum < fl.budget {
			// Room left: every kept member is whole.
			for i, m := range fl.members {
				if kept(m) && g[i] < m.full {
					t.Fatalf("member %d short of whole (%d of %d) with %d bytes left", i, g[i], m.full, fl.budget-sum)
				}
			}
		}
	})
}
