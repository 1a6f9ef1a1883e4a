// bench/event-timer.cuh - the median time of a launch, for the one-file bench tools (bench/*.cu):
// CUDA events around each of `runs` launches, the first `warmup` of them not counted.
#pragma once
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cuda_runtime.h>

static inline void bench_check(cudaError_t e, const char *what) {
    if (e == cudaSuccess) return;
    printf("%s: %s\n", what, cudaGetErrorString(e));
    exit(1);
}

template <typename F> static float bench_median_ms(F launch, int runs, int warmup) {
    cudaEvent_t a, b;
    bench_check(cudaEventCreate(&a), "cudaEventCreate");
    bench_check(cudaEventCreate(&b), "cudaEventCreate");
    std::vector<float> t;
    for (int r = 0; r < runs; r++) {
        bench_check(cudaEventRecord(a), "cudaEventRecord");
        launch();
        bench_check(cudaEventRecord(b), "cudaEventRecord");
        bench_check(cudaEventSynchronize(b), "cudaEventSynchronize");
        float ms;
        bench_check(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
        if (r >= warmup) t.push_back(ms);
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}
