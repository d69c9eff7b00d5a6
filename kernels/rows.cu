// Continuous batching with the row table passed by value: the indices are kernel parameters, so
// a step changes them with cuGraphExecKernelNodeSetParams instead of copying a table to the
// device (the "params" table mode of rawgraph/serving/slots.py). CAP is the table's capacity
// (ops.ROW_PARAM_CAPS); `rows` <= CAP entries are used.
//
// Name expressions instantiate them: gather_rows_param<CAP>, scatter_rows_param<CAP>.

#include "rawgraph.cuh"

template <int CAP>
struct RowTable {
    int idx[CAP];
};

// Row i < rows of the compact side moves to or from row table.idx[i] of the indexed side:
// gather (SCATTER false) reads src[idx[i], :] into dst[i, :], scatter writes src[i, :] to
// dst[idx[i], :]. Grid-stride over rows * width elements.
template <int CAP, bool SCATTER>
__device__ __forceinline__ void rg_move_rows(const float* src, float* dst, int rows, int width, const RowTable<CAP>& table)
{
    rg_allow_dependents();
    rg_wait_dependencies();
    const long long total = (long long)rows * width;
    for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < total; t += (long long)gridDim.x * blockDim.x) {
        const int i = (int)(t / width), c = (int)(t % width);
        const long long indexed = (long long)table.idx[i] * width + c;
        if (SCATTER)
            dst[indexed] = src[t];
        else
            dst[t] = src[indexed];
    }
}

// dst[i, :] = src[table.idx[i], :] for i < rows
template <int CAP>
__global__ void gather_rows_param(const float* src, float* dst, int rows, int width, const RowTable<CAP> table)
{
    rg_move_rows<CAP, false>(src, dst, rows, width, table);
}

// dst[table.idx[i], :] = src[i, :] for i < rows
template <int CAP>
__global__ void scatter_rows_param(const float* src, float* dst, int rows, int width, const RowTable<CAP> table)
{
    rg_move_rows<CAP, true>(src, dst, rows, width, table);
}
