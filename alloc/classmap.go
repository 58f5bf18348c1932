package alloc

import (
	"fmt"
	"math/bits"
)

// classMap indexes free ranges by TLSF size class: per class the id of a
// structure's root (a list head for TLSF, a treap root for best fit) and
// two levels of bitmaps of the non-empty classes, so the first class that
// can hold a size is found in constant time.
//
// The arrays have 64 first-level rows (tlsfFLCount are used; slBitmap
// 128, the rest empty) so that an index masked to 6 (7) bits needs no
// bounds check.
type classMap struct {
	flBitmap uint64
	slBitmap [128]uint32             // rows 64 and up are never set (see above)
	roots    [64 * tlsfSLCount]int32 // class (fl, sl) at classID(fl, sl)
}

// classID packs a class into the 11 bits a free node keeps (rangeNode.cls),
// so that removing the node need not compute its class again.
func classID(fl, sl int) uint16 { return uint16(fl<<tlsfSLLog2 | sl) }

// splitClass unpacks classID.
func splitClass(id uint16) (fl, sl int) {
	return int(id>>tlsfSLLog2) & 63, int(id) & (tlsfSLCount - 1)
}

// root returns the root slot of class (fl, sl); fl < 64, sl < tlsfSLCount.
func (c *classMap) root(fl, sl int) *int32 {
	return &c.roots[(fl&63)<<tlsfSLLog2|sl&(tlsfSLCount-1)]
}

// rootOf is root for a class as classID packs it: a free node's cls
// indexes the roots directly.
func (c *classMap) rootOf(cls uint16) *int32 { return &c.roots[cls&(64*tlsfSLCount-1)] }

// reset empties every class.
func (c *classMap) reset() {
	c.flBitmap = 0
	c.slBitmap = [128]uint32{}
	for i := range c.roots {
		c.roots[i] = nilID
	}
}

// mark records that class (fl, sl) is not empty.
func (c *classMap) mark(fl, sl int) {
	// The masks tell the compiler the shifts are in range (fl <
	// tlsfFLCount ≤ 64, sl < tlsfSLCount = 32), so it emits plain shifts.
	c.flBitmap |= 1 << (uint(fl) & 63)
	c.slBitmap[fl&63] |= 1 << (uint(sl) & 31)
}

// unmark records that class (fl, sl) became empty.
func (c *classMap) unmark(fl, sl int) {
	row := c.slBitmap[fl&63] &^ (1 << (uint(sl) & 31))
	c.slBitmap[fl&63] = row
	// Clear the first-level bit when the row emptied, without a branch:
	// on sizes that vary it is a coin toss, and a mispredicted branch
	// cost more than this whole function.
	c.flBitmap &^= uint64(b2u(row == 0)) << (uint(fl) & 63)
}

// b2u is 1 for true and 0 for false (the compiler makes it a SETcc).
func b2u(b bool) uint32 {
	if b {
		return 1
	}
	return 0
}

// above returns the first non-empty class after (fl, sl) in size order
// (fl < tlsfFLCount). Whether it lies in fl's own row or in a row above is
// a coin toss on sizes that vary: both are read, and one is selected
// without a branch. (The row above is slBitmap[64], always empty, when
// there is none; the masks' shifts stay below the width, which keeps the
// function within the inliner's budget.)
func (c *classMap) above(fl, sl int) (int, int, bool) {
	row := c.slBitmap[fl&63] & (^uint32(1) << (uint(sl) & 31))                 // bits sl+1..31
	upFl := bits.TrailingZeros64(c.flBitmap & (^uint64(1) << (uint(fl) & 63))) // 64 when no row above
	upRow := c.slBitmap[upFl&127]
	if row == 0 {
		fl, row = upFl, upRow
	}
	if row == 0 {
		return 0, 0, false
	}
	return fl, bits.TrailingZeros32(row), true
}

// highest returns the largest non-empty class.
func (c *classMap) highest() (fl, sl int, ok bool) {
	if c.flBitmap == 0 {
		return 0, 0, false
	}
	fl = log2(c.flBitmap)
	sl = bits.Len32(c.slBitmap[fl]) - 1
	return fl, sl, sl >= 0
}

// check verifies that the bitmaps agree with each other and with which
// classes have a root.
func (c *classMap) check(name string) error {
	for fl := 0; fl < tlsfFLCount; fl++ {
		if (c.flBitmap&(1<<fl) != 0) != (c.slBitmap[fl] != 0) {
			return fmt.Errorf("%s: first-level bit %d disagrees with its second-level bitmap %#x", name, fl, c.slBitmap[fl])
		}
		for sl := 0; sl < tlsfSLCount; sl++ {
			set, rooted := c.slBitmap[fl]&(1<<sl) != 0, *c.root(fl, sl) != nilID
			switch {
			case set && !rooted:
				return fmt.Errorf("%s: class (%d,%d): bitmap bit set but the class is empty", name, fl, sl)
			case !set && rooted:
				return fmt.Errorf("%s: class (%d,%d): bitmap bit clear but the class holds free ranges", name, fl, sl)
			}
		}
	}
	return nil
}
