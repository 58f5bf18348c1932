package alloc

import (
	"fmt"
	"math/bits"
)

// classMap indexes free ranges by TLSF size class: per class the id of a
// structure's root (a list head for TLSF, a treap root for best fit) and
// two levels of bitmaps of the non-empty classes, so the first class that
// can hold a size is found in constant time.
type classMap struct {
	flBitmap uint64
	slBitmap [tlsfFLCount]uint32
	roots    [tlsfFLCount][tlsfSLCount]int32
}

// reset empties every class.
func (c *classMap) reset() {
	c.flBitmap = 0
	c.slBitmap = [tlsfFLCount]uint32{}
	for fl := range c.roots {
		for sl := range c.roots[fl] {
			c.roots[fl][sl] = nilID
		}
	}
}

// mark records that class (fl, sl) is not empty.
func (c *classMap) mark(fl, sl int) {
	c.flBitmap |= 1 << fl
	c.slBitmap[fl] |= 1 << sl
}

// unmark records that class (fl, sl) became empty.
func (c *classMap) unmark(fl, sl int) {
	c.slBitmap[fl] &^= 1 << sl
	if c.slBitmap[fl] == 0 {
		c.flBitmap &^= 1 << fl
	}
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
			set, rooted := c.slBitmap[fl]&(1<<sl) != 0, c.roots[fl][sl] != nilID
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
