// framejit fused kernel: 5 ops (gt, mul, sub, neg, where) over int64[32, 8], 256 elements
extern "C" __global__ void __launch_bounds__(256) fj_gt_5ops_b269f4053444(
    long long* __restrict__ out0,
    const long long* __restrict__ in0,
    const int* __restrict__ in1) {
  const unsigned int fj_first = (unsigned int)blockIdx.x * blockDim.x + threadIdx.x;
  const unsigned int fj_step = (unsigned int)blockDim.x * gridDim.x;
  for (unsigned int i = fj_first; i < 256u; i += fj_step) {
    unsigned int r = i;
    const unsigned int c1 = r % 8u;
    const long long a0 = in0[i];
    const int a1 = in1[c1];
    const bool t0 = (a0 > (long long)(a1));  // gt.Tensor
    const long long t1 = (a0 * 3LL);  // mul.Tensor
    const long long t2 = (t1 - (long long)(a1));  // sub.Tensor
    const long long t3 = (-a0);  // neg.default
    const long long t4 = (t0 ? t2 : t3);  // where.self
    out0[i] = t4;
  }
}

// framejit fused kernel: 3 ops (eq, lt, bitwise_or) over bool[32, 8], 256 elements
extern "C" __global__ void __launch_bounds__(256) fj_eq_3ops_41249b343a31(
    unsigned char* __restrict__ out0,
    const long long* __restrict__ in0,
    const int* __restrict__ in1) {
  const unsigned int fj_first = (unsigned int)blockIdx.x * blockDim.x + threadIdx.x;
  const unsigned int fj_step = (unsigned int)blockDim.x * gridDim.x;
  for (unsigned int i = fj_first; i < 256u; i += fj_step) {
    unsigned int r = i;
    const unsigned int c1 = r % 8u;
    const long long a0 = in0[i];
    const int a1 = in1[c1];
    const bool t0 = (a0 == (long long)(a1));  // eq.Tensor
    const bool t1 = (a0 < 0LL);  // lt.Scalar
    const bool t2 = (bool)((t0 | t1));  // bitwise_or.Tensor
    out0[i] = (unsigned char)(t2);
  }
}
