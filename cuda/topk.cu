// The selector's top-k on a CUDA device: the k largest logits of each row of a
// [rows, n] f32 matrix (rows `row_stride` floats apart), for the DFlash2 case of
// a small k over a wide row (a vocabulary or a slice of one) and a few to a few
// hundred rows. Compiled at run time with NVRTC (src/cuda), launched through
// cudarc on the logits where they are.
//
// The order is the library's (src/topk.rs): larger logits first, equal logits
// by smaller token id, NaN after every number and NaNs by id. Under it the top
// k is one set, so the kernel's output is exactly the CPU reference's, and the
// top k of per-slice lists merges to the top k of the whole row.
//
// One block per row. Each thread keeps the top k of its strided share of the
// row in registers (sorted, insertion), then the block merges the lists
// pairwise in shared memory, halving the lists each round.

#define DFLASH2_TOPK_THREADS 256
#define DFLASH2_TOPK_MAX_K   16

struct dflash2_cand {
    float v;
    int   id; // -1: empty (after every real entry)
};

// a before b in the library's order
__device__ __forceinline__ bool dflash2_better(dflash2_cand a, dflash2_cand b) {
    if (a.id < 0 || b.id < 0) {
        return a.id >= 0 && b.id < 0;
    }
    const bool na = isnan(a.v);
    const bool nb = isnan(b.v);
    if (na != nb) {
        return nb;
    }
    if (!na && a.v != b.v) {
        return a.v > b.v;
    }
    return a.id < b.id;
}

extern "C" __global__ void dflash2_topk_f32(
        const float * __restrict__ logits, long long row_stride, int n, int k, int first,
        int * __restrict__ out_ids, float * __restrict__ out_vals) {
    __shared__ dflash2_cand lists[DFLASH2_TOPK_THREADS * DFLASH2_TOPK_MAX_K];

    const int row = blockIdx.x;
    const int tid = threadIdx.x;
    const float * x = logits + (long long) row * row_stride;

    // this thread's top k, best first
    dflash2_cand mine[DFLASH2_TOPK_MAX_K];
    for (int i = 0; i < DFLASH2_TOPK_MAX_K; ++i) {
        mine[i].v  = 0.0f;
        mine[i].id = -1;
    }
    for (int j = tid; j < n; j += blockDim.x) {
        dflash2_cand c;
        c.v  = x[j];
        c.id = first + j;
        if (!dflash2_better(c, mine[k - 1])) {
            continue;
        }
        int p = k - 1;
        while (p > 0 && dflash2_better(c, mine[p - 1])) {
            mine[p] = mine[p - 1];
            --p;
        }
        mine[p] = c;
    }
    for (int i = 0; i < k; ++i) {
        lists[tid * k + i] = mine[i];
    }
    __syncthreads();

    // pairwise merges: thread t keeps the best k of lists t and t + half
    for (int half = blockDim.x / 2; half > 0; half /= 2) {
        if (tid < half) {
            const dflash2_cand * a = lists + tid * k;
            const dflash2_cand * b = lists + (tid + half) * k;
            int ia = 0;
            int ib = 0;
            for (int i = 0; i < k; ++i) {
                if (ib >= k || (ia < k && !dflash2_better(b[ib], a[ia]))) {
                    mine[i] = a[ia++];
                } else {
                    mine[i] = b[ib++];
                }
            }
        }
        __syncthreads();
        if (tid < half) {
            for (int i = 0; i < k; ++i) {
                lists[tid * k + i] = mine[i];
            }
        }
        __syncthreads();
    }

    if (tid < k) {
        const dflash2_cand c = lists[tid];
        out_ids[row * k + tid]  = c.id;
        out_vals[row * k + tid] = c.id >= 0 ? c.v : __int_as_float(0xff800000); // -inf where the row ran out
    }
}
