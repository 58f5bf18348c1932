package graph

import (
	"fmt"
	"math"
)

// value is the statically known content of a small tensor, row-major:
// integers and booleans in i, floating-point numbers in f.
type value struct {
	float bool
	i     []int64
	f     []float64
}

func intValue(v []int64) *value     { return &value{i: v} }
func floatValue(v []float64) *value { return &value{float: true, f: v} }

func (v *value) len() int {
	if v.float {
		return len(v.f)
	}
	return len(v.i)
}

// float64At and int64At read element k converting between the two kinds.
func (v *value) float64At(k int) float64 {
	if v.float {
		return v.f[k]
	}
	return float64(v.i[k])
}

func (v *value) int64At(k int) (int64, bool) {
	if !v.float {
		return v.i[k], true
	}
	return floatToInt(v.f[k])
}

// floatToInt truncates toward zero; it fails for NaN and values outside the
// int64 range instead of producing an implementation-defined result.
func floatToInt(f float64) (int64, bool) {
	t := math.Trunc(f)
	if math.IsNaN(t) || t < -9.223372036854775e18 || t > 9.223372036854775e18 {
		return 0, false
	}
	return int64(t), true
}

// gather returns the elements of v at the given flat indices.
func (v *value) gather(idx []int) *value {
	if v.float {
		out := make([]float64, len(idx))
		for k, j := range idx {
			out[k] = v.f[j]
		}
		return floatValue(out)
	}
	out := make([]int64, len(idx))
	for k, j := range idx {
		out[k] = v.i[j]
	}
	return intValue(out)
}

// convert returns v as a value of element type dt (integers truncated toward
// zero, booleans normalized to 0/1), or nil when an element cannot be
// represented.
func (v *value) convert(dt DType) *value {
	n := v.len()
	if dt.IsFloat() {
		out := make([]float64, n)
		for k := range out {
			out[k] = v.float64At(k)
		}
		return floatValue(out)
	}
	out := make([]int64, n)
	for k := range out {
		x, ok := v.int64At(k)
		if !ok {
			return nil
		}
		switch dt {
		case Bool:
			if v.float {
				x = b2i(v.f[k] != 0)
			} else {
				x = b2i(x != 0)
			}
		case Int8:
			x = int64(int8(x))
		case Int16:
			x = int64(int16(x))
		case Int32:
			x = int64(int32(x))
		case Uint8:
			x = int64(uint8(x))
		case Uint16:
			x = int64(uint16(x))
		case Uint32:
			x = int64(uint32(x))
		}
		out[k] = x
	}
	return intValue(out)
}

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// strides returns row-major strides for shape.
func strides(shape []int64) []int64 {
	s := make([]int64, len(shape))
	acc := int64(1)
	for i := len(shape) - 1; i >= 0; i-- {
		s[i] = acc
		acc *= shape[i]
	}
	return s
}

// broadcastIndex maps every flat index of out to the flat index of the
// element of an operand of shape in that numpy broadcasting reads. out must
// be the broadcast of in with other shapes and have at most maxFold elements.
func broadcastIndex(out, in []int64) []int {
	n := product(out)
	idx := make([]int, n)
	inStr := strides(in)
	off := len(out) - len(in)
	outStr := strides(out)
	for k := int64(0); k < n; k++ {
		rem, j := k, int64(0)
		for d := range out {
			c := rem / outStr[d]
			rem %= outStr[d]
			if e := d - off; e >= 0 && in[e] != 1 {
				j += c * inStr[e]
			}
		}
		idx[k] = int(j)
	}
	return idx
}

// product multiplies dims that NumElements already accepted.
func product(shape []int64) int64 {
	n := int64(1)
	for _, d := range shape {
		n *= d
	}
	return n
}

// binaryFold evaluates an elementwise binary operator over broadcast values.
// It returns nil when the operator is not folded or an element is undefined
// (integer division by zero).
func binaryFold(op string, a, b *value, as, bs, out []int64) *value {
	ia, ib := broadcastIndex(out, as), broadcastIndex(out, bs)
	n := len(ia)
	switch op {
	case "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual":
		res := make([]int64, n)
		for k := range res {
			var c int
			if a.float || b.float {
				x, y := a.float64At(ia[k]), b.float64At(ib[k])
				c = cmpFloat(x, y)
			} else {
				x, y := a.i[ia[k]], b.i[ib[k]]
				c = cmpInt(x, y)
			}
			var r bool
			switch op {
			case "Equal":
				r = c == 0
			case "Less":
				r = c == -1
			case "LessOrEqual":
				r = c == -1 || c == 0
			case "Greater":
				r = c == 1
			default:
				r = c == 1 || c == 0
			}
			res[k] = b2i(r)
		}
		return intValue(res)
	case "And", "Or", "Xor":
		if a.float || b.float {
			return nil
		}
		res := make([]int64, n)
		for k := range res {
			x, y := a.i[ia[k]] != 0, b.i[ib[k]] != 0
			switch op {
			case "And":
				res[k] = b2i(x && y)
			case "Or":
				res[k] = b2i(x || y)
			default:
				res[k] = b2i(x != y)
			}
		}
		return intValue(res)
	}
	if a.float || b.float {
		res := make([]float64, n)
		for k := range res {
			x, y := a.float64At(ia[k]), b.float64At(ib[k])
			switch op {
			case "Add", "Sum":
				res[k] = x + y
			case "Sub":
				res[k] = x - y
			case "Mul":
				res[k] = x * y
			case "Div":
				res[k] = x / y
			case "Pow":
				res[k] = math.Pow(x, y)
			case "Max":
				res[k] = math.Max(x, y)
			case "Min":
				res[k] = math.Min(x, y)
			case "Mod":
				res[k] = math.Mod(x, y)
			default:
				return nil
			}
		}
		return floatValue(res)
	}
	res := make([]int64, n)
	for k := range res {
		x, y := a.i[ia[k]], b.i[ib[k]]
		switch op {
		case "Add", "Sum":
			res[k] = x + y
		case "Sub":
			res[k] = x - y
		case "Mul":
			res[k] = x * y
		case "Div":
			if y == 0 {
				return nil
			}
			res[k] = x / y // truncation, as ONNX runtimes do for integers
		case "Mod":
			if y == 0 {
				return nil
			}
			r := x % y
			if r != 0 && (r < 0) != (y < 0) {
				r += y // fmod=0: the result takes the divisor's sign
			}
			res[k] = r
		case "Max":
			res[k] = max(x, y)
		case "Min":
			res[k] = min(x, y)
		case "Pow":
			if y < 0 || y > 64 {
				return nil
			}
			p := int64(1)
			for range y {
				p *= x
			}
			res[k] = p
		default:
			return nil
		}
	}
	return intValue(res)
}

func cmpInt(x, y int64) int {
	switch {
	case x < y:
		return -1
	case x > y:
		return 1
	}
	return 0
}

// cmpFloat returns -1, 0 or 1, or 2 when either operand is NaN (no relation
// holds).
func cmpFloat(x, y float64) int {
	switch {
	case x < y:
		return -1
	case x > y:
		return 1
	case x == y:
		return 0
	}
	return 2
}

// unaryFold evaluates an elementwise unary operator, or returns nil.
func unaryFold(op string, a *value) *value {
	if !a.float {
		res := make([]int64, len(a.i))
		for k, x := range a.i {
			switch op {
			case "Neg":
				res[k] = -x
			case "Abs":
				if x < 0 {
					x = -x
				}
				res[k] = x
			case "Not":
				res[k] = b2i(x == 0)
			case "Sign":
				res[k] = int64(cmpInt(x, 0))
			case "Relu":
				res[k] = max(x, 0)
			case "Floor", "Ceil", "Round", "Identity":
				res[k] = x
			default:
				return nil
			}
		}
		return intValue(res)
	}
	res := make([]float64, len(a.f))
	for k, x := range a.f {
		switch op {
		case "Neg":
			res[k] = -x
		case "Abs":
			res[k] = math.Abs(x)
		case "Floor":
			res[k] = math.Floor(x)
		case "Ceil":
			res[k] = math.Ceil(x)
		case "Round":
			res[k] = math.RoundToEven(x)
		case "Sqrt":
			res[k] = math.Sqrt(x)
		case "Reciprocal":
			res[k] = 1 / x
		case "Relu":
			res[k] = math.Max(x, 0)
		case "Sign":
			switch {
			case x > 0:
				res[k] = 1
			case x < 0:
				res[k] = -1
			}
		case "Identity":
			res[k] = x
		default:
			return nil
		}
	}
	return floatValue(res)
}

// reduceFold evaluates ReduceSum/Prod/Max/Min over the given axes (sorted,
// normalized) of a value of shape in, producing shape out.
func reduceFold(op string, a *value, in []int64, axes []int, out []int64) *value {
	reduced := make([]bool, len(in))
	for _, ax := range axes {
		reduced[ax] = true
	}
	n := product(out)
	// Output index of every input element: drop (or zero) reduced dims.
	var keep []int64
	for d := range in {
		if !reduced[d] {
			keep = append(keep, in[d])
		}
	}
	kStr := strides(keep)
	inStr := strides(in)
	total := product(in)
	switch op {
	case "ReduceSum", "ReduceProd", "ReduceMax", "ReduceMin":
	default:
		return nil
	}
	acc := make([]float64, n)
	set := make([]bool, n)
	for k := int64(0); k < total; k++ {
		rem, o, kd := k, int64(0), 0
		for d := range in {
			c := rem / inStr[d]
			rem %= inStr[d]
			if !reduced[d] {
				o += c * kStr[kd]
				kd++
			}
		}
		x := a.float64At(int(k))
		switch {
		case !set[o]:
			acc[o], set[o] = x, true
		case op == "ReduceSum":
			acc[o] += x
		case op == "ReduceProd":
			acc[o] *= x
		case op == "ReduceMax":
			acc[o] = math.Max(acc[o], x)
		default:
			acc[o] = math.Min(acc[o], x)
		}
	}
	for o := range acc {
		if !set[o] { // empty reduction
			switch op {
			case "ReduceProd":
				acc[o] = 1
			case "ReduceMax":
				acc[o] = math.Inf(-1)
			case "ReduceMin":
				acc[o] = math.Inf(1)
			}
		}
	}
	v := floatValue(acc)
	if !a.float {
		iv := make([]int64, n)
		for o, x := range acc {
			var ok bool
			if iv[o], ok = floatToInt(x); !ok {
				return nil
			}
		}
		return intValue(iv)
	}
	return v
}

// permuteIndex returns, for each flat index of the transposed shape, the flat
// index of the source element.
func permuteIndex(in []int64, perm []int) []int {
	out := make([]int64, len(in))
	for i, p := range perm {
		out[i] = in[p]
	}
	n := product(out)
	inStr, outStr := strides(in), strides(out)
	idx := make([]int, n)
	for k := int64(0); k < n; k++ {
		rem, j := k, int64(0)
		for d := range out {
			c := rem / outStr[d]
			rem %= outStr[d]
			j += c * inStr[perm[d]]
		}
		idx[k] = int(j)
	}
	return idx
}

// sliceIndex returns the flat source indices of a strided slice: per axis,
// out[d] elements starting at start[d] with step step[d].
func sliceIndex(in, out, start, step []int64) []int {
	n := product(out)
	inStr, outStr := strides(in), strides(out)
	idx := make([]int, n)
	for k := int64(0); k < n; k++ {
		rem, j := k, int64(0)
		for d := range out {
			c := rem / outStr[d]
			rem %= outStr[d]
			j += (start[d] + c*step[d]) * inStr[d]
		}
		idx[k] = int(j)
	}
	return idx
}

// valueFromShape turns a shape into an int64 value.
func valueFromShape(s []int64) *value { return intValue(append([]int64{}, s...)) }

func (v *value) String() string {
	if v.float {
		return fmt.Sprint(v.f)
	}
	return fmt.Sprint(v.i)
}
