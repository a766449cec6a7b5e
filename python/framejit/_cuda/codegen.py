"""CUDA C++ source for one fused group: one thread per output element in a grid-stride loop.

Sizes, strides and the element count are baked into the source as constants (the native program
the kernel belongs to is keyed on exact sizes, strides and dtypes, so they cannot change under
it). The iteration space is the group's output shape with dimensions reordered by the first
output's strides (outermost first), size-1 dimensions dropped and neighbours that every operand
walks contiguously merged; an operand laid out like the merged space is indexed by the loop index
itself, any other one (broadcast, transposed, sliced) by coordinates. When every operand is
indexed linearly (or is a single broadcast element), a vector loop moves 16 bytes per access
for the widest operand while all pointers are aligned (checked in the kernel), and a scalar loop
finishes the tail.

fp16 / bf16 values are loaded into float, computed in float and rounded once when stored (or by
an explicit cast); conversions are the kernel's own helpers (PTX cvt for fp16, bit operations for
bf16), so the source needs no header and NVRTC no include path.
"""
import hashlib
from dataclasses import dataclass, field
from typing import Dict, List, Sequence, Tuple

import torch

from .ops import DTYPES, OPS, Emit, compute_dtype, ctype, literal, params

BLOCK = 256  # threads per block, baked into __launch_bounds__
_NARROW = ("bool", "signed char", "unsigned char", "short")

SNIPPETS: Dict[str, str] = {
    "fj_half": """\
__device__ __forceinline__ float fj_h2f(unsigned short h) {
  float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f;
}
__device__ __forceinline__ unsigned short fj_f2h(float f) {
  unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;
}
__device__ __forceinline__ float fj_round_h(float f) { return fj_h2f(fj_f2h(f)); }
""",
    "fj_bf16": """\
__device__ __forceinline__ float fj_b2f(unsigned short b) {
  return __uint_as_float(((unsigned int)b) << 16);
}
__device__ __forceinline__ unsigned short fj_f2b(float f) {  // round to nearest even
  unsigned int u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);  // NaN
  return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
__device__ __forceinline__ float fj_round_b(float f) { return fj_b2f(fj_f2b(f)); }
""",
    "fj_relu": """\
template <typename T> __device__ __forceinline__ T fj_relu(T x) {
  return (x != x || x > T(0)) ? x : T(0);  // NaN stays NaN, as torch.relu
}
""",
    "fj_minmax": """\
template <typename T> __device__ __forceinline__ T fj_max(T a, T b) { return (a != a || a > b) ? a : b; }
template <typename T> __device__ __forceinline__ T fj_min(T a, T b) { return (a != a || a < b) ? a : b; }
""",
    "fj_vec": """\
template <typename T, int N> struct alignas(sizeof(T) * N) fj_vec { T v[N]; };
""",
}
_SNIPPET_OF = {"fj_max": "fj_minmax", "fj_min": "fj_minmax", "fj_h2f": "fj_half",
               "fj_f2h": "fj_half", "fj_b2f": "fj_bf16", "fj_f2b": "fj_bf16"}


@dataclass
class Operand:
    shape: Tuple[int, ...]
    stride: Tuple[int, ...]
    dtype: torch.dtype


@dataclass
class Kernel:
    """A generated kernel: ``source`` compiles with NVRTC alone; ``body`` is the kernel function
    without the helpers (``helpers``: the SNIPPETS keys it needs, in order)."""
    name: str
    source: str
    body: str
    helpers: List[str]
    numel: int
    work_items: int  # threads that have work: vectors in the vector loop, else elements
    outputs: List[Operand]
    inputs: List[Operand]
    ops: List[str]
    vector: int = 1
    notes: Dict[str, object] = field(default_factory=dict)

    def grid(self, max_blocks: int) -> int:
        return max(1, min(-(-self.work_items // BLOCK), max_blocks))


def operand_of(val) -> Operand:
    return Operand(tuple(int(s) for s in val.shape), tuple(int(s) for s in val.stride()), val.dtype)


def _broadcast_strides(op: Operand, shape: Sequence[int]) -> List[int]:
    pad = len(shape) - len(op.shape)
    strides = []
    for d, size in enumerate(shape):
        if d < pad or op.shape[d - pad] == 1 or size == 1:
            strides.append(0)
        else:
            strides.append(op.stride[d - pad])
    return strides


def iteration_space(shape, operands: List[Operand]):
    """(sizes, strides per operand) after reordering by the first operand's strides, dropping
    size-1 dimensions and merging dimensions every operand walks contiguously."""
    all_strides = [_broadcast_strides(op, shape) for op in operands]
    dims = [d for d in range(len(shape)) if shape[d] != 1]
    dims.sort(key=lambda d: -all_strides[0][d])  # stable: ties keep their order
    sizes = [shape[d] for d in dims]
    strides = [[s[d] for d in dims] for s in all_strides]
    d = len(sizes) - 1
    while d > 0:  # merge d-1 into d when every operand steps over d exactly
        if all(s[d - 1] == s[d] * sizes[d] for s in strides):
            sizes[d - 1:d + 1] = [sizes[d - 1] * sizes[d]]
            for s in strides:
                s[d - 1:d + 1] = [s[d]]
        d -= 1
    return sizes, strides


def _contiguous(sizes) -> List[int]:
    out, step = [], 1
    for size in reversed(sizes):
        out.append(step)
        step *= size
    return out[::-1]


class _Writer:
    def __init__(self):
        self.needs: set = set()

    def need(self, name):
        self.needs.add(_SNIPPET_OF.get(name, name))
        return name

    def load(self, expr: str, dtype) -> str:
        if dtype == torch.float16:
            return f"{self.need('fj_h2f')}({expr})"
        if dtype == torch.bfloat16:
            return f"{self.need('fj_b2f')}({expr})"
        if dtype == torch.bool:
            return f"({expr} != 0)"
        return expr

    def store(self, expr: str, dtype) -> str:
        if dtype == torch.float16:
            return f"{self.need('fj_f2h')}({expr})"
        if dtype == torch.bfloat16:
            return f"{self.need('fj_f2b')}({expr})"
        if dtype == torch.bool:
            return f"(unsigned char)({expr})"
        return expr

    def convert(self, expr: str, src, dst) -> str:
        """A value of dtype ``src`` as dtype ``dst`` (rounded for fp16/bf16, truncated for ints)."""
        if src == dst:
            return expr
        if dst == torch.bool:
            return f"({expr} != 0)"
        if dst in (torch.float16, torch.bfloat16):
            value = expr if ctype(src) == "float" else f"(float)({expr})"
            rounding = "fj_round_h" if dst == torch.float16 else "fj_round_b"
            self.need("fj_half" if dst == torch.float16 else "fj_bf16")
            return f"{rounding}({value})"
        if ctype(src) == ctype(dst):
            return expr  # fp16/bf16 -> float32: already a float holding the exact value
        return f"({ctype(dst)})({expr})"


def generate(group) -> Kernel:
    """The kernel of a fusion group (``fusion.Group``: members, inputs, outputs, shape)."""
    w = _Writer()
    members = list(group.nodes)
    outputs = [operand_of(n.meta["val"]) for n in group.outputs]
    inputs = [operand_of(n.meta["val"]) for n in group.inputs]
    shape = tuple(group.shape)
    numel = 1
    for size in shape:
        numel *= size
    sizes, strides = iteration_space(shape, outputs + inputs)
    contiguous = _contiguous(sizes)
    linear = [s == contiguous for s in strides]
    uniform = [all(x == 0 for x in s) for s in strides]
    largest = max([numel] + [sum((n - 1) * x for n, x in zip(sizes, s)) + 1 for s in strides])
    wide = numel >= 2 ** 31 - 2 ** 28 or largest >= 2 ** 31
    index_t, suffix = ("unsigned long long", "ull") if wide else ("unsigned int", "u")

    # Element-wise body: loads of the inputs, one line per member, values of the outputs.
    var = {}
    lines = []
    for j, node in enumerate(group.inputs):
        var[node] = f"a{j}"
    for k, node in enumerate(members):
        op = OPS[node.target]
        bound = params(node)
        dtype = compute_dtype(node, op)
        operands = []
        for name in op.operands:
            want = torch.bool if name in op.conditions else dtype
            value = bound[name]
            if isinstance(value, torch.fx.Node):
                operands.append(w.convert(var[value], value.meta["val"].dtype, want))
            else:
                operands.append(literal(value, want))
        emit = Emit(operands, bound, dtype, set())
        expr = op.emit(emit)
        for helper in emit.needs:
            w.need(helper)
        out = node.meta["val"].dtype
        if op.promote:
            dtype = torch.bool
        if ctype(out) in _NARROW and not (op.promote and out == torch.bool):
            expr = f"({ctype(out)})({expr})"  # C computes these in int: wrap around as eager
        elif dtype != out:
            expr = w.convert(expr, dtype, out)
        var[node] = f"t{k}"
        lines.append(f"const {ctype(out)} t{k} = {expr};  // {node.target.__name__}")

    def body(load, store, indent):
        pad = " " * indent
        text = []
        for j, node in enumerate(group.inputs):
            dtype = node.meta["val"].dtype
            text.append(f"{pad}const {ctype(dtype)} a{j} = {w.load(load(j), dtype)};")
        text += [pad + line for line in lines]
        for j, node in enumerate(group.outputs):
            text.append(f"{pad}{store(j)} = {w.store(var[node], node.meta['val'].dtype)};")
        return text

    operands = outputs + inputs
    n_out = len(outputs)

    def pointer(i):
        return f"out{i}" if i < n_out else f"in{i - n_out}"

    def offset(i):
        if uniform[i]:
            return "0"
        if linear[i]:
            return "i"
        terms = [f"c{d}" if s == 1 else f"c{d} * {s}{suffix}"
                 for d, s in enumerate(strides[i]) if s != 0]
        return " + ".join(terms)

    vector = 1
    if numel > 1 and all(li or un for li, un in zip(linear, uniform)):
        widest = max(DTYPES[op.dtype][2] for op, un in zip(operands, uniform) if not un)
        vector = max(1, min(8, 16 // widest))
    params_text = []
    for i, op in enumerate(operands):
        storage = DTYPES[op.dtype][0]
        const = "" if i < n_out else "const "
        params_text.append(f"{const}{storage}* __restrict__ {pointer(i)}")
    src = []
    src.append(f"extern \"C\" __global__ void __launch_bounds__({BLOCK}) KERNEL_NAME(")
    src.append("    " + ",\n    ".join(params_text) + ") {")
    src.append(f"  const {index_t} fj_first = ({index_t})blockIdx.x * blockDim.x + threadIdx.x;")
    src.append(f"  const {index_t} fj_step = ({index_t})blockDim.x * gridDim.x;")
    start = "0"
    work_items = numel
    if vector > 1:
        w.need("fj_vec")
        nvec = numel // vector
        work_items = max(1, nvec)
        checks = [f"(unsigned long long){pointer(i)} % {vector * DTYPES[op.dtype][2]} == 0"
                  for i, op in enumerate(operands) if not uniform[i]]
        src.append("  const bool fj_aligned = " + "\n      && ".join(checks) + ";")
        src.append("  if (fj_aligned) {")
        src.append(f"    for ({index_t} j = fj_first; j < {nvec}{suffix}; j += fj_step) {{")
        for i, op in enumerate(operands):
            if uniform[i]:
                continue
            vtype = f"fj_vec<{DTYPES[op.dtype][0]}, {vector}>"
            if i < n_out:
                src.append(f"      {vtype} s{i};")
            else:
                src.append(f"      const {vtype} l{i} = reinterpret_cast<const {vtype}*>"
                           f"({pointer(i)})[j];")
        src.append("#pragma unroll")
        src.append(f"      for (int k = 0; k < {vector}; ++k) {{")
        src += body(lambda j: f"in{j}[0]" if uniform[n_out + j] else f"l{n_out + j}.v[k]",
                    lambda j: f"s{j}.v[k]", 8)
        src.append("      }")
        for i, op in enumerate(operands[:n_out]):
            vtype = f"fj_vec<{DTYPES[op.dtype][0]}, {vector}>"
            src.append(f"      reinterpret_cast<{vtype}*>(out{i})[j] = s{i};")
        src.append("    }")
        src.append("  }")
        start = f"(fj_aligned ? {nvec * vector}{suffix} : 0{suffix})"
    first = "fj_first" if start == "0" else f"{start} + fj_first"
    src.append(f"  for ({index_t} i = {first}; i < {numel}{suffix}; i += fj_step) {{")
    used = [d for d in range(len(sizes)) if any(
        strides[i][d] for i in range(len(operands)) if not (linear[i] or uniform[i]))]
    if used:  # coordinates, innermost first, as far out as some operand needs them
        src.append(f"    {index_t} r = i;")
        skip = 1  # sizes of unused dimensions, divided out together
        for d in range(len(sizes) - 1, used[0], -1):
            if d in used:
                if skip > 1:
                    src.append(f"    r /= {skip}{suffix};")
                    skip = 1
                src.append(f"    const {index_t} c{d} = r % {sizes[d]}{suffix}; r /= {sizes[d]}{suffix};")
            else:
                skip *= sizes[d]
        if skip > 1:
            src.append(f"    r /= {skip}{suffix};")
        src.append(f"    const {index_t} c{used[0]} = r;" if used[0] == 0 else
                   f"    const {index_t} c{used[0]} = r % {sizes[used[0]]}{suffix};")
    src += body(lambda j: f"in{j}[{offset(n_out + j)}]",
                lambda j: f"out{j}[{offset(j)}]", 4)
    src.append("  }")
    src.append("}")
    kernel_text = "\n".join(src) + "\n"

    helpers = [name for name in SNIPPETS if name in w.needs]
    names = [n.target.__name__.split(".")[0] for n in members]
    header = (f"// framejit fused kernel: {len(members)} ops ({', '.join(names)}) over "
              f"{_describe(shape, outputs[0].dtype)}, {numel} elements"
              + (f", vectors of {vector}" if vector > 1 else "") + "\n")
    unnamed = header + "".join(SNIPPETS[h] for h in helpers) + kernel_text
    digest = hashlib.sha256(unnamed.encode()).hexdigest()[:12]
    name = f"fj_{names[0]}_{len(members)}ops_{digest}"
    return Kernel(name=name, source=unnamed.replace("KERNEL_NAME", name),
                  body=kernel_text.replace("KERNEL_NAME", name), helpers=helpers, numel=numel,
                  work_items=work_items, outputs=outputs, inputs=inputs, ops=names, vector=vector,
                  notes={"sizes": sizes, "strides": strides, "index": index_t})


def _describe(shape, dtype) -> str:
    return f"{str(dtype).replace('torch.', '')}{list(shape)}"
