"""ONNX operators the TensorRT 10.3 ONNX parser accepts (default domain), for `specrt inspect`.

Our own list, written from the support matrix of onnx-tensorrt's docs/operators.md (release
10.1-GA, the newest tagged matrix we could read; TensorRT 10.3 — JetPack 6 — parses at least
these, opset 9..20). Ops the matrix marks unsupported are simply absent. Restrictions the
matrix states that a static check can see are in RESTRICTED_AXES_INPUT / checked in lint.py.
"""

TRT_VERSION = "10.3"
MAX_OPSET = 20

SUPPORTED_OPS = frozenset("""
Abs Acos Acosh Add And ArgMax ArgMin Asin Asinh Atan Atanh AveragePool BatchNormalization
Cast CastLike Ceil Celu Clip Concat Constant ConstantOfShape Conv ConvTranspose Cos Cosh
CumSum DeformConv DepthToSpace DequantizeLinear Div Dropout Einsum Elu Equal Erf Exp Expand
EyeLike Flatten Floor Gather GatherElements GatherND Gelu Gemm GlobalAveragePool GlobalLpPool
GlobalMaxPool Greater GreaterOrEqual GridSample GroupNormalization GRU HardSigmoid HardSwish
Hardmax Identity If ImageScaler InstanceNormalization IsInf IsNaN LayerNormalization
LeakyRelu Less LessOrEqual Log LogSoftmax Loop LRN LSTM LpNormalization LpPool MatMul Max
MaxPool Mean MeanVarianceNormalization Min Mish Mod Mul Neg NonMaxSuppression NonZero Not
OneHot Or Pad ParametricSoftplus Pow PRelu QuantizeLinear RandomNormal RandomNormalLike
RandomUniform RandomUniformLike Range Reciprocal ReduceL1 ReduceL2 ReduceLogSum
ReduceLogSumExp ReduceMax ReduceMean ReduceMin ReduceProd ReduceSum ReduceSumSquare Relu
Reshape Resize ReverseSequence RNN RoiAlign Round ScaledTanh Scan Scatter ScatterElements
ScatterND Selu Shape Shrink Sigmoid Sign Sin Sinh Size Slice Softmax Softplus Softsign
SpaceToDepth Split Sqrt Squeeze Sub Sum Tan Tanh ThresholdedRelu Tile TopK Transpose Trilu
Unsqueeze Upsample Where Xor
""".split())

# Parsed by TensorRT, but our deployment policy forbids them in the default export: control
# flow stops TensorRT from fusing across the branch and is fragile with dynamic shapes.
CONTROL_FLOW_OPS = frozenset({"If", "Loop", "Scan"})

# Ops whose `axes` (or, for Slice, starts/ends/axes/steps) input TensorRT needs as an
# initializer or Constant: input index -> what it is.
RESTRICTED_AXES_INPUT = {
    **{op: 1 for op in ("Squeeze", "Unsqueeze", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp",
                        "ReduceMax", "ReduceMean", "ReduceMin", "ReduceProd", "ReduceSum", "ReduceSumSquare")},
    "Slice": 3,
    "Pad": 3,
    "CumSum": 1,
}

# Newer-stack ops an `--opset 23` export may contain, with the TensorRT that parses them.
NEWER_STACK_OPS = {
    "Attention": "a TensorRT whose ONNX parser reads opset 23",
    "RMSNormalization": "a TensorRT whose ONNX parser reads opset 23",
    "RotaryEmbedding": "a TensorRT whose ONNX parser reads opset 23",
    "TensorScatter": "TensorRT >= 10.15 (KVCacheUpdate)",
}
