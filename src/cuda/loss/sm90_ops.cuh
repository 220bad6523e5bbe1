// PTX wrappers for Hopper (sm_90a) kernels: shared-memory addresses and wgmma descriptors for 128-byte
// swizzled K-major tiles, the m64n256k16 bf16 wgmma, mbarrier waits and arrivals, TMA 2-D loads. Device code
// only; used by softmax_chunk.cu. Calling any of
// them from code built for another target is a ptxas error, so they belong in sm_90a-only paths.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace retort::cuda::sm90 {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return uint32_t(__cvta_generic_to_shared(p));
}

// A K-major operand tile in shared memory, 128-byte swizzled (as TMA wrote it), rows 128 bytes apart.
__device__ __forceinline__ uint64_t smem_desc(const void* p) {
  uint64_t d = uint64_t((smem_u32(p) & 0x3FFFF) >> 4);  // start address
  d |= uint64_t(1) << 16;                               // leading byte offset: unused here
  d |= uint64_t(1024 >> 4) << 32;                       // stride byte offset: 8 rows of 128 bytes
  d |= uint64_t(1) << 62;                               // 128-byte swizzle
  return d;
}

// D (+)= A·Bᵀ over one 16-wide K step, D [64, 256] f32 in the wgmma fragment order (D zeroed first when
// acc is 0).
__device__ __forceinline__ void mma_n256(float (&d)[128], uint64_t da, uint64_t db, int acc) {
#define RT_R8(i)                                                                              \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
      "+f"(d[i + 6]), "+f"(d[i + 7])
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,"
      "%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,"
      "%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,"
      "%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,"
      "%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,"
      "%122,%123,%124,%125,%126,%127}, %128, %129, p, 1, 1, 0, 0;\n}"
      : RT_R8(0), RT_R8(8), RT_R8(16), RT_R8(24), RT_R8(32), RT_R8(40), RT_R8(48), RT_R8(56), RT_R8(64),
        RT_R8(72), RT_R8(80), RT_R8(88), RT_R8(96), RT_R8(104), RT_R8(112), RT_R8(120)
      : "l"(da), "l"(db), "r"(acc));
#undef RT_R8
}

// Waits for the phase of parity `parity` of mbarrier b to complete.
__device__ __forceinline__ void bar_wait(uint64_t* b, uint32_t parity) {
  asm volatile(
      "{\n .reg .pred p;\n WAIT_%=:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra "
      "WAIT_%=;\n}" ::"r"(smem_u32(b)),
      "r"(parity)
      : "memory");
}

__device__ __forceinline__ void bar_arrive(uint64_t* b) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(b)) : "memory");
}

// One TMA load of the box at (c0 inner, c1 outer) of map into dst, completing on mbarrier bar.
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, int c0, int c1,
                                            uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
      "[%4];" ::"r"(smem_u32(dst)),
      "l"(map), "r"(c0), "r"(c1), "r"(smem_u32(bar))
      : "memory");
}

}  // namespace retort::cuda::sm90
