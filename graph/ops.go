package graph

// Operator classes that memory planning relies on. Both take an operator
// type of the default ONNX domain; other domains are never classified.

var viewOps = setOf("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout")

var elementwiseOps = setOf(
	// unary
	"Abs", "Acos", "Acosh", "Asin", "Asinh", "Atan", "Atanh", "Ceil", "Cos", "Cosh", "Elu", "Erf", "Exp",
	"Floor", "HardSigmoid", "HardSwish", "LeakyRelu", "Log", "Neg", "Reciprocal", "Relu", "Round", "Selu",
	"Sigmoid", "Sign", "Sin", "Sinh", "Softplus", "Softsign", "Sqrt", "Tan", "Tanh", "ThresholdedRelu", "Celu",
	"Gelu", "Mish", "Shrink", "Clip", "Not", "IsNaN", "IsInf", "Cast", "BitwiseNot",
	// broadcasting binary and variadic
	"Add", "Sub", "Mul", "Div", "Pow", "Mod", "PRelu", "Max", "Min", "Sum", "Mean", "Equal", "Less",
	"LessOrEqual", "Greater", "GreaterOrEqual", "And", "Or", "Xor", "BitShift", "BitwiseAnd", "BitwiseOr",
	"BitwiseXor", "Where",
	// per-channel affine in inference
	"BatchNormalization",
)

// IsView reports whether output 0 of op holds exactly the bytes of input 0
// in the same order (a reshape of the same elements, or a copy an engine can
// skip), in inference: Reshape, Flatten, Squeeze, Unsqueeze, Identity and
// Dropout.
func IsView(op string) bool { return viewOps[op] }

// IsElementwise reports whether each element of op's output 0 is computed
// only from the input elements at the same (broadcast) position, so that the
// output may be written over an input of the same byte size that nothing
// reads afterwards.
func IsElementwise(op string) bool { return elementwiseOps[op] }
