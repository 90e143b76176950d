// The "clean" L2 flush of timed calls (src/backend.rs `L2Flush::Clean`): read a buffer larger than L2,
// so that every line a timed call finds in L2 is a clean line of this buffer. The "dirty" flush (a 256 MB
// memset, as triton's do_bench) leaves L2 full of dirty lines instead, and the timed call then pays for
// writing them back: tens of MB of writes inside the timed region, which a call that reads 100 MB notices.

// The one by-value parameter (`FlushArgs` in src/backend.rs, same layout).
struct L2FlushArgs {
    const uint4* p;          // the buffer, 16-byte aligned
    unsigned long long n16;  // its length in 16-byte words
    unsigned* sink;          // written only if the words XOR to 0x9e3779b9
};

// Reads every 16-byte word of the buffer (grid-stride); writes `sink` only if the words XOR to a value a
// zeroed buffer never gives, so that the compiler keeps every load.
extern "C" __global__ void l2_flush_read(const L2FlushArgs a) {
    unsigned acc = 0;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < a.n16; i += stride) {
        const uint4 v = a.p[i];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9e3779b9u) *a.sink = acc;
}
