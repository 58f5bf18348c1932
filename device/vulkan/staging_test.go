package vulkan

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// TestCopyParallel: every length (around the piece and split boundaries)
// copies exactly its bytes.
func TestCopyParallel(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	src := make([]byte, 9<<20+123)
	for i := range src {
		src[i] = byte(r.Uint32())
	}
	for _, n := range []int{0, 1, 1<<20 - 1, 1 << 20, 2<<20 - 1, 2 << 20, 2<<20 + 1, 3<<20 + 7, 4 << 20, 4<<20 + 3, 9<<20 + 123} {
		dst := make([]byte, n+2)
		dst[n], dst[n+1] = 0xAA, 0xBB
		copyParallel(dst[:n], src[:n])
		if !bytes.Equal(dst[:n], src[:n]) || dst[n] != 0xAA || dst[n+1] != 0xBB {
			t.Fatalf("copyParallel of %d bytes", n)
		}
	}
}
