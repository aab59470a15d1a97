// The members `index` [picked] of several stacks of parameters ([members, ...] each), as
// index_select(0, index) on each, in one launch: a Q pair's ten parameter stacks were otherwise
// ten copies. The blocks are split evenly among (picked member, stack), each of its share
// copying a stride of that member's elements. An index outside [0, members) gives NaN.
#define TDMPC2_GATHER_STACKS 16

struct MemberStacks {
  const float* source[TDMPC2_GATHER_STACKS];
  float* target[TDMPC2_GATHER_STACKS];
  long long member_elements[TDMPC2_GATHER_STACKS];
};

extern "C" __global__ void gather_members(
    MemberStacks stacks, const long long* index, int stack_count, int members,
    int blocks_per_stack) {
  const int share = blockIdx.x % blocks_per_stack;
  const int stack = (blockIdx.x / blocks_per_stack) % stack_count;
  const int pick = blockIdx.x / blocks_per_stack / stack_count;
  const long long n = stacks.member_elements[stack];
  const long long member = index[pick];
  const bool known = member >= 0 && member < members;
  const float* source = stacks.source[stack] + (known ? member : 0) * n;
  float* target = stacks.target[stack] + pick * n;
  const long long stride = (long long)blocks_per_stack * blockDim.x;
  for (long long e = (long long)share * blockDim.x + threadIdx.x; e < n; e += stride) {
    target[e] = known ? source[e] : __int_as_float(0x7fc00000);
  }
}
